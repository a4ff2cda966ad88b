"""E2AP (O-RAN.WG3.E2AP, v2 IEs) as typed frozen dataclasses, encoded with pycrate's E2AP module.

`encode_e2ap(msg) -> bytes` and `decode_e2ap(data) -> msg` cover the procedures the xApp and the E2 node
simulator use (e2-facts.md section 2). Only v2 IEs are produced: those bytes are identical under the v2, v3
and v4 modules, so they interoperate with OSC E2T (v2) and srsRAN (v3).

pycrate objects are module-level singletons holding the last value, so every use of them sits behind
`_LOCK`. The hot message, RICindication, is read and written by hand-written APER code in `e2sm._fast`
without pycrate (and without the lock); anything that code does not fully recognise falls back to the
pycrate path, which stays the reference (`decode_e2ap_reference`, `encode_e2ap_reference`).

Decoding rules (both paths): the whole input is consumed, every open type exactly, every mandatory IE of
the message is present exactly once, an unknown IE with criticality `reject` is refused and one with
`ignore`/`notify` is skipped. CriticalityDiagnostics, TNLinformation and other IEs the typed messages do
not carry are dropped; the JSON form keeps everything.
`decode_json` / `encode_json` speak the JSON form of tests/vectors/README.md for the kind `e2ap:E2AP-PDU`.

Two pycrate 0.8.1 APER decoding bugs are fixed below by replacing the two codec functions involved (see
their docstrings): misalignment after a fragmented field, and open types not consumed exactly.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pycrate_asn1dir import E2AP as _E2AP
from pycrate_asn1rt.codecs import ASN1CodecPER as _PER
from pycrate_asn1rt.err import ASN1PERDecodeErr as _PER_ERR
from pycrate_asn1rt.utils import Charpy as _Charpy

from e2sm.errors import E2DecodeError, E2EncodeError

__all__ = [
    "MAX_PDU_BYTES", "RicRequestId", "Cause", "SubsequentAction", "RicAction", "RicSubscriptionRequest",
    "RicSubscriptionResponse", "RicSubscriptionFailure", "RicSubscriptionDeleteRequest",
    "RicSubscriptionDeleteResponse", "RicSubscriptionDeleteFailure", "RicIndication", "RicControlRequest",
    "RicControlAcknowledge", "RicControlFailure", "GlobalE2NodeId", "RanFunctionItem", "E2NodeComponentConfig",
    "E2NodeComponentAck", "E2SetupRequest", "E2SetupResponse", "E2SetupFailure", "ErrorIndication",
    "E2apMessage", "encode_e2ap", "encode_e2ap_reference", "decode_e2ap", "decode_e2ap_reference",
    "decode_json", "encode_json", "plmn_to_bytes", "plmn_from_bytes",
]

# An E2AP PDU larger than this is refused before parsing (bounded work per message). Real PDUs are
# a few kB; the largest are E2setupRequests carrying several RAN function definitions.
MAX_PDU_BYTES = 1 << 20

_LOCK = threading.Lock()
_PDU = _E2AP.E2AP_PDU_Descriptions.E2AP_PDU
_CONTENTS = _E2AP.E2AP_PDU_Contents


def _decode_fragbytes(cla: Any, char: Any, ldet: int, bits: bool = False) -> tuple[bytes, int]:
    """pycrate 0.8.1 `ASN1CodecPER.decode_fragbytes` with its alignment bug fixed.

    The original advances the APER offset by `ldet` instead of `8*ldet` for the last octet fragment, so
    every aligned field after a fragmented (>= 16 kB) OCTET STRING or open type is read from the wrong
    bit: a RICindication whose message is 20 kB followed by a RICcallProcessID fails to decode. It also
    returns a wrong total length; this one returns the sum of the fragments (octets, or bits if `bits`).
    """
    chunks, total = [], 0
    while True:
        nbits = ldet if bits else 8 * ldet
        chunks.append(char.get_bytes(nbits))
        if cla.ALIGNED:
            cla._off[-1] += nbits
        total += ldet
        if total > cla.DEC_MAXL:
            raise _PER_ERR(f"too many fragments, {total!r}")
        if ldet not in (65536, 49152, 32768, 16384):
            return b"".join(chunks), total
        ldet = cla.decode_count(char)


_PER.decode_fragbytes = classmethod(_decode_fragbytes)


def _decode_unconst_open(cla: Any, char: Any, wrapped: Any = None) -> Any:
    """pycrate 0.8.1 `ASN1CodecPER.decode_unconst_open`, made strict: the value inside an open type (every
    E2AP IE value, every extension addition) must fill exactly the octets its length determinant announces.

    The original stops wherever the inner value ends and reads the rest of the open type as the next field,
    so `00 05 00 03 00 02 ff` (RANfunctionID 2 plus one stray octet) was parsed on into the following IE,
    whereas asn1c and Weaver's fast reader see a malformed IE. Decoding garbage differently from other
    stacks is how two parties end up disagreeing about one message; here it is an error instead.
    """
    if cla.ALIGNED and cla._off[-1] % 8:
        cla.decode_pad(char)
    ldet = cla.decode_count(char)
    if ldet in (65536, 49152, 32768, 16384):
        buf, ldet = cla.decode_fragbytes(char, ldet)
        if wrapped is None:
            return buf
        inner = _Charpy(buf)
        wrapped.from_aper(inner) if cla.ALIGNED else wrapped.from_uper(inner)
        if inner.len_bit():
            raise _PER_ERR(f"{wrapped._name}: {inner.len_bit() // 8} octets left unread in its open type")
        return wrapped._val
    if wrapped is None:
        if cla.ALIGNED:
            cla._off[-1] += 8 * ldet
        return char.get_bytes(8 * ldet)
    limit, start = char._len_bit, char._cur
    end = start + 8 * ldet
    if end > limit:
        raise _PER_ERR("length determinant too long")
    char._len_bit = end
    try:
        wrapped.from_aper(char) if cla.ALIGNED else wrapped.from_uper(char)
    finally:
        char._len_bit = limit
    if char._cur != end:
        raise _PER_ERR(f"{wrapped._name}: {(end - char._cur) // 8} octets left unread in its open type")
    if cla.ALIGNED:
        cla._off[-1] += end - start
    return wrapped._val


_PER.decode_unconst_open = classmethod(_decode_unconst_open)

CRITICALITIES = ("reject", "ignore", "notify")
CAUSE_GROUPS = {
    name: tuple(obj._cont.keys()) for name, obj in _E2AP.E2AP_IEs.Cause._cont.items()
}
ACTION_TYPES = ("report", "insert", "policy")
SUBSEQUENT_TYPES = ("continue", "wait")
TIMES_TO_WAIT = tuple(_E2AP.E2AP_IEs.RICtimeToWait._cont.keys())
SETUP_TIMES_TO_WAIT = tuple(_E2AP.E2AP_IEs.TimeToWait._cont.keys())
INTERFACE_TYPES = ("ng", "xn", "e1", "f1", "w1", "s1", "x2")


# ---------------------------------------------------------------------------------------------------
# validation helpers: dataclasses refuse values the wire cannot carry, so an invalid message cannot exist
def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise E2EncodeError(f"{name} must be an integer in {lo}..{hi}, got {value!r}", name)


def _check_opt_int(name: str, value: Any, lo: int, hi: int) -> None:
    if value is not None:
        _check_int(name, value, lo, hi)


def _check_bytes(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, bytes):
        raise E2EncodeError(f"{name} must be bytes, got {type(value).__name__}", name)


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise E2EncodeError(f"{name} must be one of {', '.join(allowed)}; got {value!r}", name)


def _check_printable(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, str) or not lo <= len(value) <= hi:
        raise E2EncodeError(f"{name} must be a string of {lo}..{hi} characters, got {value!r}", name)
    bad = [c for c in value if c not in _PRINTABLE]
    if bad:
        raise E2EncodeError(f"{name} holds characters outside PrintableString: {''.join(bad)!r}", name)


_PRINTABLE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?")


def plmn_to_bytes(plmn: str) -> bytes:
    """PLMN digits "00101" (MCC 001, MNC 01) -> 3-octet TBCD `00 f1 10` (3GPP TS 38.413 PLMN Identity)."""
    if not isinstance(plmn, str) or len(plmn) not in (5, 6) or not plmn.isdigit() or not plmn.isascii():
        raise E2EncodeError(f"PLMN must be 5 or 6 digits (MCC+MNC), got {plmn!r}", "plmn")
    d = [int(c) for c in plmn]
    mnc3 = d[5] if len(d) == 6 else 0xF
    return bytes((d[1] << 4 | d[0], mnc3 << 4 | d[2], d[4] << 4 | d[3]))


def plmn_from_bytes(raw: bytes) -> str:
    """3-octet TBCD PLMN -> digit string; refuses non-decimal nibbles (E2DecodeError)."""
    if len(raw) != 3:
        raise E2DecodeError(f"PLMN identity must be 3 octets, got {len(raw)}", "plmn")
    n = [raw[0] & 0xF, raw[0] >> 4, raw[1] & 0xF, raw[2] & 0xF, raw[2] >> 4, raw[1] >> 4]
    if any(x > 9 for x in n[:5]) or not (n[5] <= 9 or n[5] == 0xF):
        raise E2DecodeError(f"PLMN identity {raw.hex()} is not TBCD digits", "plmn")
    return "".join(str(x) for x in (n[:5] if n[5] == 0xF else n))


# ---------------------------------------------------------------------------------------------------
# typed messages
@dataclass(frozen=True)
class RicRequestId:
    requestor: int
    instance: int

    def __post_init__(self) -> None:
        _check_int("RICrequestID.ricRequestorID", self.requestor, 0, 65535)
        _check_int("RICrequestID.ricInstanceID", self.instance, 0, 65535)


@dataclass(frozen=True)
class Cause:
    """E2AP Cause: `group` is the CHOICE alternative (ricRequest, ricService, e2Node, transport, protocol,
    misc), `value` its ENUMERATED identifier, e.g. Cause("ricRequest", "action-not-supported")."""

    group: str
    value: str

    def __post_init__(self) -> None:
        _check_choice("Cause", self.group, tuple(CAUSE_GROUPS))
        _check_choice(f"Cause.{self.group}", self.value, CAUSE_GROUPS[self.group])


@dataclass(frozen=True)
class SubsequentAction:
    kind: str = "continue"          # continue | wait
    time_to_wait: str = "w1ms"      # w1ms .. w60s (E2AP v2 has no "zero")

    def __post_init__(self) -> None:
        _check_choice("ricSubsequentActionType", self.kind, SUBSEQUENT_TYPES)
        _check_choice("ricTimeToWait", self.time_to_wait, TIMES_TO_WAIT)


@dataclass(frozen=True)
class RicAction:
    action_id: int
    action_type: str = "report"
    definition: bytes | None = None
    subsequent: SubsequentAction | None = None

    def __post_init__(self) -> None:
        _check_int("ricActionID", self.action_id, 0, 255)
        _check_choice("ricActionType", self.action_type, ACTION_TYPES)
        _check_bytes("ricActionDefinition", self.definition, optional=True)
        if self.subsequent is not None and not isinstance(self.subsequent, SubsequentAction):
            raise E2EncodeError("ricSubsequentAction must be a SubsequentAction", "ricSubsequentAction")


def _check_request(msg: Any) -> None:
    if not isinstance(msg.request_id, RicRequestId):
        raise E2EncodeError("request_id must be a RicRequestId", "RICrequestID")
    _check_int("RANfunctionID", msg.ran_function_id, 0, 4095)


def _check_cause(name: str, cause: Any, optional: bool = False) -> None:
    if cause is None and optional:
        return
    if not isinstance(cause, Cause):
        raise E2EncodeError(f"{name} must be a Cause", name)


@dataclass(frozen=True)
class RicSubscriptionRequest:
    request_id: RicRequestId
    ran_function_id: int
    event_trigger: bytes
    actions: tuple[RicAction, ...]

    def __post_init__(self) -> None:
        _check_request(self)
        _check_bytes("ricEventTriggerDefinition", self.event_trigger)
        object.__setattr__(self, "actions", tuple(self.actions))
        if not 1 <= len(self.actions) <= 16 or not all(isinstance(a, RicAction) for a in self.actions):
            raise E2EncodeError("actions must be 1..16 RicAction", "ricAction-ToBeSetup-List")


@dataclass(frozen=True)
class RicSubscriptionResponse:
    request_id: RicRequestId
    ran_function_id: int
    admitted: tuple[int, ...]
    not_admitted: tuple[tuple[int, Cause], ...] = ()

    def __post_init__(self) -> None:
        _check_request(self)
        object.__setattr__(self, "admitted", tuple(self.admitted))
        object.__setattr__(self, "not_admitted", tuple(tuple(x) for x in self.not_admitted))
        if not 1 <= len(self.admitted) <= 16:
            raise E2EncodeError("admitted must list 1..16 action IDs", "RICaction-Admitted-List")
        for a in self.admitted:
            _check_int("RICaction-Admitted-Item.ricActionID", a, 0, 255)
        if len(self.not_admitted) > 16:
            raise E2EncodeError("not_admitted lists at most 16 actions", "RICaction-NotAdmitted-List")
        for item in self.not_admitted:
            if len(item) != 2:
                raise E2EncodeError("not_admitted items are (action_id, Cause)", "RICaction-NotAdmitted-List")
            _check_int("RICaction-NotAdmitted-Item.ricActionID", item[0], 0, 255)
            _check_cause("RICaction-NotAdmitted-Item.cause", item[1])


@dataclass(frozen=True)
class RicSubscriptionFailure:
    request_id: RicRequestId
    ran_function_id: int
    cause: Cause

    def __post_init__(self) -> None:
        _check_request(self)
        _check_cause("Cause", self.cause)


@dataclass(frozen=True)
class RicSubscriptionDeleteRequest:
    request_id: RicRequestId
    ran_function_id: int

    def __post_init__(self) -> None:
        _check_request(self)


@dataclass(frozen=True)
class RicSubscriptionDeleteResponse:
    request_id: RicRequestId
    ran_function_id: int

    def __post_init__(self) -> None:
        _check_request(self)


@dataclass(frozen=True)
class RicSubscriptionDeleteFailure:
    request_id: RicRequestId
    ran_function_id: int
    cause: Cause

    def __post_init__(self) -> None:
        _check_request(self)
        _check_cause("Cause", self.cause)


@dataclass(frozen=True)
class RicIndication:
    request_id: RicRequestId
    ran_function_id: int
    action_id: int
    header: bytes
    message: bytes
    sn: int | None = None
    indication_type: str = "report"
    call_process_id: bytes | None = None

    def __post_init__(self) -> None:
        _check_request(self)
        _check_int("RICactionID", self.action_id, 0, 255)
        _check_bytes("RICindicationHeader", self.header)
        _check_bytes("RICindicationMessage", self.message)
        _check_opt_int("RICindicationSN", self.sn, 0, 65535)
        _check_choice("RICindicationType", self.indication_type, ("report", "insert"))
        _check_bytes("RICcallProcessID", self.call_process_id, optional=True)


@dataclass(frozen=True)
class RicControlRequest:
    request_id: RicRequestId
    ran_function_id: int
    header: bytes
    message: bytes
    ack_request: bool | None = True       # None: IE absent; True: ack; False: noAck
    call_process_id: bytes | None = None

    def __post_init__(self) -> None:
        _check_request(self)
        _check_bytes("RICcontrolHeader", self.header)
        _check_bytes("RICcontrolMessage", self.message)
        if self.ack_request not in (None, True, False):
            raise E2EncodeError("ack_request must be True, False or None", "RICcontrolAckRequest")
        _check_bytes("RICcallProcessID", self.call_process_id, optional=True)


@dataclass(frozen=True)
class RicControlAcknowledge:
    request_id: RicRequestId
    ran_function_id: int
    outcome: bytes | None = None
    call_process_id: bytes | None = None

    def __post_init__(self) -> None:
        _check_request(self)
        _check_bytes("RICcontrolOutcome", self.outcome, optional=True)
        _check_bytes("RICcallProcessID", self.call_process_id, optional=True)


@dataclass(frozen=True)
class RicControlFailure:
    request_id: RicRequestId
    ran_function_id: int
    cause: Cause
    outcome: bytes | None = None
    call_process_id: bytes | None = None

    def __post_init__(self) -> None:
        _check_request(self)
        _check_cause("Cause", self.cause)
        _check_bytes("RICcontrolOutcome", self.outcome, optional=True)
        _check_bytes("RICcallProcessID", self.call_process_id, optional=True)


# E2 node types of GlobalE2node-ID and, per type, the BIT STRING alternatives of its node ID with their sizes
# (E2AP: GNB-ID-Choice 22..32, ENGNB-ID 22..32, ENB-ID-Choice / ENB-ID macro 20, home 28, short 18, long 21).
NODE_ID_CHOICES: dict[str, dict[str, tuple[int, int]]] = {
    "gNB": {"gnb-ID": (22, 32)},
    "en-gNB": {"gNB-ID": (22, 32)},
    "ng-eNB": {"enb-ID-macro": (20, 20), "enb-ID-shortmacro": (18, 18), "enb-ID-longmacro": (21, 21)},
    "eNB": {"macro-eNB-ID": (20, 20), "home-eNB-ID": (28, 28), "short-Macro-eNB-ID": (18, 18),
            "long-Macro-eNB-ID": (21, 21)},
}


@dataclass(frozen=True)
class GlobalE2NodeId:
    """An E2 node's global ID: PLMN digits and a node ID of `gnb_id_bits` bits (the gNB ID for a gNB or
    en-gNB, the eNB ID for an eNB or ng-eNB, as the `id_choice` alternative; default the type's first),
    optional gNB-CU-UP and gNB-DU IDs (gNB only: a gNB-DU sets `du_id`, a gNB-CU-UP `cu_up_id`)."""

    plmn: str = "00101"
    gnb_id: int = 0
    gnb_id_bits: int = 22
    du_id: int | None = None
    cu_up_id: int | None = None
    node_type: str = "gNB"
    id_choice: str | None = None

    def __post_init__(self) -> None:
        plmn_to_bytes(self.plmn)
        if self.node_type not in NODE_ID_CHOICES:
            raise E2EncodeError(f"node_type must be one of {tuple(NODE_ID_CHOICES)}, got {self.node_type!r}",
                                "GlobalE2node-ID")
        if self.choice not in NODE_ID_CHOICES[self.node_type]:
            raise E2EncodeError(f"{self.node_type} has no node ID alternative {self.id_choice!r}", "GlobalE2node-ID")
        lo, hi = NODE_ID_CHOICES[self.node_type][self.choice]
        _check_int(f"{self.choice} length", self.gnb_id_bits, lo, hi)
        _check_int("gnb-ID" if self.node_type == "gNB" else self.choice, self.gnb_id, 0, (1 << self.gnb_id_bits) - 1)
        _check_opt_int("gNB-DU-ID", self.du_id, 0, (1 << 36) - 1)
        _check_opt_int("gNB-CU-UP-ID", self.cu_up_id, 0, (1 << 36) - 1)
        if self.node_type != "gNB" and (self.du_id is not None or self.cu_up_id is not None):
            raise E2EncodeError("gNB-DU-ID / gNB-CU-UP-ID belong to a gNB node ID only", "GlobalE2node-ID")

    @property
    def choice(self) -> str:
        """The node ID's BIT STRING alternative (`id_choice`, or the node type's first)."""
        return self.id_choice or next(iter(NODE_ID_CHOICES[self.node_type]))


@dataclass(frozen=True)
class RanFunctionItem:
    ran_function_id: int
    definition: bytes
    revision: int
    oid: str

    def __post_init__(self) -> None:
        _check_int("ranFunctionID", self.ran_function_id, 0, 4095)
        _check_bytes("ranFunctionDefinition", self.definition)
        _check_int("ranFunctionRevision", self.revision, 0, 4095)
        _check_printable("ranFunctionOID", self.oid, 1, 1000)


_COMPONENT_ID_KIND = {  # interface type -> (E2nodeComponentID alternative, field, int or str)
    "ng": ("e2nodeComponentInterfaceTypeNG", "amf-name", str),
    "e1": ("e2nodeComponentInterfaceTypeE1", "gNB-CU-UP-ID", int),
    "f1": ("e2nodeComponentInterfaceTypeF1", "gNB-DU-ID", int),
    "w1": ("e2nodeComponentInterfaceTypeW1", "ng-eNB-DU-ID", int),
    "s1": ("e2nodeComponentInterfaceTypeS1", "mme-name", str),
}


def _check_component(interface_type: str, component_id: Any) -> None:
    # xn and x2 identify a neighbour node (a nested global ID); Weaver's typed API does not carry them.
    _check_choice("e2nodeComponentInterfaceType", interface_type, tuple(_COMPONENT_ID_KIND))
    _, name, kind = _COMPONENT_ID_KIND[interface_type]
    if kind is int:
        _check_int(name, component_id, 0, (1 << 36) - 1)
    else:
        _check_printable(name, component_id, 1, 150)


@dataclass(frozen=True)
class E2NodeComponentConfig:
    """One E2nodeComponentConfigAddition item: the interface (ng/e1/f1/w1/s1), its component ID (an int
    for e1/f1/w1, a name for ng/s1) and the opaque request/response parts of that interface's setup."""

    interface_type: str = "f1"
    component_id: int | str = 0
    request_part: bytes = b""
    response_part: bytes = b""

    def __post_init__(self) -> None:
        _check_component(self.interface_type, self.component_id)
        _check_bytes("e2nodeComponentRequestPart", self.request_part)
        _check_bytes("e2nodeComponentResponsePart", self.response_part)


