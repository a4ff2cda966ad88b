"""RC control execution on the simulated DU: decode, validate as the emulated DU does, apply.

Returns the RIC control outcome bytes on success or the E2AP Cause of the RICcontrolFailure. Validation happens before any
change, so a refused control changes nothing.

Style 2 action 6 (slice-level PRB quota). Each ID table validates as the DU it emulates (`rules`):
- `srsran`: srsRAN's DU, `e2sm_rc_control_action_2_6_du_executor` (as in ocudu/ocudu c4ff58c5, the srsRAN
  Project's continuation, 2026): every top-level parameter ID is in its table (else control-message-invalid);
  the header names an existing UE by gNB-DU-UEID; the tree is walked depth-first, 2 opening an RRM policy
  and 6 a member of it; every policy needs a member and all three ratios (min 11, max 12, dedicated 13);
  otherwise misc/unspecified, srsRAN's cause. Nothing relates the ratios to each other (a dedicated ratio
  above the max is accepted, as the oran-sc-ric example sends 10/30/100).
- `oai-gnb`: OAI's gNB, `add_mod_rc_slice` in `openair2/E2AP/RAN_FUNCTION/O-RAN/rc_ctrl_service_style_2.c`:
  each RRM Policy Ratio List item has exactly four parameters in order (RRM Policy 3, Min 10, Max 11,
  Dedicated 12), the policy one member list (4) with one member of exactly PLMN (6) and S-NSSAI (7) {SST 8,
  SD 9}, all ElementFalse, PLMN/SST/SD as ASCII digit octets, min and dedicated integers (the max is
  never read: applied when min <= max <= 100, else 100; nor the PLMN checked). OAI asserts (and
  aborts) on any deviation; the emulated node answers control-message-invalid instead.
- `oai`: OAI/FlexRIC numbering in the nested layout of the shared vector, which no public DU parses:
  Weaver's structural reading (`e2sm.rc.parse_prb_quota_control`), with no ratio relation either.
What an accepted control changes is the DU's: on srsRAN the named UE's grant-size limits only
(`dialects.ue_grant_limit`; the model caps that UE's share of its slice, `RanModel.set_ue_grant_limit`); on OAI's
gNB the reservations of its NVS downlink slicer (`dialects.nvs_reserved`, `RanModel.set_nvs_reserved`); on the
standard text's dialect the slice quotas, as below.
The slice quota goes to the RAN model (all three ratios, on every cell: Style 2 carries no cell), which
refuses what it cannot honour (ratios outside 0..100, min above max, min or dedicated summing over 100 %:
control-message-invalid). A slice the site does not serve is control-failed-to-execute: the model's slices
are its configuration (`weaver sim --slices`); OAI would add such a slice, srsRAN leaves it unscheduled.

Weaver style 1000 action 1 (site SM envelope): 0 < envelope <= GPU SMs, or no value to clear it.
"""
from __future__ import annotations

import logging

from e2sm import e2ap
from e2sm.errors import E2DecodeError

from . import dialects, functions, rules
from .config import NodeConfig

log = logging.getLogger("weaver.e2node.control")


def _invalid(why: str, node: NodeConfig) -> e2ap.Cause:
    log.info("%s: control refused: %s", node.inventory_name, why)
    return e2ap.Cause("ricRequest", "control-message-invalid")


def param_ids(params) -> set[int]:
    """Every RAN parameter ID in a control message's tree (list items carry no ID of their own)."""
    from e2sm import rc

    out: set[int] = set()
    for p in params:
        out.add(p.param_id)
        if isinstance(p, rc.RanParamStructure):
            out |= param_ids(p.children)
        elif isinstance(p, rc.RanParamList):
            for item in p.items:
                out |= param_ids(item)
    return out


