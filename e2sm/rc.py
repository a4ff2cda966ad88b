"""E2SM-RC v01.03: control header/message/outcome, the RAN-parameter tree, the RAN function
definition, and the two controls Weaver sends.

Slice-level PRB quota (style 2, action 6). RAN vendors disagree on parameter IDs and layout
(e2-facts section 4), so nothing here hard-codes one table. `resolve_prb_quota_ids` reads the IDs
*by name* from the node's own RC RAN function definition; `SRSRAN_IDS` and `OAI_IDS` are explicit,
per-node fallbacks for nodes that do not advertise the action. A `PrbQuotaIds` also carries the
node's layout (`nested`: srsRAN/oran-sc-ric, with the Group and Member wrappers; `flat`: what the
OAI gNB parses, without them) and value encoding (`octets`: BCD PLMN, 1-octet SST, 3-octet SD;
`ascii`: OAI's digit strings).

Weaver compute control (vendor style 1000, action 1): the site's SM envelope for the RAN and the
best-effort delay budget, sent to the compute-aware MAC.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from e2sm import _asn1
from e2sm.common import GnbDuUeId, UeId, check_ue_id, plmn_from_bcd, plmn_to_bcd, ue_id_from_asn1
from e2sm.errors import E2DecodeError, E2EncodeError
from e2sm.memo import setup_memo

RC_MODULE = "rc-v1.03"
RC_OID = "1.3.6.1.4.1.53148.1.1.2.3"
U32 = (1 << 32) - 1

PRB_QUOTA_STYLE = 2
PRB_QUOTA_ACTION = 6
WEAVER_STYLE = 1000
WEAVER_ENVELOPE_ACTION = 1
WEAVER_PARAM_ENVELOPE = 1
WEAVER_PARAM_BE_DELAY = 2

# Deepest RAN-parameter tree accepted from the wire; the PRB quota tree is 6 deep.
MAX_TREE_DEPTH = 32


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")


def _check_name(name: str, value: Any) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= 150:
        raise ValueError(f"{name} must be a string of 1..150 chars, got {value!r}")


# ---------------------------------------------------------------------------------------------
# RAN parameter values and the parameter tree


@dataclass(frozen=True)
class BitValue:
    """A BIT STRING RAN parameter value: `length` bits, left-aligned in `data`."""

    data: bytes
    length: int

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes) or not isinstance(self.length, int) or len(self.data) != (self.length + 7) // 8:
            raise ValueError(f"{self.length!r} bits do not fit {self.data!r}")


# bool -> valueBoolean, int -> valueInt, float -> valueReal, BitValue -> valueBitS,
# bytes -> valueOctS, str -> valuePrintableString.
RanParamValue = bool | int | float | BitValue | bytes | str


def _value_to_asn1(v: RanParamValue) -> tuple[str, Any]:
    if isinstance(v, bool):
        return ("valueBoolean", v)
    if isinstance(v, int):
        return ("valueInt", v)
    if isinstance(v, float):
        return ("valueReal", v)
    if isinstance(v, BitValue):
        return ("valueBitS", (v.data, v.length))
    if isinstance(v, bytes):
        return ("valueOctS", v)
    if isinstance(v, str):
        return ("valuePrintableString", v)
    raise ValueError(f"not a RAN parameter value: {v!r}")


def _value_from_asn1(v: tuple[str, Any]) -> RanParamValue:
    kind, x = v
    if kind == "valueBitS":
        return BitValue(bytes(x[0]), x[1])
    if kind == "valueReal":
        return float(x)
    if kind in ("valueBoolean", "valueInt", "valueOctS", "valuePrintableString"):
        return x
    raise E2DecodeError("unknown RANParameter-Value extension alternative")


def _check_value(v: Any) -> None:
    _value_to_asn1(v)


@dataclass(frozen=True)
class RanParamElement:
    """A leaf. `key=True` is ranP-Choice-ElementTrue (a key element; value mandatory), otherwise
    ranP-Choice-ElementFalse, whose value may be absent (None)."""

    param_id: int
    value: RanParamValue | None = None
    key: bool = False

    def __post_init__(self) -> None:
        _check_int("ranParameter-ID", self.param_id, 1, U32)
        if self.value is not None:
            _check_value(self.value)
        elif self.key:
            raise ValueError("a key element (ElementTrue) needs a value")


@dataclass(frozen=True)
class RanParamStructure:
    """A STRUCTURE: named children (an empty tuple is a structure with no parameters)."""

    param_id: int
    children: tuple[RanParam, ...] = ()

    def __post_init__(self) -> None:
        _check_int("ranParameter-ID", self.param_id, 1, U32)
        _check_children(self.children)


@dataclass(frozen=True)
class RanParamList:
    """A LIST: each item is a RANParameter-STRUCTURE *without an ID of its own*, so an item is just
    the tuple of its children."""

    param_id: int
    items: tuple[tuple[RanParam, ...], ...]

    def __post_init__(self) -> None:
        _check_int("ranParameter-ID", self.param_id, 1, U32)
        if not isinstance(self.items, tuple) or not self.items:
            raise ValueError("a LIST needs at least one item")
        for item in self.items:
            _check_children(item)


RanParam = RanParamElement | RanParamStructure | RanParamList


def _check_children(children: Any) -> None:
    if not isinstance(children, tuple):
        raise ValueError(f"children must be a tuple, got {children!r}")
    for c in children:
        if not isinstance(c, (RanParamElement, RanParamStructure, RanParamList)):
            raise ValueError(f"not a RAN parameter: {c!r}")


def _structure_to_asn1(children: tuple[RanParam, ...]) -> dict:
    if not children:
        return {}
    return {"sequence-of-ranParameters": [_param_to_asn1(c) for c in children]}


def _param_to_asn1(p: RanParam) -> dict:
    if isinstance(p, RanParamElement):
        if p.key:
            vt = ("ranP-Choice-ElementTrue", {"ranParameter-value": _value_to_asn1(p.value)})
        elif p.value is None:
            vt = ("ranP-Choice-ElementFalse", {})
        else:
            vt = ("ranP-Choice-ElementFalse", {"ranParameter-value": _value_to_asn1(p.value)})
    elif isinstance(p, RanParamStructure):
        vt = ("ranP-Choice-Structure", {"ranParameter-Structure": _structure_to_asn1(p.children)})
    else:
        items = [_structure_to_asn1(item) for item in p.items]
        vt = ("ranP-Choice-List", {"ranParameter-List": {"list-of-ranParameter": items}})
    return {"ranParameter-ID": p.param_id, "ranParameter-valueType": vt}


def _structure_from_asn1(v: dict, depth: int) -> tuple[RanParam, ...]:
    return tuple(_param_from_asn1(c, depth + 1) for c in v.get("sequence-of-ranParameters", ()))


def _param_from_asn1(v: dict, depth: int) -> RanParam:
    if depth > MAX_TREE_DEPTH:
        raise E2DecodeError(f"RAN parameter tree deeper than {MAX_TREE_DEPTH}")
    pid = v["ranParameter-ID"]
    kind, body = v["ranParameter-valueType"]
    if kind == "ranP-Choice-ElementTrue":
        return RanParamElement(pid, _value_from_asn1(body["ranParameter-value"]), key=True)
    if kind == "ranP-Choice-ElementFalse":
        raw = body.get("ranParameter-value")
        return RanParamElement(pid, _value_from_asn1(raw) if raw is not None else None)
    if kind == "ranP-Choice-Structure":
        return RanParamStructure(pid, _structure_from_asn1(body["ranParameter-Structure"], depth))
    if kind == "ranP-Choice-List":
        items = body["ranParameter-List"]["list-of-ranParameter"]
        return RanParamList(pid, tuple(_structure_from_asn1(i, depth) for i in items))
    raise E2DecodeError("unknown RANParameter-ValueType extension alternative")


def _expect(obj: Any, cls: type, where: str) -> None:
    if not isinstance(obj, cls):
        raise E2EncodeError(f"cannot encode {type(obj).__name__} as {cls.__name__}", where)


def _typed(build: Any, where: str) -> Any:
    try:
        return build()
    except E2DecodeError as exc:
        raise E2DecodeError(str(exc), where) from exc
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise E2DecodeError(f"decoded value rejected: {exc}", where) from exc
    except RecursionError:
        raise E2DecodeError("nesting too deep", where) from None


# ---------------------------------------------------------------------------------------------
# Control header, message, outcome


@dataclass(frozen=True)
class RcControlHeader:
    """Control header format 1: the UE the control names (even slice-level controls name one;
    srsRAN expects gNB-DU-UEID F1AP ID 0), the control style and action, optional decision."""

    style: int
    action_id: int
    ue_id: UeId = GnbDuUeId(0)
    decision: str | None = None

    def __post_init__(self) -> None:
        _check_int("ric-Style-Type", self.style, -(1 << 31), (1 << 31) - 1)
        _check_int("ric-ControlAction-ID", self.action_id, 1, 65535)
        check_ue_id("ue_id", self.ue_id)
        if self.decision not in (None, "accept", "reject"):
            raise ValueError(f"decision must be accept, reject or None, got {self.decision!r}")


def encode_control_header(h: RcControlHeader) -> bytes:
    _expect(h, RcControlHeader, "E2SM-RC-ControlHeader")
    body: dict[str, Any] = {"ueID": h.ue_id.to_asn1(), "ric-Style-Type": h.style, "ric-ControlAction-ID": h.action_id}
    if h.decision is not None:
        body["ric-ControlDecision"] = h.decision
    return _asn1.encode(RC_MODULE, "E2SM-RC-ControlHeader", {"ric-controlHeader-formats": ("controlHeader-Format1", body)})


def decode_control_header(data: bytes) -> RcControlHeader:
    where = "E2SM-RC-ControlHeader"
    v = _asn1.decode(RC_MODULE, where, data)
    kind, body = v["ric-controlHeader-formats"]
    if kind != "controlHeader-Format1":
        raise E2DecodeError(f"control header {kind or 'unknown format'} is not supported (format 1 is)", where)
    return _typed(
        lambda: RcControlHeader(
            body["ric-Style-Type"], body["ric-ControlAction-ID"], ue_id_from_asn1(body["ueID"]), body.get("ric-ControlDecision")
        ),
        where,
    )


@dataclass(frozen=True)
class RcControlMessage:
    """Control message format 1: the top-level RAN parameters."""

    params: tuple[RanParam, ...]

    def __post_init__(self) -> None:
        _check_children(self.params)

    def find(self, param_id: int) -> RanParam | None:
        return next((p for p in self.params if p.param_id == param_id), None)


def encode_control_message(msg: RcControlMessage) -> bytes:
    _expect(msg, RcControlMessage, "E2SM-RC-ControlMessage")
    body = {"ranP-List": [_param_to_asn1(p) for p in msg.params]}
    return _asn1.encode(RC_MODULE, "E2SM-RC-ControlMessage", {"ric-controlMessage-formats": ("controlMessage-Format1", body)})


def decode_control_message(data: bytes) -> RcControlMessage:
    where = "E2SM-RC-ControlMessage"
    v = _asn1.decode(RC_MODULE, where, data)
    kind, body = v["ric-controlMessage-formats"]
    if kind != "controlMessage-Format1":
        raise E2DecodeError("unknown control message format", where)
    return _typed(lambda: RcControlMessage(tuple(_param_from_asn1(p, 1) for p in body["ranP-List"])), where)


@dataclass(frozen=True)
class RcControlOutcome:
    """Control outcome format 1: (ranParameter-ID, value) pairs, e.g. srsRAN's (1, 100), (11, min),
    (12, max) after a PRB quota control."""

    params: tuple[tuple[int, RanParamValue], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.params, tuple):
            raise ValueError("params must be a tuple of (id, value) pairs")
        for p in self.params:
            if not isinstance(p, tuple) or len(p) != 2:
                raise ValueError(f"params must be (id, value) pairs, got {p!r}")
            _check_int("ranParameter-ID", p[0], 1, U32)
            _check_value(p[1])


def encode_control_outcome(o: RcControlOutcome) -> bytes:
    _expect(o, RcControlOutcome, "E2SM-RC-ControlOutcome")
    body = {"ranP-List": [{"ranParameter-ID": i, "ranParameter-value": _value_to_asn1(x)} for i, x in o.params]}
    return _asn1.encode(RC_MODULE, "E2SM-RC-ControlOutcome", {"ric-controlOutcome-formats": ("controlOutcome-Format1", body)})


def decode_control_outcome(data: bytes) -> RcControlOutcome:
    where = "E2SM-RC-ControlOutcome"
    v = _asn1.decode(RC_MODULE, where, data)
    kind, body = v["ric-controlOutcome-formats"]
    if kind != "controlOutcome-Format1":
        raise E2DecodeError("unknown control outcome format", where)
    return _typed(
        lambda: RcControlOutcome(tuple((p["ranParameter-ID"], _value_from_asn1(p["ranParameter-value"])) for p in body["ranP-List"])),
        where,
    )


# ---------------------------------------------------------------------------------------------
# RAN function definition


@dataclass(frozen=True)
class RanParamDef:
    """A RAN parameter a node advertises: ID, name and, for a STRUCTURE or LIST, its children."""

    param_id: int
    name: str
    children: tuple[RanParamDef, ...] | None = None
    is_list: bool = False

    def __post_init__(self) -> None:
        _check_int("ranParameter-ID", self.param_id, 1, U32)
        _check_name("ranParameter-name", self.name)
        if self.children is not None and (
            not isinstance(self.children, tuple) or not self.children
            or not all(isinstance(c, RanParamDef) for c in self.children)
        ):
            raise ValueError("children must be None or a non-empty tuple of RanParamDef")
        if self.is_list and self.children is None:
            raise ValueError("a LIST definition needs children")

    def walk(self) -> list[RanParamDef]:
        out = [self]
        for c in self.children or ():
            out.extend(c.walk())
        return out


def _def_to_asn1(d: RanParamDef, with_def_key: str = "ranParameter-Definition") -> dict:
    v: dict[str, Any] = {"ranParameter-ID": d.param_id, "ranParameter-name": d.name}
    if d.children is not None:
        items = [_def_to_asn1(c) for c in d.children]
        choice = (
            ("choiceLIST", {"ranParameter-List": items})
            if d.is_list
            else ("choiceSTRUCTURE", {"ranParameter-STRUCTURE": items})
        )
        v[with_def_key] = {"ranParameter-Definition-Choice": choice}
    return v


def _def_from_asn1(v: dict, depth: int = 1) -> RanParamDef:
    if depth > MAX_TREE_DEPTH:
        raise E2DecodeError(f"RAN parameter definition deeper than {MAX_TREE_DEPTH}")
    definition = v.get("ranParameter-Definition")
    if definition is None:
        return RanParamDef(v["ranParameter-ID"], v["ranParameter-name"])
    kind, body = definition["ranParameter-Definition-Choice"]
    if kind == "choiceLIST":
        children = tuple(_def_from_asn1(c, depth + 1) for c in body["ranParameter-List"])
    elif kind == "choiceSTRUCTURE":
        children = tuple(_def_from_asn1(c, depth + 1) for c in body["ranParameter-STRUCTURE"])
    else:
        raise E2DecodeError("unknown RANParameter-Definition-Choice extension alternative")
    return RanParamDef(v["ranParameter-ID"], v["ranParameter-name"], children, kind == "choiceLIST")


@dataclass(frozen=True)
class RcControlAction:
    action_id: int
    name: str
    params: tuple[RanParamDef, ...] = ()

    def __post_init__(self) -> None:
        _check_int("ric-ControlAction-ID", self.action_id, 1, 65535)
        _check_name("ric-ControlAction-Name", self.name)
        if not isinstance(self.params, tuple) or not all(isinstance(p, RanParamDef) for p in self.params):
            raise ValueError(f"params must be a tuple of RanParamDef, got {self.params!r}")

    def params_by_name(self) -> dict[str, int]:
        """Every advertised parameter, nested ones included, as normalised name -> ID."""
        out: dict[str, int] = {}
        for p in self.params:
            for d in p.walk():
                out.setdefault(_norm(d.name), d.param_id)
        return out


# maxnoofRANOutcomeParameters in the published RC v01.03 module: the control style's outcome list is
# SIZE(1..255), unlike the other RAN parameter lists (1..65535).
MAX_OUTCOME_PARAMS = 255


@dataclass(frozen=True)
class RcControlStyle:
    style: int
    name: str
    actions: tuple[RcControlAction, ...] = ()
    header_format: int = 1
    message_format: int = 1
    call_process_id_format: int | None = None
    outcome_format: int = 1
    outcome_params: tuple[RanParamDef, ...] = ()

    def __post_init__(self) -> None:
        _check_name("ric-ControlStyle-Name", self.name)
        for f in ("style", "header_format", "message_format", "outcome_format"):
            _check_int(f, getattr(self, f), -(1 << 31), (1 << 31) - 1)
        if self.call_process_id_format is not None:
            _check_int("call_process_id_format", self.call_process_id_format, -(1 << 31), (1 << 31) - 1)
        if not isinstance(self.actions, tuple) or not all(isinstance(a, RcControlAction) for a in self.actions):
            raise ValueError(f"actions must be a tuple of RcControlAction, got {self.actions!r}")
        if not isinstance(self.outcome_params, tuple) or not all(isinstance(p, RanParamDef) for p in self.outcome_params):
            raise ValueError(f"outcome_params must be a tuple of RanParamDef, got {self.outcome_params!r}")
        if len(self.outcome_params) > MAX_OUTCOME_PARAMS:
            raise ValueError(f"at most {MAX_OUTCOME_PARAMS} outcome_params (maxnoofRANOutcomeParameters), "
                             f"got {len(self.outcome_params)}")


@dataclass(frozen=True)
class RcRanFunctionDefinition:
    """A node's RC RAN function definition. Control styles are typed; the event trigger, report,
    insert and policy sections are kept as asn1tools values in `other_sections` (name, value) so
    that nothing a node advertises is lost on a round trip."""

    oid: str = RC_OID
    short_name: str = "ORAN-E2SM-RC"
    description: str = "RAN Control"
    instance: int | None = None
    control_styles: tuple[RcControlStyle, ...] = ()
    other_sections: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _check_name("ranFunction-ShortName", self.short_name)
        _check_name("ranFunction-Description", self.description)
        if not isinstance(self.oid, str) or not 1 <= len(self.oid) <= 1000:
            raise ValueError(f"bad OID {self.oid!r}")
        if not isinstance(self.control_styles, tuple) or not all(isinstance(c, RcControlStyle) for c in self.control_styles):
            raise ValueError(f"control_styles must be a tuple of RcControlStyle, got {self.control_styles!r}")
        if self.instance is not None:
            _check_int("ranFunction-Instance", self.instance, -(1 << 31), (1 << 31) - 1)
        if not isinstance(self.other_sections, tuple) or not all(
            isinstance(x, tuple) and len(x) == 2 for x in self.other_sections
        ):
            raise ValueError("other_sections must be (section name, asn1tools value) pairs")
        for name, _ in self.other_sections:
            if name not in _OTHER_SECTIONS:
                raise ValueError(f"other_sections: {name!r} is not one of {_OTHER_SECTIONS}")

    def control_action(self, style: int, action_id: int) -> RcControlAction | None:
        for s in self.control_styles:
            if s.style == style:
                return next((a for a in s.actions if a.action_id == action_id), None)
        return None


_OTHER_SECTIONS = (
    "ranFunctionDefinition-EventTrigger",
    "ranFunctionDefinition-Report",
    "ranFunctionDefinition-Insert",
    "ranFunctionDefinition-Policy",
)


@setup_memo
def encode_ran_function_definition(d: RcRanFunctionDefinition) -> bytes:
    _expect(d, RcRanFunctionDefinition, "E2SM-RC-RANFunctionDefinition")
    name: dict[str, Any] = {
        "ranFunction-ShortName": d.short_name,
        "ranFunction-E2SM-OID": d.oid,
        "ranFunction-Description": d.description,
    }
    if d.instance is not None:
        name["ranFunction-Instance"] = d.instance
    value: dict[str, Any] = {"ranFunction-Name": name, **dict(d.other_sections)}
    if d.control_styles:
        value["ranFunctionDefinition-Control"] = {"ric-ControlStyle-List": [_style_to_asn1(s) for s in d.control_styles]}
    return _asn1.encode(RC_MODULE, "E2SM-RC-RANFunctionDefinition", value)


def _style_to_asn1(s: RcControlStyle) -> dict:
    v: dict[str, Any] = {"ric-ControlStyle-Type": s.style, "ric-ControlStyle-Name": s.name}
    if s.actions:
        v["ric-ControlAction-List"] = [
            {
                "ric-ControlAction-ID": a.action_id,
                "ric-ControlAction-Name": a.name,
                **({"ran-ControlActionParameters-List": [_def_to_asn1(p) for p in a.params]} if a.params else {}),
            }
            for a in s.actions
        ]
    v["ric-ControlHeaderFormat-Type"] = s.header_format
    v["ric-ControlMessageFormat-Type"] = s.message_format
    if s.call_process_id_format is not None:
        v["ric-CallProcessIDFormat-Type"] = s.call_process_id_format
    v["ric-ControlOutcomeFormat-Type"] = s.outcome_format
    if s.outcome_params:
        v["ran-ControlOutcomeParameters-List"] = [_def_to_asn1(p) for p in s.outcome_params]
    return v


@setup_memo
def decode_ran_function_definition(data: bytes) -> RcRanFunctionDefinition:
    where = "E2SM-RC-RANFunctionDefinition"
    v = _asn1.decode(RC_MODULE, where, data)

    def build() -> RcRanFunctionDefinition:
        n = v["ranFunction-Name"]
        control = v.get("ranFunctionDefinition-Control")
        styles = tuple(
            RcControlStyle(
                s["ric-ControlStyle-Type"],
                s["ric-ControlStyle-Name"],
                tuple(
                    RcControlAction(
                        a["ric-ControlAction-ID"],
                        a["ric-ControlAction-Name"],
                        tuple(_def_from_asn1(p) for p in a.get("ran-ControlActionParameters-List", ())),
                    )
                    for a in s.get("ric-ControlAction-List", ())
                ),
                s["ric-ControlHeaderFormat-Type"],
                s["ric-ControlMessageFormat-Type"],
                s.get("ric-CallProcessIDFormat-Type"),
                s["ric-ControlOutcomeFormat-Type"],
                tuple(_def_from_asn1(p) for p in s.get("ran-ControlOutcomeParameters-List", ())),
            )
            for s in (control["ric-ControlStyle-List"] if control else ())
        )
        return RcRanFunctionDefinition(
            oid=n["ranFunction-E2SM-OID"],
            short_name=n["ranFunction-ShortName"],
            description=n["ranFunction-Description"],
            instance=n.get("ranFunction-Instance"),
            control_styles=styles,
            other_sections=tuple((k, v[k]) for k in _OTHER_SECTIONS if k in v),
        )

    return _typed(build, where)


# ---------------------------------------------------------------------------------------------
# Slice-level PRB quota (style 2, action 6)

PRB_QUOTA_NAMES = {
    "ratio_list": "RRM Policy Ratio List",
    "ratio_group": "RRM Policy Ratio Group",
    "policy": "RRM Policy",
    "member_list": "RRM Policy Member List",
    "member": "RRM Policy Member",
    "plmn": "PLMN Identity",
    "snssai": "S-NSSAI",
    "sst": "SST",
    "sd": "SD",
    "min_ratio": "Min PRB Policy Ratio",
    "max_ratio": "Max PRB Policy Ratio",
    "ded_ratio": "Dedicated PRB Policy Ratio",
}
# Parameters that the flat (OAI) layout never puts on the wire.
_NESTED_ONLY = ("ratio_group", "member")


def _norm(name: str) -> str:
    return " ".join(name.lower().split())


@dataclass(frozen=True)
class PrbQuotaIds:
    """The parameter IDs of the PRB quota tree at one node, plus its layout and value encoding."""

    ratio_list: int
    ratio_group: int
    policy: int
    member_list: int
    member: int
    plmn: int
    snssai: int
    sst: int
    sd: int
    min_ratio: int
    max_ratio: int
    ded_ratio: int
    layout: str = "nested"
    values: str = "octets"

    def __post_init__(self) -> None:
        for f in PRB_QUOTA_NAMES:
            _check_int(f, getattr(self, f), 1, U32)
        if self.layout not in ("nested", "flat"):
            raise ValueError(f"layout must be 'nested' (srsRAN) or 'flat' (OAI), got {self.layout!r}")
        if self.values not in ("octets", "ascii"):
            raise ValueError(f"values must be 'octets' (BCD) or 'ascii' (OAI digits), got {self.values!r}")


# srsRAN / OSC / oran-sc-ric / xDevSM: spec numbering with ID 4 unused (both shared vectors' layout).
SRSRAN_IDS = PrbQuotaIds(1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13)
# OAI / FlexRIC ID table (contiguous 1..12), in the nested layout of the shared OAI vector.
OAI_IDS = PrbQuotaIds(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
# What the OAI gNB's parser expects on the wire: no Group/Member wrappers, ASCII digit values.
OAI_GNB_IDS = replace(OAI_IDS, layout="flat", values="ascii")

_FALLBACKS = {"srsran": SRSRAN_IDS, "oai": OAI_IDS, "oai-gnb": OAI_GNB_IDS}


def resolve_prb_quota_ids(
    definition: RcRanFunctionDefinition | None, fallback: str | PrbQuotaIds = "srsran"
) -> PrbQuotaIds:
    """The PRB quota parameter IDs of a node, read by name from its RC RAN function definition
    (control style 2, action 6, `ran-ControlActionParameters-List`, nested definitions included).

    If the node does not advertise style 2 action 6 (or there is no definition), the explicit
    `fallback` table is returned ("srsran", "oai", "oai-gnb" or a PrbQuotaIds). The fallback's
    layout and value encoding are kept either way: they are per-node configuration, not something a
    definition says. If the action is advertised but lacks a name the layout needs, this raises
    ValueError naming the missing parameters rather than guessing.
    """
    base = _FALLBACKS.get(fallback) if isinstance(fallback, str) else fallback
    if not isinstance(base, PrbQuotaIds):
        raise ValueError(f"fallback must be one of {sorted(_FALLBACKS)} or a PrbQuotaIds, got {fallback!r}")
    action = definition.control_action(PRB_QUOTA_STYLE, PRB_QUOTA_ACTION) if definition is not None else None
    if action is None:
        return base
    by_name = action.params_by_name()
    resolved: dict[str, int] = {}
    missing = []
    for field_name, name in PRB_QUOTA_NAMES.items():
        pid = by_name.get(_norm(name))
        if pid is not None:
            resolved[field_name] = pid
        elif base.layout == "flat" and field_name in _NESTED_ONLY:
            resolved[field_name] = getattr(base, field_name)  # never sent in the flat layout
        else:
            missing.append(name)
    if missing:
        raise ValueError(f"node advertises style 2 action 6 but not the parameter(s) {missing}")
    return replace(base, **resolved)


@dataclass(frozen=True)
class SliceQuota:
    """One slice's PRB quota: PLMN, S-NSSAI and min / max / dedicated PRB ratios in percent."""

    plmn: str = "00101"
    sst: int = 1
    sd: int | None = None
    min_ratio: int = 0
    max_ratio: int = 100
    dedicated_ratio: int = 0

    def __post_init__(self) -> None:
        plmn_to_bcd(self.plmn)
        _check_int("SST", self.sst, 0, 255)
        if self.sd is not None:
            _check_int("SD", self.sd, 0, (1 << 24) - 1)
        for name in ("min_ratio", "max_ratio", "dedicated_ratio"):
            _check_int(name, getattr(self, name), 0, 100)
        if self.min_ratio > self.max_ratio:
            raise ValueError(f"min_ratio {self.min_ratio} > max_ratio {self.max_ratio}")