@dataclass(frozen=True)
class E2NodeComponentAck:
    interface_type: str = "f1"
    component_id: int | str = 0
    success: bool = True
    cause: Cause | None = None

    def __post_init__(self) -> None:
        _check_component(self.interface_type, self.component_id)
        if not isinstance(self.success, bool):
            raise E2EncodeError("success must be a bool", "updateOutcome")
        _check_cause("failureCause", self.cause, optional=True)


@dataclass(frozen=True)
class E2SetupRequest:
    transaction_id: int
    node_id: GlobalE2NodeId
    ran_functions: tuple[RanFunctionItem, ...]
    # Mandatory in v2 (SIZE 1..1024): the default names the F1 interface of DU 0, as a simulated DU would.
    components: tuple[E2NodeComponentConfig, ...] = (E2NodeComponentConfig(),)

    def __post_init__(self) -> None:
        _check_int("TransactionID", self.transaction_id, 0, 255)
        if not isinstance(self.node_id, GlobalE2NodeId):
            raise E2EncodeError("node_id must be a GlobalE2NodeId", "GlobalE2node-ID")
        object.__setattr__(self, "ran_functions", tuple(self.ran_functions))
        object.__setattr__(self, "components", tuple(self.components))
        if not 1 <= len(self.ran_functions) <= 256 or not all(
                isinstance(f, RanFunctionItem) for f in self.ran_functions):
            raise E2EncodeError("ran_functions must be 1..256 RanFunctionItem", "RANfunctions-List")
        if not 1 <= len(self.components) <= 1024 or not all(
                isinstance(c, E2NodeComponentConfig) for c in self.components):
            raise E2EncodeError("components must be 1..1024 E2NodeComponentConfig",
                                "E2nodeComponentConfigAddition-List")


