"""Where the emulated DUs answer differently, by the DU a node stands for (`NodeConfig.du`: its `dialect`, by
default the DU of its `rc_table`: `srsran`, `oai-gnb`, or `o-ran` for `oai`; the validation of slice-level PRB
quota controls is in `rules`, by ID table, the rest here). Each rule names the
function of the DU's source it follows; `docs/emulator.md` has the table.

srsRAN's DU (srsRAN_Project 4bf15439, 2026-02-16; ocudu 9b0cfa60, 2026-07-22, the same code):
- control answers (`e2_ric_control_procedure::operator()`, lib/e2/procedures): an ACK or a failure only when
  the request carries RICcontrolAckRequest "ack"; with it absent, nothing;
- the ACK has no RIC Control Outcome (`e2sm_rc_control_action_2_6_du_executor::convert_to_e2sm_response` sets
  `ric_ctrl_outcome_present = false`, `send_e2_ric_control_acknowledge` packs none);
- KPM indication header format 1 with colletStartTime only (`e2sm_kpm_report_service_base`: vendorName,
  senderName, senderType, fileFormatversion all `_present = false`);
- what a slice-quota control changes: the named UE's grant-size limits only (`ue_grant_limit`);
- KPM style 3 (`e2sm_kpm_report_service_style3::collect_measurements`, with
  `e2sm_kpm_du_meas_provider_impl::get_ues_matching_test_conditions`, "TODO: add test condition checking, now
  return all UEs"): the test conditions are not checked, every UE of the node matches, one value per UE in a
  single measData item, for the first condition item only (`break` after it).
OAI's gNB with its slice-control branch (openairinterface5g `rebased-5g-nvs-rc-rf` d6307817, FlexRIC
beabdd07): the ACK carries a RIC Control Outcome format 1 with no RAN parameter (`write_ctrl_rc_sm` returns a
zeroed outcome, `rc_enc_ctrl_out` encodes it); a slice-quota control configures its NVS downlink slicer
(`nvs_reserved`; the NVS code as in nr_slicing.c of openairinterface5g forks, e.g. FCCLab 0ba3514f).
The others (`oai`: the shared vector's FlexRIC numbering, which no public DU parses) answer as the standard
text allows: the outcome Weaver's node reports, all four optional header fields, style 3 by condition.
"""
from __future__ import annotations

from e2sm import kpm

from .config import NodeConfig


def answers_control(node: NodeConfig, ack_request: bool | None) -> bool:
    """Whether the node sends an ACK or a failure for a control with this RICcontrolAckRequest."""
    if node.du == "srsran":
        return ack_request is True
    return ack_request is not False


def ack_outcome(node: NodeConfig, outcome: bytes) -> bytes | None:
    """The RICcontrolOutcome of the ACK for a control whose own outcome is `outcome`."""
    from e2sm import rc

    if node.du == "srsran":
        return None
    if node.du == "oai-gnb":
        return rc.encode_control_outcome(rc.RcControlOutcome(()))
    return outcome


def indication_header(node: NodeConfig, stamp: int) -> kpm.KpmIndicationHeader:
    if node.du == "srsran":
        return kpm.KpmIndicationHeader(collect_start_time=stamp)
    # senderName is a PrintableString: no '_' allowed, so not the inventory name itself.
    return kpm.KpmIndicationHeader(collect_start_time=stamp, file_format_version="1.0",
                                   sender_name=f"gNB-DU {node.node_gnb_id}", sender_type="DU",
                                   vendor_name=node.vendor[:32])


def style3_ignores_conditions(node: NodeConfig) -> bool:
    return node.du == "srsran"


def ue_grant_limit(node: NodeConfig, ue_id, quotas) -> tuple[object, float] | None:
    """What an accepted slice-quota control changes on a DU that applies it to one UE: (the UE, its largest grant
    as a fraction of its cell's PRBs), or None where the DU applies it to the slice (the standard text).

    srsRAN (`e2sm_rc_control_action_2_6_du_executor::convert_to_du_config_request`, then
    `du_ue_ric_configuration_procedure::handle_mac_config`): the request is for the UE the header names; the
    first policy's min and max ratios become that UE's PDSCH and PUSCH grant-size limits, in PRBs of the
    ratio x the maximum PRBs of cell 0; the dedicated ratio is not used, the slice the policy names is not
    checked against the UE's bearers, and nothing else in the cell changes. The emulated MAC carries the max (a
    min grant size has no effect on a fluid schedule)."""
    if node.du != "srsran" or not quotas:
        return None
    ue = node.ues.get(ue_id.f1ap_id)
    return (ue, quotas[0].max_ratio / 100.0) if ue is not None else None


def nvs_reserved(node: NodeConfig, quotas) -> dict | None:
    """What an accepted slice-quota control changes on OAI's slice-control gNB: {slice index, or the (SST, SD)
    of a slice the node serves no UE on: reserved share} of its NVS capacity slicer, or None on other DUs.

    OAI (`add_mod_rc_slice` in rc_ctrl_service_style_2.c, `addmod_nvs_nr_slice_dl` and `nvs_nr_dl` in
    nr_slicing.c): each policy adds or modifies a downlink NVS slice of type NVS_RES with `pct_reserved` = the
    dedicated ratio (the min is logged, the max never read); UEs join a slice by S-NSSAI; every slot goes whole
    to the slice with the largest pct_reserved / (moving average of its share of RBs), used or not, beside a
    default slice reserving 5 % (`nvs_nr_dl_init`) that keeps the UEs of no configured slice; the uplink is
    not sliced. Admission (`_nvs_nr_admission_control`): the reservations, the default's included, at most 1.0."""
    if node.du != "oai-gnb":
        return None
    index = {(s.sst, s.sd): i for i, s in enumerate(node.slices)}
    return {index.get((q.sst, q.sd), (q.sst, q.sd)): q.dedicated_ratio / 100.0 for q in quotas}


def adds_unserved_slices(node: NodeConfig) -> bool:
    """OAI adds a slice a control names even if no UE is on it (`addmod_nvs_nr_slice_dl`); srsRAN and the
    standard text's node answer control-failed-to-execute (testbed.e2node.control)."""
    return node.du == "oai-gnb"