def execute(node: NodeConfig, ran, header: bytes, message: bytes, stats) -> e2ap.Cause | bytes:
    """Apply one control. Returns the Cause of a refusal, or the RIC control outcome (E2SM-RC outcome
    format 1 bytes) on success: srsRAN's (ratio list, 100), (min, m), (max, M) for a quota (per slice, in
    message order), (SM Envelope, E) for the Weaver envelope."""
    from e2sm import rc

    try:
        hdr = rc.decode_control_header(header)
        msg = rc.decode_control_message(message)
    except (E2DecodeError, ValueError) as exc:
        return _invalid(f"undecodable RC header/message: {exc}", node)
    if (hdr.style, hdr.action_id) == (2, 6):
        ids = functions.rc_ids(node)
        quotas = rules.quotas(node, hdr, msg, ids)
        if isinstance(quotas, e2ap.Cause):
            return quotas
        served = {(s.sst, s.sd) for s in node.slices}
        for q in quotas:
            if q.plmn != node.plmn and node.rc_table != "oai-gnb":  # OAI only matches UEs by PLMN, later
                return _invalid(f"PLMN {q.plmn} is not this node's {node.plmn}", node)
            if (q.sst, q.sd) not in served and not dialects.adds_unserved_slices(node):
                log.info("%s: quota for unknown slice sst %d sd %s", node.inventory_name, q.sst, q.sd)
                return e2ap.Cause("ricRequest", "control-failed-to-execute")
        limit = dialects.ue_grant_limit(node, hdr.ue_id, quotas)
        if limit is not None:       # srsRAN: the named UE's grant sizes, nothing else in the cell
            ue, fraction = limit
            prbs = getattr(ran, "prbs", None)
            if prbs is not None:    # "ratio x the maximum PRBs of cell 0", as a fraction of the UE's own cell
                fraction = min(1.0, fraction * float(prbs[node.site, 0]) / float(prbs[node.site, ue.cell]))
            if hasattr(ran, "set_ue_grant_limit"):
                ran.set_ue_grant_limit(node.site, ue.cell, ue.slice, ue.share, fraction, tag=ue.f1ap_id)
            stats.ue_limits_applied.append((ue.f1ap_id, fraction))
            return rc.encode_control_outcome(rc.RcControlOutcome(((ids.ratio_list, 100),)))
        nvs = dialects.nvs_reserved(node, quotas)
        if nvs is not None and hasattr(ran, "set_nvs_reserved"):   # OAI: its NVS downlink slicer
            # OAI's addmod: what this control names replaces what it had, the rest stays
            current = [None if v != v else float(v) for v in ran.nvs_reserved[node.site]]   # NaN: not configured
            unserved = dict(ran.nvs_unserved[node.site])  # (SST, SD) -> share: slices OAI added with no UE here
            for key, share in nvs.items():
                if isinstance(key, tuple):
                    unserved[key] = share
                else:
                    current[key] = share
            try:
                ran.set_nvs_reserved(node.site, tuple(current), unserved)
            except ValueError as exc:
                return _invalid(f"the NVS slicer refused it: {exc}", node)
            stats.nvs_applied.append(dict(nvs))
            return rc.encode_control_outcome(rc.RcControlOutcome(((ids.ratio_list, 100),)))
        # a later slice the MAC refuses must not leave the earlier ones applied: put the site's quotas back
        saved = ran.quota[node.site].copy() if hasattr(ran, "quota") else None
        try:
            for q in quotas:
                for cell in range(node.n_cells):
                    ran.set_slice_quota(node.site, cell, q.sst, q.sd, q.min_ratio, q.max_ratio, q.dedicated_ratio)
        except ValueError as exc:  # the MAC refuses e.g. min ratios summing over 100 %
            if saved is not None:
                ran.quota[node.site] = saved
            return _invalid(f"the MAC refused the quota: {exc}", node)
        stats.quotas_applied.extend(quotas)
        outcome: tuple[tuple[int, int], ...] = ((ids.ratio_list, 100),)
        for q in quotas:
            outcome += ((ids.min_ratio, q.min_ratio), (ids.max_ratio, q.max_ratio))
        return rc.encode_control_outcome(rc.RcControlOutcome(outcome))
    if (hdr.style, hdr.action_id) == (rc.WEAVER_STYLE, 1):
        try:
            envelope = rc.parse_envelope_control(msg)
        except (E2DecodeError, ValueError, KeyError) as exc:
            return _invalid(f"envelope control: {exc}", node)
        sms = envelope.envelope_sms
        if sms is not None and not 0 < sms <= node.gpu_sms:
            return _invalid(f"envelope {sms} SMs outside 1..{node.gpu_sms}", node)
        try:
            ran.set_envelope(node.site, sms, envelope.be_delay_budget_ms)
        except ValueError as exc:
            return _invalid(f"the MAC refused the envelope: {exc}", node)
        return rc.encode_control_outcome(rc.RcControlOutcome(
            ((rc.WEAVER_PARAM_ENVELOPE, sms if sms is not None else 0),)))
    return e2ap.Cause("ricRequest", "action-not-supported")