@dataclass(frozen=True)
class E2SetupResponse:
    transaction_id: int
    ric_plmn: str
    ric_id: int
    accepted: tuple[tuple[int, int], ...] = ()        # (ran_function_id, revision)
    rejected: tuple[tuple[int, Cause], ...] = ()      # (ran_function_id, cause)
    component_acks: tuple[E2NodeComponentAck, ...] = (E2NodeComponentAck(),)

    def __post_init__(self) -> None:
        _check_int("TransactionID", self.transaction_id, 0, 255)
        plmn_to_bytes(self.ric_plmn)
        _check_int("ric-ID", self.ric_id, 0, (1 << 20) - 1)
        object.__setattr__(self, "accepted", tuple(tuple(x) for x in self.accepted))
        object.__setattr__(self, "rejected", tuple(tuple(x) for x in self.rejected))
        object.__setattr__(self, "component_acks", tuple(self.component_acks))
        if len(self.accepted) > 256 or len(self.rejected) > 256:
            raise E2EncodeError("at most 256 accepted and 256 rejected RAN functions", "RANfunctionsID-List")
        for item in self.accepted:
            if len(item) != 2:
                raise E2EncodeError("accepted items are (ran_function_id, revision)", "RANfunctionsID-List")
            _check_int("ranFunctionID", item[0], 0, 4095)
            _check_int("ranFunctionRevision", item[1], 0, 4095)
        for item in self.rejected:
            if len(item) != 2:
                raise E2EncodeError("rejected items are (ran_function_id, Cause)", "RANfunctionsIDcause-List")
            _check_int("ranFunctionID", item[0], 0, 4095)
            _check_cause("cause", item[1])
        if not 1 <= len(self.component_acks) <= 1024 or not all(
                isinstance(c, E2NodeComponentAck) for c in self.component_acks):
            raise E2EncodeError("component_acks must be 1..1024 E2NodeComponentAck",
                                "E2nodeComponentConfigAdditionAck-List")


