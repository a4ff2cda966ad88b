"""The RAN functions a simulated DU advertises in E2 setup (real E2SM definitions, APER-encoded).

- KPM (v3.00 or v2.03, chosen per node): event trigger style 1 "Periodic Report", report style 1
  "E2 Node Measurement" (action format 1, header 1, message 1) with the measurements in
  `measure.measurements_for(config.kpm_profile)`: by default every one, including the vendor GPU
  measurements and the `.SNSSAI` per-slice counters.
- RC v1.03: control style 2 "Radio Resource Allocation Control" with action 6 "Slice-level PRB quota"
  and its parameters named by the node's ID table (srsRAN/OSC or OAI/FlexRIC), plus the Weaver vendor
  control style (1000, action 1 "Site SM envelope"), built by `e2sm.rc`.
"""
from __future__ import annotations

from e2sm import e2ap, kpm

from .config import NodeConfig
from .measure import measurements_for

KPM_REVISION = 1
RC_REVISION = 1


def kpm_version(config: NodeConfig) -> kpm.KpmVersion:
    return kpm.KpmVersion.V3_00 if config.kpm_version == "v3.00" else kpm.KpmVersion.V2_03


def kpm_oid(config: NodeConfig) -> str:
    return kpm.KPM_OID_V3 if config.kpm_version == "v3.00" else kpm.KPM_OID_V2


def kpm_description(config: NodeConfig) -> kpm.KpmRanFunctionDescription:
    return kpm.KpmRanFunctionDescription(
        oid=kpm_oid(config), short_name="ORAN-E2SM-KPM", description="KPM Monitor",
        event_trigger_styles=(kpm.KpmEventTriggerStyle(1, "Periodic Report", 1),),
        report_styles=(kpm.KpmReportStyle(1, "E2 Node Measurement", 1,
                                          tuple(kpm.ReportableMeas(n) for n in measurements_for(config.kpm_profile))),))


def rc_ids(config: NodeConfig):
    from e2sm import rc

    return {"srsran": rc.SRSRAN_IDS, "oai": rc.OAI_IDS, "oai-gnb": rc.OAI_GNB_IDS}[config.rc_table]


def rc_definition_bytes(config: NodeConfig) -> bytes:
    from e2sm import rc

    return rc.encode_ran_function_definition(rc.node_ran_function_definition(rc_ids(config), weaver=True))


def ran_functions(config: NodeConfig) -> tuple[e2ap.RanFunctionItem, ...]:
    """The RANfunctions-Added list of this node's E2setupRequest."""
    kpm_def = kpm.encode_ran_function_description(kpm_description(config), kpm_version(config))
    return (e2ap.RanFunctionItem(config.kpm_function_id, kpm_def, KPM_REVISION, kpm_oid(config)),
            e2ap.RanFunctionItem(config.rc_function_id, rc_definition_bytes(config), RC_REVISION, "1.3.6.1.4.1.53148.1.1.2.3"))
