"""RC control execution on the simulated DU: decode, validate against this node's tables, apply.

Returns the RIC control outcome bytes on success or the E2AP Cause of the RICcontrolFailure. Validation happens before any
change, so a refused control changes nothing.
- Style 2 action 6 (slice-level PRB quota): parameters by the node's ID table (srsRAN/OSC or OAI);
  an ID outside that table, a malformed tree or a ratio outside 0..100 / min > max is
  control-message-invalid; a slice the node does not serve is control-failed-to-execute. A quota
  applies to every cell of the node (Style 2 carries no cell; the header's UE ID names no cell).
- Weaver style 1000 action 1 (site SM envelope): 0 < envelope <= GPU SMs, or no value to clear it.
"""
from __future__ import annotations

import logging

from e2sm import e2ap
from e2sm.errors import E2DecodeError

from . import functions
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
        known = {getattr(ids, f) for f in rc.PRB_QUOTA_NAMES}
        unknown = sorted(param_ids(msg.params) - known)
        if unknown:  # srsRAN rejects a control naming any ID outside its table
            return _invalid(f"parameter IDs {unknown} are not in the {node.rc_table} table", node)
        try:
            quotas = rc.parse_prb_quota_control(msg, ids)
        except (E2DecodeError, ValueError, KeyError) as exc:
            return _invalid(f"PRB quota control does not fit the {node.rc_table} table: {exc}", node)
        served = {(s.sst, s.sd) for s in node.slices}
        for q in quotas:
            if not (0 <= q.min_ratio <= 100 and 0 <= q.max_ratio <= 100 and 0 <= q.dedicated_ratio <= 100) \
                    or q.min_ratio > q.max_ratio or q.dedicated_ratio > q.max_ratio:
                return _invalid(f"ratios min {q.min_ratio} max {q.max_ratio} ded {q.dedicated_ratio}", node)
            if q.plmn != node.plmn:
                return _invalid(f"PLMN {q.plmn} is not this node's {node.plmn}", node)
            if (q.sst, q.sd) not in served:
                log.info("%s: quota for unknown slice sst %d sd %s", node.inventory_name, q.sst, q.sd)
                return e2ap.Cause("ricRequest", "control-failed-to-execute")
        if not quotas:
            return _invalid("no RRM policy in the message", node)
        try:
            for q in quotas:
                for cell in range(node.n_cells):
                    ran.set_slice_quota(node.site, cell, q.sst, q.sd, q.min_ratio, q.max_ratio, q.dedicated_ratio)
                stats.quotas_applied.append(q)
        except ValueError as exc:  # the MAC refuses e.g. min ratios summing over 100 %
            return _invalid(f"the MAC refused the quota: {exc}", node)
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