@dataclass(frozen=True)
class E2SetupFailure:
    transaction_id: int
    cause: Cause
    time_to_wait: str | None = None     # v1s .. v60s

    def __post_init__(self) -> None:
        _check_int("TransactionID", self.transaction_id, 0, 255)
        _check_cause("Cause", self.cause)
        if self.time_to_wait is not None:
            _check_choice("TimeToWait", self.time_to_wait, SETUP_TIMES_TO_WAIT)


@dataclass(frozen=True)
class ErrorIndication:
    transaction_id: int | None = None
    request_id: RicRequestId | None = None
    ran_function_id: int | None = None
    cause: Cause | None = None

    def __post_init__(self) -> None:
        _check_opt_int("TransactionID", self.transaction_id, 0, 255)
        if self.request_id is not None and not isinstance(self.request_id, RicRequestId):
            raise E2EncodeError("request_id must be a RicRequestId", "RICrequestID")
        _check_opt_int("RANfunctionID", self.ran_function_id, 0, 4095)
        _check_cause("Cause", self.cause, optional=True)


E2apMessage = (
    RicSubscriptionRequest | RicSubscriptionResponse | RicSubscriptionFailure | RicSubscriptionDeleteRequest
    | RicSubscriptionDeleteResponse | RicSubscriptionDeleteFailure | RicIndication | RicControlRequest
    | RicControlAcknowledge | RicControlFailure | E2SetupRequest | E2SetupResponse | E2SetupFailure
    | ErrorIndication
)

# (PDU alternative, procedureCode, procedure criticality, E2AP message type) per typed message.
_PROCEDURES: dict[type, tuple[str, int, str, str]] = {
    RicSubscriptionRequest: ("initiatingMessage", 8, "reject", "RICsubscriptionRequest"),
    RicSubscriptionResponse: ("successfulOutcome", 8, "reject", "RICsubscriptionResponse"),
    RicSubscriptionFailure: ("unsuccessfulOutcome", 8, "reject", "RICsubscriptionFailure"),
    RicSubscriptionDeleteRequest: ("initiatingMessage", 9, "reject", "RICsubscriptionDeleteRequest"),
    RicSubscriptionDeleteResponse: ("successfulOutcome", 9, "reject", "RICsubscriptionDeleteResponse"),
    RicSubscriptionDeleteFailure: ("unsuccessfulOutcome", 9, "reject", "RICsubscriptionDeleteFailure"),
    RicIndication: ("initiatingMessage", 5, "ignore", "RICindication"),
    RicControlRequest: ("initiatingMessage", 4, "reject", "RICcontrolRequest"),
    RicControlAcknowledge: ("successfulOutcome", 4, "reject", "RICcontrolAcknowledge"),
    RicControlFailure: ("unsuccessfulOutcome", 4, "reject", "RICcontrolFailure"),
    E2SetupRequest: ("initiatingMessage", 1, "reject", "E2setupRequest"),
    E2SetupResponse: ("successfulOutcome", 1, "reject", "E2setupResponse"),
    E2SetupFailure: ("unsuccessfulOutcome", 1, "reject", "E2setupFailure"),
    ErrorIndication: ("initiatingMessage", 2, "ignore", "ErrorIndication"),
}
_BY_WIRE = {(alt, code): (cls, name) for cls, (alt, code, _, name) in _PROCEDURES.items()}
_PROCEDURE_NAMES = {1: "E2setup", 2: "ErrorIndication", 3: "Reset", 4: "RICcontrol", 5: "RICindication",
                    7: "RICserviceUpdate", 8: "RICsubscription", 9: "RICsubscriptionDelete",
                    10: "RICserviceQuery", 11: "E2nodeConfigurationUpdate", 12: "RICsubscriptionDeleteRequired",
                    13: "E2connectionUpdate", 14: "RICsubscriptionModification",
                    15: "RICsubscriptionModificationRequired", 16: "RICquery", 17: "RICsubscriptionAudit"}