def _member_leaves(q: SliceQuota, ids: PrbQuotaIds) -> tuple[RanParam, ...]:
    if ids.values == "octets":
        plmn, sst, sd = plmn_to_bcd(q.plmn), bytes([q.sst]), q.sd.to_bytes(3, "big") if q.sd is not None else None
    else:
        plmn, sst, sd = q.plmn.encode(), str(q.sst).encode(), str(q.sd).encode() if q.sd is not None else None
    snssai: tuple[RanParam, ...] = (RanParamElement(ids.sst, sst),)
    if sd is not None:
        snssai += (RanParamElement(ids.sd, sd),)
    return (RanParamElement(ids.plmn, plmn), RanParamStructure(ids.snssai, snssai))


def build_prb_quota_control(quotas: list[SliceQuota] | tuple[SliceQuota, ...], ids: PrbQuotaIds) -> RcControlMessage:
    """The style 2 action 6 control message for `quotas` (one list item per slice) in the node's
    IDs, layout and value encoding. Send it with `RcControlHeader(2, 6)`."""
    quotas = tuple(quotas)
    if not quotas or not all(isinstance(q, SliceQuota) for q in quotas):
        raise E2EncodeError("need at least one SliceQuota")
    items = []
    for q in quotas:
        ratios = (
            RanParamElement(ids.min_ratio, q.min_ratio),
            RanParamElement(ids.max_ratio, q.max_ratio),
            RanParamElement(ids.ded_ratio, q.dedicated_ratio),
        )
        leaves = _member_leaves(q, ids)
        if ids.layout == "nested":
            member_item = (RanParamStructure(ids.member, leaves),)
            policy = RanParamStructure(ids.policy, (RanParamList(ids.member_list, (member_item,)),))
            items.append((RanParamStructure(ids.ratio_group, (policy,) + ratios),))
        else:
            policy = RanParamStructure(ids.policy, (RanParamList(ids.member_list, (leaves,)),))
            items.append((policy,) + ratios)
    return RcControlMessage((RanParamList(ids.ratio_list, tuple(items)),))


