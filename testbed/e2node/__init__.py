"""The simulated E2 node (gNB-DU) per site, named as OSC's E2T names it (`testbed.ric.names`).

- `config`: `NodeConfig` (KPM version, RC parameter-ID table, IDs) and `node_configs(scenario, ...)`.
- `functions`: the KPM and RC RAN function definitions it advertises in E2 setup.
- `measure`: what it measures each period (from the RAN model's `PeriodReport`) and the KPM names for it.
- `control`: RC control execution (slice PRB quota, Weaver SM envelope) with E2AP causes on refusal;
  `rules`: how each emulated DU (srsRAN, OAI) reads a PRB quota control.
- `uestyles`: KPM report styles 2-5 over the node's UE population (`testbed.model.ues`).
- `node`: the sans-IO E2AP state machine (`E2Node`): bytes in, bytes out.
- `shell`: the asyncio RMR shell around it (`NodeShell`).
"""
from .config import KPM_VERSIONS, RC_TABLES, NodeConfig, NodeConfigError, SliceId, node_configs
from .measure import MEASUREMENTS, SiteMeasurements, from_period_report, measure
from .node import E2Node, Outgoing
from .shell import NodeShell

__all__ = [
    "KPM_VERSIONS", "MEASUREMENTS", "RC_TABLES", "E2Node", "NodeConfig", "NodeConfigError", "NodeShell", "Outgoing",
    "SiteMeasurements", "SliceId", "from_period_report", "measure", "node_configs",
]