def _ie_table(container: Any) -> dict[int, tuple[str, str, str]]:
    """id -> (value type name, criticality, presence), read from the module's IE information object set."""
    rows = container._cont._cont["value"]._const_tab._val.root
    return {r["id"]: (r["Value"]._typeref.called[1], r["criticality"], r["presence"]) for r in rows}


_IES = {name: _ie_table(getattr(_CONTENTS, name)._cont["protocolIEs"]) for *_, name in _PROCEDURES.values()}
_LIST_IES = {  # list type -> (item IE id, item criticality, item type)
    name: next((i, c, t) for i, (t, c, _) in _ie_table(getattr(_CONTENTS, name.replace("-", "_"))).items())
    for name in ("RICactions-ToBeSetup-List", "RICaction-Admitted-List", "RICaction-NotAdmitted-List",
                 "RANfunctions-List", "RANfunctionsID-List", "RANfunctionsIDcause-List",
                 "E2nodeComponentConfigAddition-List", "E2nodeComponentConfigAdditionAck-List")
}


# ---------------------------------------------------------------------------------------------------
# typed message <-> pycrate value
def _ie(msg_name: str, ie_id: int, value: Any) -> dict:
    type_name, criticality, _ = _IES[msg_name][ie_id]
    return {"id": ie_id, "criticality": criticality, "value": (type_name, value)}


def _list(list_name: str, values: list) -> list:
    ie_id, criticality, type_name = _LIST_IES[list_name]
    return [{"id": ie_id, "criticality": criticality, "value": (type_name, v)} for v in values]


def _req_id(r: RicRequestId) -> dict:
    return {"ricRequestorID": r.requestor, "ricInstanceID": r.instance}


def _cause(c: Cause) -> tuple:
    return (c.group, c.value)


def _bits(value: int, nbits: int) -> tuple[int, int]:
    return (value, nbits)


def _component_id(interface_type: str, component_id: int | str) -> tuple:
    alt, name, _ = _COMPONENT_ID_KIND[interface_type]
    return (alt, {name: component_id})


def _node_id(n: GlobalE2NodeId) -> tuple:
    plmn, bits = plmn_to_bytes(n.plmn), _bits(n.gnb_id, n.gnb_id_bits)
    if n.node_type == "en-gNB":
        return ("en-gNB", {"global-en-gNB-ID": {"pLMN-Identity": plmn, "gNB-ID": (n.choice, bits)}})
    if n.node_type == "ng-eNB":
        return ("ng-eNB", {"global-ng-eNB-ID": {"plmn-id": plmn, "enb-id": (n.choice, bits)}})
    if n.node_type == "eNB":
        return ("eNB", {"global-eNB-ID": {"pLMN-Identity": plmn, "eNB-ID": (n.choice, bits)}})
    gnb: dict[str, Any] = {"global-gNB-ID": {"plmn-id": plmn, "gnb-id": (n.choice, bits)}}
    if n.cu_up_id is not None:
        gnb["gNB-CU-UP-ID"] = n.cu_up_id
    if n.du_id is not None:
        gnb["gNB-DU-ID"] = n.du_id
    return ("gNB", gnb)


def _rid_ies(name: str, msg: Any) -> list:
    return [_ie(name, 29, _req_id(msg.request_id)), _ie(name, 5, msg.ran_function_id)]


def _to_ies(msg: E2apMessage, name: str) -> list:  # noqa: C901 - one branch per message, in spec order
    if isinstance(msg, RicSubscriptionRequest):
        actions = []
        for a in msg.actions:
            item: dict[str, Any] = {"ricActionID": a.action_id, "ricActionType": a.action_type}
            if a.definition is not None:
                item["ricActionDefinition"] = a.definition
            if a.subsequent is not None:
                item["ricSubsequentAction"] = {"ricSubsequentActionType": a.subsequent.kind,
                                               "ricTimeToWait": a.subsequent.time_to_wait}
            actions.append(item)
        details = {"ricEventTriggerDefinition": msg.event_trigger,
                   "ricAction-ToBeSetup-List": _list("RICactions-ToBeSetup-List", actions)}
        return _rid_ies(name, msg) + [_ie(name, 30, details)]
    if isinstance(msg, RicSubscriptionResponse):
        ies = _rid_ies(name, msg) + [_ie(name, 17, _list(
            "RICaction-Admitted-List", [{"ricActionID": a} for a in msg.admitted]))]
        if msg.not_admitted:
            ies.append(_ie(name, 18, _list("RICaction-NotAdmitted-List", [
                {"ricActionID": a, "cause": _cause(c)} for a, c in msg.not_admitted])))
        return ies
    if isinstance(msg, RicSubscriptionFailure | RicSubscriptionDeleteFailure):
        return _rid_ies(name, msg) + [_ie(name, 1, _cause(msg.cause))]
    if isinstance(msg, RicSubscriptionDeleteRequest | RicSubscriptionDeleteResponse):
        return _rid_ies(name, msg)
    if isinstance(msg, RicIndication):
        ies = _rid_ies(name, msg) + [_ie(name, 15, msg.action_id)]
        if msg.sn is not None:
            ies.append(_ie(name, 27, msg.sn))
        ies += [_ie(name, 28, msg.indication_type), _ie(name, 25, msg.header), _ie(name, 26, msg.message)]
        if msg.call_process_id is not None:
            ies.append(_ie(name, 20, msg.call_process_id))
        return ies
    if isinstance(msg, RicControlRequest):
        ies = _rid_ies(name, msg)
        if msg.call_process_id is not None:
            ies.append(_ie(name, 20, msg.call_process_id))
        ies += [_ie(name, 22, msg.header), _ie(name, 23, msg.message)]
        if msg.ack_request is not None:
            ies.append(_ie(name, 21, "ack" if msg.ack_request else "noAck"))
        return ies
    if isinstance(msg, RicControlAcknowledge):
        ies = _rid_ies(name, msg)
        if msg.call_process_id is not None:
            ies.append(_ie(name, 20, msg.call_process_id))
        if msg.outcome is not None:
            ies.append(_ie(name, 32, msg.outcome))
        return ies
    if isinstance(msg, RicControlFailure):
        ies = _rid_ies(name, msg)
        if msg.call_process_id is not None:
            ies.append(_ie(name, 20, msg.call_process_id))
        ies.append(_ie(name, 1, _cause(msg.cause)))
        if msg.outcome is not None:
            ies.append(_ie(name, 32, msg.outcome))
        return ies
    if isinstance(msg, E2SetupRequest):
        functions = [{"ranFunctionID": f.ran_function_id, "ranFunctionDefinition": f.definition,
                      "ranFunctionRevision": f.revision, "ranFunctionOID": f.oid} for f in msg.ran_functions]
        components = [{"e2nodeComponentInterfaceType": c.interface_type,
                       "e2nodeComponentID": _component_id(c.interface_type, c.component_id),
                       "e2nodeComponentConfiguration": {"e2nodeComponentRequestPart": c.request_part,
                                                        "e2nodeComponentResponsePart": c.response_part}}
                      for c in msg.components]
        return [_ie(name, 49, msg.transaction_id), _ie(name, 3, _node_id(msg.node_id)),
                _ie(name, 10, _list("RANfunctions-List", functions)),
                _ie(name, 50, _list("E2nodeComponentConfigAddition-List", components))]
    if isinstance(msg, E2SetupResponse):
        ies = [_ie(name, 49, msg.transaction_id),
               _ie(name, 4, {"pLMN-Identity": plmn_to_bytes(msg.ric_plmn), "ric-ID": _bits(msg.ric_id, 20)})]
        if msg.accepted:
            ies.append(_ie(name, 9, _list("RANfunctionsID-List", [
                {"ranFunctionID": f, "ranFunctionRevision": r} for f, r in msg.accepted])))
        if msg.rejected:
            ies.append(_ie(name, 13, _list("RANfunctionsIDcause-List", [
                {"ranFunctionID": f, "cause": _cause(c)} for f, c in msg.rejected])))
        acks = []
        for a in msg.component_acks:
            ack: dict[str, Any] = {"updateOutcome": "success" if a.success else "failure"}
            if a.cause is not None:
                ack["failureCause"] = _cause(a.cause)
            acks.append({"e2nodeComponentInterfaceType": a.interface_type,
                         "e2nodeComponentID": _component_id(a.interface_type, a.component_id),
                         "e2nodeComponentConfigurationAck": ack})
        ies.append(_ie(name, 52, _list("E2nodeComponentConfigAdditionAck-List", acks)))
        return ies
    if isinstance(msg, E2SetupFailure):
        ies = [_ie(name, 49, msg.transaction_id), _ie(name, 1, _cause(msg.cause))]
        if msg.time_to_wait is not None:
            ies.append(_ie(name, 31, msg.time_to_wait))
        return ies
    if isinstance(msg, ErrorIndication):
        ies = []
        if msg.transaction_id is not None:
            ies.append(_ie(name, 49, msg.transaction_id))
        if msg.request_id is not None:
            ies.append(_ie(name, 29, _req_id(msg.request_id)))
        if msg.ran_function_id is not None:
            ies.append(_ie(name, 5, msg.ran_function_id))
        if msg.cause is not None:
            ies.append(_ie(name, 1, _cause(msg.cause)))
        return ies
    raise E2EncodeError(f"not an E2AP message Weaver encodes: {type(msg).__name__}")