def parse_prb_quota_control(msg: RcControlMessage, ids: PrbQuotaIds) -> list[SliceQuota]:
    """The node side of `build_prb_quota_control`: the slice quotas a control message carries.
    Raises E2DecodeError (naming the parameter) if the message does not have the node's layout."""
    top = msg.find(ids.ratio_list)
    if not isinstance(top, RanParamList):
        raise E2DecodeError(f"no RRM Policy Ratio List (ID {ids.ratio_list}) LIST at the top level")
    out: list[SliceQuota] = []
    for n, item in enumerate(top.items):
        where = f"RRM Policy Ratio List item {n}"
        if ids.layout == "nested":
            group = _only(item, ids.ratio_group, RanParamStructure, where)
            body = group.children
        else:
            body = item
        policy = _child(body, ids.policy, RanParamStructure, where)
        members = _child(policy.children, ids.member_list, RanParamList, where)
        if len(members.items) != 1:
            raise E2DecodeError(f"{where}: expected one RRM Policy Member, got {len(members.items)}")
        leaves = members.items[0]
        if ids.layout == "nested":
            leaves = _only(leaves, ids.member, RanParamStructure, where).children
        plmn = _leaf(leaves, ids.plmn, where)
        snssai = _child(leaves, ids.snssai, RanParamStructure, where)
        sst = _leaf(snssai.children, ids.sst, where)
        sd_el = next((c for c in snssai.children if c.param_id == ids.sd), None)
        sd = _leaf(snssai.children, ids.sd, where) if sd_el is not None else None
        try:
            out.append(
                SliceQuota(
                    plmn=_plmn_value(plmn, ids, where),
                    sst=_int_value(sst, ids, 1, where),
                    sd=_int_value(sd, ids, 3, where) if sd is not None else None,
                    min_ratio=_ratio(body, ids.min_ratio, where),
                    max_ratio=_ratio(body, ids.max_ratio, where),
                    dedicated_ratio=_ratio(body, ids.ded_ratio, where),
                )
            )
        except E2DecodeError:
            raise
        except ValueError as exc:
            raise E2DecodeError(f"{where}: {exc}") from exc
    return out


