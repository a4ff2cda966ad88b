"""RC controls: which mode a node supports, and the E2AP bytes that carry a decision to it.

Mode per node, from its RC RAN function definition (architecture.md, Actuate):
- `envelope` when it advertises the Weaver vendor action (style 1000, action 1 "Site SM envelope");
- `quota` when it has an RC function at all (standard style 2 action 6, parameter IDs resolved by name
  from the definition, else the configured fallback table);
- `none` otherwise (monitor-only node: leases still follow the estimate, nothing is shaped).
A config `actuation.mode` other than `auto` forces the mode where the node supports it.

Where the reply goes (read from the OSC sources, not assumed): e2term sets the RMR sub_id of a
RICcontrolAcknowledge/Failure to the request's RIC *instance* ID (ric-plt-e2 RIC-E2-TERMINATION/
sctpThread.cpp; the requestor ID is not used), and rtmgr routes 12041/12042 by sub_id: to the xApp that
owns the subscription with that sub_id (pkg/rpe/rpe.go generateSubscriptionRoutes), and for any other
sub_id along one `-1` entry per xApp, of which RMR keeps the last it reads (librmr rt_generic_static.c
uta_add_rte) -- some other xApp, on a RIC with several. So a control's RIC request ID is
(CONTROL_REQUESTOR, the sub_id of one of this xApp's live subscriptions), chosen by the loop
(`xapp.loop.control_instance`), which also matches replies to controls by requestor, node and instance.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from e2sm import E2DecodeError
from e2sm.e2ap import (
    RicControlAcknowledge,
    RicControlFailure,
    RicControlRequest,
    RicRequestId,
    decode_e2ap,
    encode_e2ap,
)
from e2sm.rc import (
    PRB_QUOTA_ACTION,
    PRB_QUOTA_STYLE,
    WEAVER_ENVELOPE_ACTION,
    WEAVER_STYLE,
    GnbDuUeId,
    PrbQuotaIds,
    RcControlHeader,
    SliceQuota,
    build_envelope_control,
    build_prb_quota_control,
    decode_ran_function_definition,
    encode_control_header,
    encode_control_message,
    resolve_prb_quota_ids,
)
from xapp.config import ActuationConfig
from xapp.rnib import E2Node

CONTROL_REQUESTOR = 1000     # our RIC requestor ID for controls (SubMgr uses 123 for subscriptions)


@dataclass(frozen=True, kw_only=True)
class NodeControl:
    meid: str
    rc_function_id: int | None
    mode: str                        # envelope | quota | none
    ids: PrbQuotaIds | None = None
    note: str = ""


def node_control(node: E2Node, act: ActuationConfig) -> NodeControl:
    rc = node.rc
    if rc is None or act.mode == "none":
        return NodeControl(meid=node.meid, rc_function_id=None, mode="none",
                           note="no RC function" if rc is None else "actuation disabled")
    definition, note = None, ""
    if rc.definition:
        try:
            definition = decode_ran_function_definition(rc.definition)
        except E2DecodeError as exc:
            note = f"RC definition undecodable ({exc}); fallback IDs"
    if definition is not None:
        has_envelope = definition.control_action(WEAVER_STYLE, WEAVER_ENVELOPE_ACTION) is not None
    else:
        has_envelope = node.envelope        # no definition to read (static list): trust the config
    has_quota = definition is None or definition.control_action(PRB_QUOTA_STYLE, PRB_QUOTA_ACTION) is not None
    try:
        ids = resolve_prb_quota_ids(definition, act.rc_ids_fallback)
    except ValueError as exc:
        ids, has_quota, note = None, False, str(exc)
    if act.mode in ("auto", "envelope") and has_envelope:
        mode = "envelope"
    elif act.mode in ("auto", "quota") and has_quota and ids is not None:
        mode = "quota"
    else:
        mode, note = "none", note or f"node cannot do actuation mode {act.mode!r}"
    return NodeControl(meid=node.meid, rc_function_id=rc.ran_function_id, mode=mode, ids=ids, note=note)


# The E2SM parts depend only on the values, and envelopes move in partition steps: cache them, so a
# control costs one E2AP encode (the request ID differs every time).
@functools.lru_cache(maxsize=4096)
def _envelope_e2sm(envelope_sms: int, be_delay_budget_ms: int, ue_id: int) -> tuple[bytes, bytes]:
    hdr = RcControlHeader(WEAVER_STYLE, WEAVER_ENVELOPE_ACTION, GnbDuUeId(ue_id))
    return encode_control_header(hdr), encode_control_message(build_envelope_control(envelope_sms, be_delay_budget_ms))


@functools.lru_cache(maxsize=4096)
def _quota_e2sm(quotas: tuple[SliceQuota, ...], ids: PrbQuotaIds, ue_id: int) -> tuple[bytes, bytes]:
    hdr = RcControlHeader(PRB_QUOTA_STYLE, PRB_QUOTA_ACTION, GnbDuUeId(ue_id))
    return encode_control_header(hdr), encode_control_message(build_prb_quota_control(quotas, ids))


def envelope_request(nc: NodeControl, instance: int, envelope_sms: int, be_delay_budget_ms: int,
                     ue_id: int = 0) -> bytes:
    """`instance`: the RIC instance ID, the sub_id the reply is routed by (see the module doc)."""
    hdr, msg = _envelope_e2sm(envelope_sms, be_delay_budget_ms, ue_id)
    return encode_e2ap(RicControlRequest(RicRequestId(CONTROL_REQUESTOR, instance & 0xFFFF), nc.rc_function_id,
                                         hdr, msg, ack_request=True))


def quota_request(nc: NodeControl, instance: int, quotas: tuple[SliceQuota, ...], ue_id: int = 0) -> bytes:
    hdr, msg = _quota_e2sm(tuple(quotas), nc.ids, ue_id)
    return encode_e2ap(RicControlRequest(RicRequestId(CONTROL_REQUESTOR, instance & 0xFFFF), nc.rc_function_id,
                                         hdr, msg, ack_request=True))


@dataclass(frozen=True, kw_only=True)
class ControlResult:
    instance: int                   # RIC instance ID the node echoed (shared by the controls to a node)
    ok: bool
    cause: str = ""
    requestor: int = CONTROL_REQUESTOR   # RIC requestor ID the node echoed


def parse_control_reply(payload: bytes) -> ControlResult:
    """12041/12042 payload -> ControlResult; E2DecodeError or ValueError for anything else."""
    msg = decode_e2ap(payload)
    if isinstance(msg, RicControlAcknowledge):
        return ControlResult(instance=msg.request_id.instance, ok=True, requestor=msg.request_id.requestor)
    if isinstance(msg, RicControlFailure):
        c = msg.cause
        return ControlResult(instance=msg.request_id.instance, ok=False, cause=f"{c.group}/{c.value}" if c else "",
                             requestor=msg.request_id.requestor)
    raise ValueError(f"expected RICcontrolAcknowledge/Failure, got {type(msg).__name__}")
