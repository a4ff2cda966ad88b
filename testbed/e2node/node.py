"""The E2 node (gNB-DU) as a sans-IO state machine: E2AP bytes in, E2AP bytes out.

`E2Node.setup_request()` starts E2 setup; `receive(mtype, payload)` handles what the RIC sends and
returns the replies; `on_period(measurements, now_ntp)` returns the KPM indications due: report style 1
here, styles 2-5 (UE level) by `uestyles`, each action with the style its definition names. The RAN it
controls is any object with the RAN model's control calls (`set_slice_quota`, `set_envelope`).
Sockets, clocks and the model's stepping live in `testbed.e2node.shell` and `testbed.sim`.

Bad input never raises out of `receive`: an undecodable PDU gets an ErrorIndication (protocol
transfer-syntax-error), a subscription the node cannot serve a RICsubscriptionFailure with a cause,
an invalid control a RICcontrolFailure (the cause the emulated DU gives, `control` / `rules`, or
action-not-supported / ran-function-id-invalid).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from e2sm import e2ap, kpm
from e2sm.errors import E2DecodeError, E2EncodeError

from . import dialects, functions, uestyles
from .config import NodeConfig
from .measure import SiteMeasurements, measure, measurements_for

log = logging.getLogger("weaver.e2node")

# RMR message types on the node side (e2-facts §1).
E2_SETUP_REQ, E2_SETUP_RESP, E2_SETUP_FAILURE = 12001, 12002, 12003
SUB_REQ, SUB_RESP, SUB_FAILURE = 12010, 12011, 12012
SUB_DEL_REQ, SUB_DEL_RESP, SUB_DEL_FAILURE = 12020, 12021, 12022
CONTROL_REQ, CONTROL_ACK, CONTROL_FAILURE = 12040, 12041, 12042
INDICATION, ERROR_INDICATION = 12050, 10030


class RanControls(Protocol):
    def set_slice_quota(self, site: int, cell: int, sst: int, sd: int | None, min_ratio: float,
                        max_ratio: float, dedicated_ratio: float) -> None: ...

    def set_envelope(self, site: int, sms: int | None) -> None: ...


@dataclass(frozen=True)
class Outgoing:
    """A message for the RIC: RMR mtype plus the APER E2AP PDU."""

    mtype: int
    payload: bytes


@dataclass(frozen=True)
class ReportPlan:
    """One admitted action, prepared once: the measInfoList it reports (one entry per (name, label), so
    record item i belongs to entry i unambiguously) and what to measure for each entry."""

    action_id: int
    cell: int | None
    granul_period_ms: int
    infos: tuple[kpm.MeasInfo, ...]
    specs: tuple[tuple[str, tuple[int, int | None] | None], ...]

    @classmethod
    def of(cls, action_id: int, fmt: kpm.ActionDefFormat1, node: NodeConfig) -> ReportPlan:
        cell = None if fmt.cell_global_id is None else node.cell_of(fmt.cell_global_id.cell_id)
        infos, specs = [], []
        for meas in fmt.meas:
            for label in meas.labels:
                infos.append(kpm.MeasInfo(meas.name, (label,)))
                specs.append((str(meas.name), None if label.snssai is None else (label.snssai.sst, label.snssai.sd)))
        return cls(action_id, cell, fmt.granul_period_ms, tuple(infos), tuple(specs))


@dataclass
class NodeSubscription:
    request_id: e2ap.RicRequestId
    period_ms: int
    actions: tuple[tuple[int, ReportPlan | uestyles.UePlan], ...]  # (RIC action ID, plan)
    due_ms: float = 0.0
    sn: int = 0


@dataclass
class NodeStats:
    indications: int = 0
    controls_ok: int = 0
    controls_failed: int = 0
    error_indications: int = 0
    quotas_applied: list = field(default_factory=list)
    ue_limits_applied: list = field(default_factory=list)   # (UE F1AP ID, grant limit as a cell fraction)
    nvs_applied: list = field(default_factory=list)          # {slice index: NVS reserved share} per control


def _cause(value: str, group: str = "ricRequest") -> e2ap.Cause:
    return e2ap.Cause(group, value)


class E2Node:
    def __init__(self, config: NodeConfig, ran: RanControls) -> None:
        self.config = config
        self.ran = ran
        self.version = functions.kpm_version(config)
        self.connected = False
        self.subscriptions: dict[tuple[int, int], NodeSubscription] = {}
        self.stats = NodeStats()
        self._transaction = 0
        self._ran_functions = functions.ran_functions(config)

    # -- E2 setup -----------------------------------------------------------------------------------

    def setup_request(self) -> Outgoing:
        self._transaction = (self._transaction + 1) % 256
        req = e2ap.E2SetupRequest(
            transaction_id=self._transaction,
            node_id=self.config.global_id,
            ran_functions=self._ran_functions,
            components=(e2ap.E2NodeComponentConfig("f1", self.config.du_id, b"\x00", b"\x00"),))
        return Outgoing(E2_SETUP_REQ, e2ap.encode_e2ap(req))

    # -- from the RIC -------------------------------------------------------------------------------

    def receive(self, mtype: int, payload: bytes) -> list[Outgoing]:
        try:
            pdu = e2ap.decode_e2ap(payload)
        except E2DecodeError as exc:
            log.info("%s: undecodable E2AP (mtype %d): %s", self.config.inventory_name, mtype, exc)
            return [self._error(_cause("transfer-syntax-error", "protocol"))]
        try:
            if isinstance(pdu, e2ap.E2SetupResponse):
                self.connected = pdu.transaction_id == self._transaction
                return []
            if isinstance(pdu, e2ap.E2SetupFailure):
                log.warning("%s: E2 setup failed: %s", self.config.inventory_name, pdu.cause)
                return []
            if isinstance(pdu, e2ap.RicSubscriptionRequest):
                return [self._subscribe(pdu)]
            if isinstance(pdu, e2ap.RicSubscriptionDeleteRequest):
                return [self._unsubscribe(pdu)]
            if isinstance(pdu, e2ap.RicControlRequest):
                return self._control(pdu)
            if isinstance(pdu, e2ap.ErrorIndication):
                log.info("%s: error indication from the RIC: %s", self.config.inventory_name, pdu.cause)
                return []
        except (E2EncodeError, ValueError) as exc:  # a reply we cannot build must not take the node down
            log.warning("%s: failed handling %s: %s", self.config.inventory_name, type(pdu).__name__, exc)
            return [self._error(_cause("unspecified", "protocol"), getattr(pdu, "request_id", None))]
        return [self._error(_cause("message-not-compatible-with-receiver-state", "protocol"),
                            getattr(pdu, "request_id", None))]

    def _error(self, cause: e2ap.Cause, request_id=None, ran_function_id=None) -> Outgoing:
        self.stats.error_indications += 1
        return Outgoing(ERROR_INDICATION, e2ap.encode_e2ap(e2ap.ErrorIndication(
            request_id=request_id, ran_function_id=ran_function_id, cause=cause)))

    def _sub_failure(self, req, cause: e2ap.Cause) -> Outgoing:
        return Outgoing(SUB_FAILURE, e2ap.encode_e2ap(
            e2ap.RicSubscriptionFailure(req.request_id, req.ran_function_id, cause)))

    def _subscribe(self, req: e2ap.RicSubscriptionRequest) -> Outgoing:
        key = (req.request_id.requestor, req.request_id.instance)
        if req.ran_function_id != self.config.kpm_function_id:
            return self._sub_failure(req, _cause("ran-function-id-invalid"))
        if key in self.subscriptions:
            return self._sub_failure(req, _cause("duplicate-ric-request-id"))
        try:
            trigger = kpm.decode_event_trigger(req.event_trigger, self.version)
        except (E2DecodeError, ValueError):
            return self._sub_failure(req, _cause("eventTriggerNotSupported"))
        admitted: list[tuple[int, ReportPlan | uestyles.UePlan]] = []
        refused: list[tuple[int, e2ap.Cause]] = []
        for action in req.actions:
            fmt = self._action_format(action)
            if isinstance(fmt, e2ap.Cause):
                refused.append((action.action_id, fmt))
            else:
                admitted.append((action.action_id, fmt))
        if not admitted:
            return self._sub_failure(req, refused[0][1] if refused else _cause("action-not-supported"))
        self.subscriptions[key] = NodeSubscription(req.request_id, trigger.period_ms, tuple(admitted))
        return Outgoing(SUB_RESP, e2ap.encode_e2ap(e2ap.RicSubscriptionResponse(
            req.request_id, req.ran_function_id, tuple(a for a, _ in admitted), tuple(refused))))

    def _action_format(self, action: e2ap.RicAction) -> ReportPlan | uestyles.UePlan | e2ap.Cause:
        if action.action_type != "report" or action.definition is None:
            return _cause("action-not-supported")
        try:
            d = kpm.decode_action_definition(action.definition, self.version)
        except (E2DecodeError, ValueError):
            return _cause("action-not-supported")
        expected = {1: kpm.ActionDefFormat1, 2: kpm.ActionDefFormat2, 3: kpm.ActionDefFormat3,
                    4: kpm.ActionDefFormat4, 5: kpm.ActionDefFormat5}.get(d.style)
        if expected is None or not isinstance(d.format, expected):  # style N takes format N
            return _cause("action-not-supported")
        if d.style != 1:
            return uestyles.plan(d.style, d.format, self.config, functions.ue_measurements(self.config))
        if any(m.name not in measurements_for(self.config.kpm_profile) for m in d.format.meas):
            return _cause("requested-information-unavailable")
        cgi = d.format.cell_global_id
        if cgi is not None and (cgi.plmn != self.config.plmn or self.config.cell_of(cgi.cell_id) is None):
            return _cause("requested-information-unavailable")
        return ReportPlan.of(action.action_id, d.format, self.config)

    def _unsubscribe(self, req: e2ap.RicSubscriptionDeleteRequest) -> Outgoing:
        key = (req.request_id.requestor, req.request_id.instance)
        if self.subscriptions.pop(key, None) is None:
            return Outgoing(SUB_DEL_FAILURE, e2ap.encode_e2ap(e2ap.RicSubscriptionDeleteFailure(
                req.request_id, req.ran_function_id, _cause("request-id-unknown"))))
        return Outgoing(SUB_DEL_RESP, e2ap.encode_e2ap(
            e2ap.RicSubscriptionDeleteResponse(req.request_id, req.ran_function_id)))

    # -- RC control ---------------------------------------------------------------------------------

    def _control(self, req: e2ap.RicControlRequest) -> list[Outgoing]:
        from . import control

        if req.ran_function_id != self.config.rc_function_id:
            result: e2ap.Cause | bytes = _cause("ran-function-id-invalid")
        else:
            result = control.execute(self.config, self.ran, req.header, req.message, self.stats)
        if not dialects.answers_control(self.config, req.ack_request):
            # srsRAN answers only a request that asked for an answer (RICcontrolAckRequest present and "ack")
            if isinstance(result, e2ap.Cause):
                self.stats.controls_failed += 1
            else:
                self.stats.controls_ok += 1
            return []
        if isinstance(result, e2ap.Cause):
            self.stats.controls_failed += 1
            return [Outgoing(CONTROL_FAILURE, e2ap.encode_e2ap(e2ap.RicControlFailure(
                req.request_id, req.ran_function_id, result, call_process_id=req.call_process_id)))]
        self.stats.controls_ok += 1
        if req.ack_request is False:  # noAck: the RIC asked for no acknowledgement
            return []
        return [Outgoing(CONTROL_ACK, e2ap.encode_e2ap(e2ap.RicControlAcknowledge(
            req.request_id, req.ran_function_id, outcome=dialects.ack_outcome(self.config, result),
            call_process_id=req.call_process_id)))]

    # -- KPM reporting ------------------------------------------------------------------------------

    def on_period(self, m: SiteMeasurements, now_ms: float, collect_start_ntp: int) -> list[Outgoing]:
        """Indications for every subscription whose reporting period has come round at `now_ms`."""
        out: list[Outgoing] = []
        due = [sub for sub in self.subscriptions.values() if now_ms + 1e-6 >= sub.due_ms]
        if not due:
            return out
        stamp = collect_start_ntp if self.version.timestamp_octets == 8 else collect_start_ntp >> 32
        # senderName is a PrintableString: no '_' allowed, so not the inventory name itself.
        header = kpm.encode_indication_header(dialects.indication_header(self.config, stamp), self.version)
        for sub in due:
            sub.due_ms = now_ms + sub.period_ms
            for action_id, plan in sub.actions:
                content = self._report(m, plan) if isinstance(plan, ReportPlan) else \
                    uestyles.report(m, self.config, plan)
                if content is None:  # a UE-level action that matched no UE this period
                    continue
                message = kpm.encode_indication_message(content, self.version)
                ind = e2ap.RicIndication(sub.request_id, self.config.kpm_function_id, action_id, header, message,
                                         sn=sub.sn)
                sub.sn = (sub.sn + 1) % 65536
                out.append(Outgoing(INDICATION, e2ap.encode_e2ap(ind)))
        self.stats.indications += len(out)
        return out

    def _report(self, m: SiteMeasurements, plan: ReportPlan) -> kpm.IndicationMessageFormat1:
        values = tuple(measure(m, self.config.slices, name, snssai, plan.cell) for name, snssai in plan.specs)
        return kpm.IndicationMessageFormat1(records=(values,), meas_info=plan.infos,
                                            granul_period_ms=plan.granul_period_ms)