def _child(children: tuple[RanParam, ...], pid: int, kind: type, where: str) -> Any:
    found = [c for c in children if c.param_id == pid]
    if len(found) != 1 or not isinstance(found[0], kind):
        raise E2DecodeError(f"{where}: expected one {kind.__name__} with ID {pid}")
    return found[0]


def _only(children: tuple[RanParam, ...], pid: int, kind: type, where: str) -> Any:
    if len(children) != 1:
        raise E2DecodeError(f"{where}: expected only parameter {pid}, got {len(children)} parameters")
    return _child(children, pid, kind, where)


def _leaf(children: tuple[RanParam, ...], pid: int, where: str) -> RanParamValue:
    el = _child(children, pid, RanParamElement, where)
    if el.value is None:
        raise E2DecodeError(f"{where}: parameter {pid} has no value")
    return el.value


def _ratio(children: tuple[RanParam, ...], pid: int, where: str) -> int:
    v = _leaf(children, pid, where)
    if isinstance(v, bool) or not isinstance(v, int):
        raise E2DecodeError(f"{where}: ratio {pid} is {v!r}, not an integer")
    return v


def _plmn_value(v: RanParamValue, ids: PrbQuotaIds, where: str) -> str:
    if not isinstance(v, bytes):
        raise E2DecodeError(f"{where}: PLMN is {v!r}, not octets")
    if ids.values == "octets":
        return plmn_from_bcd(v)
    text = v.decode("ascii", "replace")
    if not text.isdigit():
        raise E2DecodeError(f"{where}: PLMN {text!r} is not digits")
    return text