def _to_value(msg: E2apMessage) -> tuple:
    try:
        alt, code, criticality, name = _PROCEDURES[type(msg)]
    except KeyError:
        raise E2EncodeError(f"not an E2AP message Weaver encodes: {type(msg).__name__}") from None
    return (alt, {"procedureCode": code, "criticality": criticality,
                  "value": (name, {"protocolIEs": _to_ies(msg, name)})})


def _items(ies: list, list_name: str, where: str) -> list:
    want_id = _LIST_IES[list_name][0]
    out = []
    for i, ie in enumerate(ies):
        if ie["id"] != want_id:
            raise E2DecodeError(f"{list_name} item has IE id {ie['id']}, expected {want_id}", f"{where}[{i}]")
        out.append(ie["value"][1])
    return out


def _from_cause(v: tuple) -> Cause:
    return Cause(v[0], v[1])


def _from_bits(v: tuple[int, int]) -> tuple[int, int]:
    return v[0], v[1]


def _from_component_id(interface_type: str, v: tuple, where: str) -> int | str:
    if interface_type not in _COMPONENT_ID_KIND or _COMPONENT_ID_KIND[interface_type][0] != v[0]:
        raise E2DecodeError(f"E2 node component {interface_type}/{v[0]} is not supported by the typed API", where)
    return v[1][_COMPONENT_ID_KIND[interface_type][1]]


def _from_node_id(v: tuple) -> GlobalE2NodeId:
    kind, body = v
    # (outer key, PLMN key, node-ID key) of each node type's global ID, as E2AP names them
    keys = {"gNB": ("global-gNB-ID", "plmn-id", "gnb-id"), "en-gNB": ("global-en-gNB-ID", "pLMN-Identity", "gNB-ID"),
            "ng-eNB": ("global-ng-eNB-ID", "plmn-id", "enb-id"), "eNB": ("global-eNB-ID", "pLMN-Identity", "eNB-ID")}
    if kind not in keys:
        raise E2DecodeError(f"GlobalE2node-ID {kind} is not supported", "GlobalE2node-ID")
    outer, plmn_key, id_key = keys[kind]
    if outer not in body:  # a gNB given by its en-gNB ID, an ng-eNB by its eNB ID: not in the typed API
        raise E2DecodeError(f"GlobalE2node-{kind}-ID without {outer} is not supported", "GlobalE2node-ID")
    if kind == "gNB" and "global-en-gNB-ID" in body:
        raise E2DecodeError("GlobalE2node-gNB-ID.global-en-gNB-ID is not supported", "GlobalE2node-ID")
    g = body[outer]
    choice, (node_id, nbits) = g[id_key]
    try:
        return GlobalE2NodeId(plmn=plmn_from_bytes(g[plmn_key]), gnb_id=node_id, gnb_id_bits=nbits,
                              du_id=body.get("gNB-DU-ID"), cu_up_id=body.get("gNB-CU-UP-ID"), node_type=kind,
                              id_choice=None if choice == next(iter(NODE_ID_CHOICES[kind])) else choice)
    except E2EncodeError as exc:
        raise E2DecodeError(str(exc), "GlobalE2node-ID") from exc


def _collect_ies(name: str, ies: list) -> dict[int, Any]:
    """IE id -> value; duplicates and unknown `reject` IEs refused, unknown ignore/notify IEs skipped,
    missing mandatory IEs refused (E2AP section 10.3 abstract syntax errors)."""
    table = _IES[name]
    found: dict[int, Any] = {}
    for i, ie in enumerate(ies):
        ie_id, crit, (type_name, value) = ie["id"], ie["criticality"], ie["value"]
        if ie_id not in table:
            if crit == "reject":
                raise E2DecodeError(f"{name}: unknown IE {ie_id} with criticality reject", f"protocolIEs[{i}]")
            continue
        if ie_id in found:
            raise E2DecodeError(f"{name}: IE {ie_id} ({type_name}) appears twice", f"protocolIEs[{i}]")
        found[ie_id] = value
    missing = [f"{i} ({t})" for i, (t, _, p) in table.items() if p == "mandatory" and i not in found]
    if missing:
        raise E2DecodeError(f"{name}: mandatory IE missing: {', '.join(missing)}", name)
    return found


def _rid(ies: dict) -> tuple[RicRequestId, int]:
    r = ies[29]
    return RicRequestId(r["ricRequestorID"], r["ricInstanceID"]), ies[5]


