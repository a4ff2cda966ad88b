"""The RAN functions a simulated DU advertises in E2 setup (real E2SM definitions, APER-encoded).

- KPM (v3.00, v2.03 or v4.00, chosen per node): event trigger style 1 "Periodic Report", report style 1
  "E2 Node Measurement" (action format 1, header 1, message 1) with the measurements in
  `measure.measurements_for(config.kpm_profile)`: by default every one, including the vendor GPU
  measurements and the `.SNSSAI` per-slice counters; and the UE-level styles over the node's UE population
  (`measure.UE_LEVEL`): 2 "E2 Node Measurement for a single UE" (action format 2, message 1), 3
  "Condition-based, UE-level E2 Node Measurement" (3, message 2), 4 "Common Condition-based, UE-level
  Measurement" (4, message 3), 5 "E2 Node Measurement for multiple UEs" (5, message 3), the style names of
  E2SM-KPM section 7.4.1.
- RC v1.03: control style 2 "Radio Resource Allocation Control" with action 6 "Slice-level PRB quota"
  and its parameters named by the node's ID table (srsRAN/OSC or OAI/FlexRIC), plus the Weaver vendor
  control style (1000, action 1 "Site SM envelope"), built by `e2sm.rc`.
"""
from __future__ import annotations

from e2sm import e2ap, kpm

from .config import NodeConfig
from .measure import UE_LEVEL, measurements_for

KPM_REVISION = 1
RC_REVISION = 1


_VERSIONS = {"v2.03": (kpm.KpmVersion.V2_03, kpm.KPM_OID_V2), "v3.00": (kpm.KpmVersion.V3_00, kpm.KPM_OID_V3),
             "v4.00": (kpm.KpmVersion.V4_00, kpm.KPM_OID_V4)}
# style -> (name, action definition format, indication message format)
UE_STYLES = {2: ("E2 Node Measurement for a single UE", 2, 1),
             3: ("Condition-based, UE-level E2 Node Measurement", 3, 2),
             4: ("Common Condition-based, UE-level Measurement", 4, 3),
             5: ("E2 Node Measurement for multiple UEs", 5, 3)}


def kpm_version(config: NodeConfig) -> kpm.KpmVersion:
    return _VERSIONS[config.kpm_version][0]


def kpm_oid(config: NodeConfig) -> str:
    return _VERSIONS[config.kpm_version][1]


def ue_measurements(config: NodeConfig) -> tuple[str, ...]:
    """The UE-level measurements (styles 2-5) this node's profile offers."""
    offered = measurements_for(config.kpm_profile)
    return tuple(n for n in offered if n.removesuffix(".SNSSAI") in UE_LEVEL)


def kpm_description(config: NodeConfig) -> kpm.KpmRanFunctionDescription:
    return kpm.KpmRanFunctionDescription(
        oid=kpm_oid(config), short_name="ORAN-E2SM-KPM", description="KPM Monitor",
        event_trigger_styles=(kpm.KpmEventTriggerStyle(1, "Periodic Report", 1),),
        report_styles=(kpm.KpmReportStyle(1, "E2 Node Measurement", 1,
                                          tuple(kpm.ReportableMeas(n) for n in measurements_for(config.kpm_profile))),
                       *(kpm.KpmReportStyle(style, name, fmt, tuple(kpm.ReportableMeas(n) for n in ue_measurements(config)),
                                            message_format=msg) for style, (name, fmt, msg) in UE_STYLES.items())))


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