def _int_value(v: RanParamValue, ids: PrbQuotaIds, octets: int, where: str) -> int:
    if not isinstance(v, bytes):
        raise E2DecodeError(f"{where}: {v!r} is not octets")
    if ids.values == "octets":
        if len(v) != octets:
            raise E2DecodeError(f"{where}: expected {octets} octet(s), got {len(v)}")
        return int.from_bytes(v, "big")
    text = v.decode("ascii", "replace")
    if not text.isdigit():
        raise E2DecodeError(f"{where}: {text!r} is not digits")
    return int(text)


# ---------------------------------------------------------------------------------------------
# Weaver compute control (vendor style 1000, action 1)


@dataclass(frozen=True)
class EnvelopeControl:
    """The site SM envelope granted to the RAN (None: no envelope, the RAN may use the whole GPU)
    and the best-effort delay budget in ms (None: unchanged)."""

    envelope_sms: int | None
    be_delay_budget_ms: int | None

    def __post_init__(self) -> None:
        if self.envelope_sms is not None:
            _check_int("envelope_sms", self.envelope_sms, 0, 1 << 20)
        if self.be_delay_budget_ms is not None:
            _check_int("be_delay_budget_ms", self.be_delay_budget_ms, 0, U32)


def envelope_control_header(ue_id: UeId = GnbDuUeId(0)) -> RcControlHeader:
    return RcControlHeader(WEAVER_STYLE, WEAVER_ENVELOPE_ACTION, ue_id)