def _from_value(pdu: tuple) -> E2apMessage:  # noqa: C901 - one branch per message
    alt, body = pdu
    code = body["procedureCode"]
    msg_name, content = body["value"]
    if (alt, code) not in _BY_WIRE:
        proc = _PROCEDURE_NAMES.get(code, f"unknown procedure {code}")
        raise E2DecodeError(f"unsupported E2AP message: {proc} {alt} ({msg_name})", "E2AP-PDU")
    cls, name = _BY_WIRE[(alt, code)]
    ies = _collect_ies(name, content["protocolIEs"])
    if cls is RicIndication:
        rid, fid = _rid(ies)
        return RicIndication(rid, fid, ies[15], ies[25], ies[26], sn=ies.get(27), indication_type=ies[28],
                             call_process_id=ies.get(20))
    if cls is RicSubscriptionRequest:
        rid, fid = _rid(ies)
        details = ies[30]
        actions = []
        for a in _items(details["ricAction-ToBeSetup-List"], "RICactions-ToBeSetup-List", "actions"):
            sub = a.get("ricSubsequentAction")
            if "ricActionExecutionOrder" in a:
                raise E2DecodeError("ricActionExecutionOrder (E2AP v3) is not supported", "RICaction-ToBeSetup-Item")
            actions.append(RicAction(a["ricActionID"], a["ricActionType"], a.get("ricActionDefinition"),
                                     None if sub is None else SubsequentAction(sub["ricSubsequentActionType"],
                                                                               sub["ricTimeToWait"])))
        return RicSubscriptionRequest(rid, fid, details["ricEventTriggerDefinition"], tuple(actions))
    if cls is RicSubscriptionResponse:
        rid, fid = _rid(ies)
        admitted = tuple(a["ricActionID"] for a in _items(ies[17], "RICaction-Admitted-List", "admitted"))
        not_admitted = tuple((a["ricActionID"], _from_cause(a["cause"]))
                             for a in _items(ies.get(18, []), "RICaction-NotAdmitted-List", "not_admitted"))
        return RicSubscriptionResponse(rid, fid, admitted, not_admitted)
    if cls in (RicSubscriptionFailure, RicSubscriptionDeleteFailure):
        rid, fid = _rid(ies)
        return cls(rid, fid, _from_cause(ies[1]))
    if cls in (RicSubscriptionDeleteRequest, RicSubscriptionDeleteResponse):
        return cls(*_rid(ies))
    if cls is RicControlRequest:
        rid, fid = _rid(ies)
        ack = ies.get(21)
        return RicControlRequest(rid, fid, ies[22], ies[23], None if ack is None else ack == "ack", ies.get(20))
    if cls is RicControlAcknowledge:
        rid, fid = _rid(ies)
        return RicControlAcknowledge(rid, fid, ies.get(32), ies.get(20))
    if cls is RicControlFailure:
        rid, fid = _rid(ies)
        return RicControlFailure(rid, fid, _from_cause(ies[1]), ies.get(32), ies.get(20))
    if cls is E2SetupRequest:
        functions = tuple(RanFunctionItem(f["ranFunctionID"], f["ranFunctionDefinition"], f["ranFunctionRevision"],
                                          f["ranFunctionOID"])
                          for f in _items(ies[10], "RANfunctions-List", "ran_functions"))
        components = []
        for i, c in enumerate(_items(ies[50], "E2nodeComponentConfigAddition-List", "components")):
            kind = c["e2nodeComponentInterfaceType"]
            cfg = c["e2nodeComponentConfiguration"]
            components.append(E2NodeComponentConfig(
                kind, _from_component_id(kind, c["e2nodeComponentID"], f"components[{i}]"),
                cfg["e2nodeComponentRequestPart"], cfg["e2nodeComponentResponsePart"]))
        return E2SetupRequest(ies[49], _from_node_id(ies[3]), functions, tuple(components))
    if cls is E2SetupResponse:
        ric = ies[4]
        ric_id, nbits = ric["ric-ID"]
        accepted = tuple((f["ranFunctionID"], f["ranFunctionRevision"])
                         for f in _items(ies.get(9, []), "RANfunctionsID-List", "accepted"))
        rejected = tuple((f["ranFunctionID"], _from_cause(f["cause"]))
                         for f in _items(ies.get(13, []), "RANfunctionsIDcause-List", "rejected"))
        acks = []
        for i, a in enumerate(_items(ies[52], "E2nodeComponentConfigAdditionAck-List", "component_acks")):
            kind = a["e2nodeComponentInterfaceType"]
            ack = a["e2nodeComponentConfigurationAck"]
            cause = ack.get("failureCause")
            acks.append(E2NodeComponentAck(
                kind, _from_component_id(kind, a["e2nodeComponentID"], f"component_acks[{i}]"),
                ack["updateOutcome"] == "success", None if cause is None else _from_cause(cause)))
        return E2SetupResponse(ies[49], plmn_from_bytes(ric["pLMN-Identity"]), ric_id, accepted, rejected,
                               tuple(acks))
    if cls is E2SetupFailure:
        return E2SetupFailure(ies[49], _from_cause(ies[1]), ies.get(31))
    # ErrorIndication: every IE optional
    rid = ies.get(29)
    return ErrorIndication(ies.get(49), None if rid is None else RicRequestId(rid["ricRequestorID"],
                                                                             rid["ricInstanceID"]),
                           ies.get(5), None if 1 not in ies else _from_cause(ies[1]))


# ---------------------------------------------------------------------------------------------------
# pycrate access (under the lock)
def _aper_decode(data: bytes) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise E2DecodeError(f"E2AP input must be bytes, got {type(data).__name__}", "E2AP-PDU")
    data = bytes(data)
    if not data:
        raise E2DecodeError("empty E2AP PDU", "E2AP-PDU")
    if len(data) > MAX_PDU_BYTES:
        raise E2DecodeError(f"E2AP PDU of {len(data)} bytes exceeds the {MAX_PDU_BYTES}-byte limit", "E2AP-PDU")
    with _LOCK:
        depth = len(_PER._off)
        try:
            char = _Charpy(data)
            _PDU.from_aper(char)
            left = char.len_bit()
            value = _PDU.get_val()
        except Exception as exc:  # pycrate raises many types (ASN1Err, CharpyErr, AssertionError, ...)
            raise E2DecodeError(f"E2AP-PDU does not decode: {type(exc).__name__}: {exc}",
                                f"{_PDU._name} byte {_consumed(char)}") from None
        finally:
            del _PER._off[depth:]   # a failed decode leaves pycrate's APER offset stack pushed
    if left >= 8:
        raise E2DecodeError(f"{left // 8} trailing bytes after the E2AP PDU", f"byte {len(data) - left // 8}")
    return value


def _consumed(char: Any) -> int:
    try:
        return char._cur // 8
    except Exception:  # noqa: BLE001 - only used to name a position in an error message
        return 0


def _aper_encode(value: Any) -> bytes:
    with _LOCK:
        depth = len(_PER._off)
        try:
            _PDU.set_val(value)
            out = _PDU.to_aper()
        except Exception as exc:
            raise E2EncodeError(f"E2AP-PDU does not encode: {type(exc).__name__}: {exc}", "E2AP-PDU") from None
        finally:
            del _PER._off[depth:]
    if len(out) > MAX_PDU_BYTES:
        raise E2EncodeError(f"E2AP PDU of {len(out)} bytes exceeds the {MAX_PDU_BYTES}-byte limit", "E2AP-PDU")
    return out


# ---------------------------------------------------------------------------------------------------
# public API
def encode_e2ap(msg: E2apMessage) -> bytes:
    """APER-encode a typed E2AP message; raises E2EncodeError for values the wire cannot carry.

    RICindications and RICcontrolRequests are written by `e2sm._fast` (the bytes pycrate writes, without
    pycrate) unless a field needs length fragments (>= 16 kB)."""
    if type(msg) in (RicIndication, RicControlRequest):
        write = _fast.encode_ric_indication if type(msg) is RicIndication else _fast.encode_control_request
        try:
            return write(msg)
        except _fast.Unsupported:
            pass
    return _aper_encode(_to_value(msg))


def encode_e2ap_reference(msg: E2apMessage) -> bytes:
    """Encode through pycrate only (the reference path, also for RICindication)."""
    return _aper_encode(_to_value(msg))


def decode_e2ap_reference(data: bytes) -> E2apMessage:
    """Decode through pycrate only (the reference path, also for RICindication)."""
    value = _aper_decode(data)
    try:
        return _from_value(value)
    except E2DecodeError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        # E2EncodeError from a dataclass check or a shape pycrate let through: still a decode failure.
        raise E2DecodeError(f"E2AP value not acceptable: {exc}", getattr(exc, "where", None) or "E2AP-PDU") from None