def build_envelope_control(envelope_sms: int | None, be_delay_budget_ms: int | None) -> RcControlMessage:
    """Style 1000 action 1: param 1 "SM Envelope" (SMs), param 2 "Best-effort delay budget" (ms).
    A None value is sent as an ElementFalse without a value, which the node reads as "none"/"keep"."""
    c = EnvelopeControl(envelope_sms, be_delay_budget_ms)
    return RcControlMessage(
        (
            RanParamElement(WEAVER_PARAM_ENVELOPE, c.envelope_sms),
            RanParamElement(WEAVER_PARAM_BE_DELAY, c.be_delay_budget_ms),
        )
    )


def parse_envelope_control(msg: RcControlMessage) -> EnvelopeControl:
    values = {}
    for pid in (WEAVER_PARAM_ENVELOPE, WEAVER_PARAM_BE_DELAY):
        p = msg.find(pid)
        if not isinstance(p, RanParamElement):
            raise E2DecodeError(f"Weaver envelope control lacks element parameter {pid}")
        if p.value is not None and (isinstance(p.value, bool) or not isinstance(p.value, int)):
            raise E2DecodeError(f"Weaver envelope parameter {pid} is {p.value!r}, not an integer")
        values[pid] = p.value
    try:
        return EnvelopeControl(values[WEAVER_PARAM_ENVELOPE], values[WEAVER_PARAM_BE_DELAY])
    except ValueError as exc:
        raise E2DecodeError(f"Weaver envelope control: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# A realistic definition for the E2 node simulator to advertise


def prb_quota_action(ids: PrbQuotaIds = SRSRAN_IDS) -> RcControlAction:
    """Style 2 action 6 as srsRAN advertises it: every parameter of the tree by ID and name."""
    fields = [f for f in PRB_QUOTA_NAMES if not (ids.layout == "flat" and f in _NESTED_ONLY)]
    params = tuple(RanParamDef(getattr(ids, f), PRB_QUOTA_NAMES[f]) for f in fields)
    return RcControlAction(PRB_QUOTA_ACTION, "Slice-level PRB quota", params)


def weaver_control_style() -> RcControlStyle:
    action = RcControlAction(
        WEAVER_ENVELOPE_ACTION,
        "Site SM envelope",
        (RanParamDef(WEAVER_PARAM_ENVELOPE, "SM Envelope"), RanParamDef(WEAVER_PARAM_BE_DELAY, "Best-effort delay budget")),
    )
    return RcControlStyle(WEAVER_STYLE, "Weaver compute control", (action,))


def node_ran_function_definition(ids: PrbQuotaIds = SRSRAN_IDS, weaver: bool = True) -> RcRanFunctionDefinition:
    """The RC RAN function definition an E2 node (our simulator) advertises: control style 2
    "Radio Resource Allocation Control" with action 6 and the PRB quota parameter names in `ids`,
    plus the Weaver compute-control style when `weaver` is set."""
    styles = [RcControlStyle(PRB_QUOTA_STYLE, "Radio Resource Allocation Control", (prb_quota_action(ids),))]
    if weaver:
        styles.append(weaver_control_style())
    return RcRanFunctionDefinition(control_styles=tuple(styles))