def decode_e2ap(data: bytes) -> E2apMessage:
    """Decode an APER E2AP PDU into its typed message; only E2DecodeError escapes.

    RICindications take the pycrate-free fast path (`e2sm._fast`); any shape it does not handle, and every
    other message, goes through pycrate. Thread-safe."""
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if isinstance(data, bytes) and data[:2] == b"\x00\x05" and len(data) <= MAX_PDU_BYTES:
        try:
            return _fast.decode_ric_indication(data)
        except _fast.Unsupported:
            pass
    return decode_e2ap_reference(data)


# ---------------------------------------------------------------------------------------------------
# JSON form (tests/vectors/README.md), walking pycrate's type tree next to the value
def decode_json(data: bytes) -> dict:
    """APER E2AP-PDU -> the vectors' JSON form (open-type values keyed by their ASN.1 type name)."""
    value = _aper_decode(data)
    try:
        return _json_of(_PDU, value, "E2AP-PDU")
    except E2DecodeError:
        raise
    except Exception as exc:  # a pycrate value shape the walker does not know
        raise E2DecodeError(f"E2AP value has no JSON form: {type(exc).__name__}: {exc}", "E2AP-PDU") from None


def encode_json(value: dict) -> bytes:
    """The vectors' JSON form of an E2AP-PDU -> APER bytes; E2EncodeError names the offending path.

    pycrate does not check table constraints when encoding (an IE id with another IE's value type, a
    procedureCode with another procedure's message), so the bytes are decoded again and must give back
    the same JSON: whatever this returns is a PDU that any E2AP decoder reads as `value`."""
    raw = _aper_encode(_value_of(_PDU, value, "E2AP-PDU"))
    try:
        again = decode_json(raw)
    except E2DecodeError as exc:
        raise E2EncodeError(f"value is not a consistent E2AP-PDU (ids and value types must match): {exc}",
                            exc.where) from None
    where = _first_difference(value, again, "E2AP-PDU")
    if where is not None:
        raise E2EncodeError("value is not a consistent E2AP-PDU: it does not survive encoding", where)
    return raw


def _first_difference(a: Any, b: Any, where: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            if k not in a or k not in b:
                return f"{where}.{k}"
            found = _first_difference(a[k], b[k], f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, str) and isinstance(b, str):
        return None if a.lower() == b.lower() else where    # hex may come in upper case
    return None if a == b and type(a) is type(b) else where


def _open_type(obj: Any, name: str) -> Any:
    """The type an open type's value has when named `name` in its table, or None."""
    try:
        return obj._get_val_obj(name)
    except Exception:  # noqa: BLE001 - pycrate raises assorted errors for unknown names
        return None


def _json_of(obj: Any, val: Any, where: str) -> Any:  # noqa: C901 - one branch per ASN.1 type
    t = obj.TYPE
    if t in ("SEQUENCE", "SET"):
        return {k: _json_of(obj._cont[k], v, f"{where}.{k}") for k, v in val.items()}
    if t in ("SEQUENCE OF", "SET OF"):
        return [_json_of(obj._cont, v, f"{where}[{i}]") for i, v in enumerate(val)]
    if t == "CHOICE":
        name, v = val
        if name not in obj._cont:
            raise E2DecodeError(f"unknown CHOICE extension {name}", where)
        return {name: _json_of(obj._cont[name], v, f"{where}.{name}")}
    if t == "OPEN_TYPE":
        name, v = val
        inner = _open_type(obj, name) if isinstance(name, str) and not name.startswith("_unk") else None
        if inner is None:
            raise E2DecodeError(f"open type value {name!r} has no known type", where)
        return {name: _json_of(inner, v, f"{where}.{name}")}
    if t == "OCTET STRING":
        return val.hex()
    if t == "BIT STRING":
        bits, length = val
        nbytes = (length + 7) // 8
        return {"bitstring": (bits << (nbytes * 8 - length)).to_bytes(nbytes, "big").hex(), "length": length}
    if t == "REAL":
        m, b, e = val
        return float(m) * float(b) ** e
    if t == "NULL":
        return None
    if t == "OBJECT IDENTIFIER":
        return ".".join(str(x) for x in val)
    if t in ("INTEGER", "ENUMERATED", "BOOLEAN") or t.endswith("String"):
        return val
    raise E2DecodeError(f"ASN.1 type {t} has no JSON form here", where)


def _value_of(obj: Any, js: Any, where: str) -> Any:  # noqa: C901 - one branch per ASN.1 type
    t = obj.TYPE

    def need(kind: type | tuple, what: str) -> None:
        if not isinstance(js, kind) or (isinstance(js, bool) and kind is int):
            raise E2EncodeError(f"expected {what}, got {type(js).__name__}", where)

    if t in ("SEQUENCE", "SET"):
        need(dict, "an object")
        unknown = [k for k in js if k not in obj._cont]
        if unknown:
            raise E2EncodeError(f"unknown component(s) {', '.join(unknown)}", where)
        return {k: _value_of(obj._cont[k], js[k], f"{where}.{k}") for k in obj._cont if k in js}
    if t in ("SEQUENCE OF", "SET OF"):
        need(list, "an array")
        return [_value_of(obj._cont, v, f"{where}[{i}]") for i, v in enumerate(js)]
    if t in ("CHOICE", "OPEN_TYPE"):
        need(dict, "a one-key object")
        if len(js) != 1:
            raise E2EncodeError(f"expected exactly one key, got {len(js)}", where)
        ((name, v),) = js.items()
        inner = (obj._cont[name] if name in obj._cont else None) if t == "CHOICE" else _open_type(obj, name)
        if inner is None:
            raise E2EncodeError(f"{name!r} is not an alternative here", where)
        return (name, _value_of(inner, v, f"{where}.{name}"))
    if t == "OCTET STRING":
        need(str, "a hex string")
        try:
            return bytes.fromhex(js)
        except ValueError:
            raise E2EncodeError(f"not a hex string: {js!r}", where) from None
    if t == "BIT STRING":
        need(dict, "{bitstring, length}")
        try:
            raw, length = bytes.fromhex(js["bitstring"]), js["length"]
        except (KeyError, ValueError, TypeError):
            raise E2EncodeError("BIT STRING must be {bitstring: hex, length: int}", where) from None
        if not isinstance(length, int) or length < 0 or len(raw) != (length + 7) // 8:
            raise E2EncodeError(f"BIT STRING length {length!r} does not match {len(raw)} octets", where)
        pad = len(raw) * 8 - length
        bits = int.from_bytes(raw, "big")
        if bits & ((1 << pad) - 1):
            raise E2EncodeError("BIT STRING unused trailing bits must be 0", where)
        return (bits >> pad, length)
    if t == "NULL":
        if js is not None:
            raise E2EncodeError("NULL must be null", where)
        return 0
    if t == "INTEGER":
        need(int, "an integer")
        return js
    if t == "BOOLEAN":
        need(bool, "true/false")
        return js
    if t == "ENUMERATED" or t.endswith("String"):
        need(str, "a string")
        return js
    raise E2EncodeError(f"ASN.1 type {t} has no JSON form here", where)


# Last: e2sm._fast (the pycrate-free RICindication and RICcontrolRequest codec) builds this module's dataclasses.
from e2sm import _fast  # noqa: E402
