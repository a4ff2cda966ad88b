"""E2SM-KPM v02.03 / v03.00: typed messages and their APER codecs.

Every message is a frozen dataclass validated when built. `encode_*(obj, version)` and
`decode_*(data, version)` take the KPM version explicitly: it is a property of the E2 node (from its
RAN function OID, `kpm_version_from_oid`, plus any per-node override), never guessed from bytes.

The two versions differ only in TimeStamp (4 octets in v2.03, 8 in v3.00), which appears only in the
indication header. So event triggers, action definitions, indication messages and RAN function
descriptions are the same bytes under both versions, and decoding them is version-independent. The
header is where a mismatch bites (srsRAN advertises the v2 OID and sends 8-octet timestamps): a
header decoded under the wrong version either leaves bytes over, runs out of data, or yields
implausible strings, and all three raise `E2DecodeError` naming a probable version mismatch.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from e2sm import _asn1
from e2sm.common import NrCgi, UeId, check_ue_id, ue_id_from_asn1
from e2sm.errors import E2DecodeError, E2EncodeError
from e2sm.memo import setup_memo

KPM_OID_V2 = "1.3.6.1.4.1.53148.1.2.2.2"
KPM_OID_V3 = "1.3.6.1.4.1.53148.1.3.2.2"
# v4.00 by the same pattern (version arc 4). Inferred, not read from the specification PDF: the published v4.00
# ASN.1 module still carries the version3 arc in its own module OID, so that text cannot settle it.
KPM_OID_V4 = "1.3.6.1.4.1.53148.1.4.2.2"
# How a RAN function is recognised as E2SM-KPM (by OID prefix, e2-facts section 5): v2.0x, v3.00, v4.00
KPM_OID_PREFIXES = ("1.3.6.1.4.1.53148.1.2.2", "1.3.6.1.4.1.53148.1.3.2", "1.3.6.1.4.1.53148.1.4.2")
U32 = (1 << 32) - 1


class KpmVersion(enum.Enum):
    V2_03 = "kpm-v2.03"
    V3_00 = "kpm-v3.00"
    V4_00 = "kpm-v4.00"  # 8-octet TimeStamp like v3.00; adds extension additions only (same bytes without them)

    @property
    def module(self) -> str:
        return self.value

    @property
    def timestamp_octets(self) -> int:
        return 4 if self is KpmVersion.V2_03 else 8


def kpm_version_from_oid(oid: str) -> KpmVersion:
    """KPM version from a RAN function OID (matched by prefix, as e2-facts section 5 advises)."""
    if oid == KPM_OID_V2 or oid.startswith("1.3.6.1.4.1.53148.1.2.2"):
        return KpmVersion.V2_03
    if oid == KPM_OID_V3 or oid.startswith("1.3.6.1.4.1.53148.1.3.2"):
        return KpmVersion.V3_00
    if oid == KPM_OID_V4 or oid.startswith("1.3.6.1.4.1.53148.1.4.2"):
        return KpmVersion.V4_00
    raise ValueError(f"{oid!r} is not an E2SM-KPM OID")


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")


def _check_printable(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, str) or not lo <= len(value) <= hi or not _is_printable(value):
        raise ValueError(f"{name} must be a PrintableString of {lo}..{hi} chars, got {value!r}")


_PRINTABLE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?")


def _is_printable(text: str) -> bool:
    return all(c in _PRINTABLE for c in text)


def _check_type(name: str, value: Any, types: type | tuple[type, ...]) -> None:
    if not isinstance(value, types):
        raise ValueError(f"{name} must be {getattr(types, '__name__', types)}, got {value!r}")


def _tuple(name: str, value: Any, lo: int = 1) -> tuple:
    if not isinstance(value, tuple) or len(value) < lo:
        raise ValueError(f"{name} must be a tuple of at least {lo} items, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Building blocks


@dataclass(frozen=True)
class Snssai:
    """S-NSSAI: slice/service type (1 octet) and optional slice differentiator (3 octets)."""

    sst: int = 1
    sd: int | None = None

    def __post_init__(self) -> None:
        _check_int("SST", self.sst, 0, 255)
        if self.sd is not None:
            _check_int("SD", self.sd, 0, (1 << 24) - 1)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"sST": bytes([self.sst])}
        if self.sd is not None:
            v["sD"] = self.sd.to_bytes(3, "big")
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> Snssai:
        sd = v.get("sD")
        return cls(v["sST"][0], int.from_bytes(sd, "big") if sd is not None else None)


# MeasurementLabel components besides noLabel and sliceID (asn1tools would silently drop unknown keys);
# the last three are the module's extension additions (after its "...").
LABEL_COMPONENTS = (
    "plmnID", "fiveQI", "qFI", "qCI", "qCImax", "qCImin", "aRPmax", "aRPmin", "bitrateRange", "layerMU-MIMO", "sUM",
    "distBinX", "distBinY", "distBinZ", "preLabelOverride", "startEndInd", "min", "max", "avg",
    "ssbIndex", "nonGoB-BFmode-Index", "mIMO-mode-Index",
)


@dataclass(frozen=True)
class MeasLabel:
    """A measurement label. `MeasLabel()` is noLabel; `snssai` is the per-slice label.

    `other` keeps any further MeasurementLabel components a node sends (fiveQI, plmnID, ...) as
    (component name, asn1tools value) pairs, so that decoding loses nothing and re-encodes exactly.
    """

    snssai: Snssai | None = None
    other: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.snssai is not None and not isinstance(self.snssai, Snssai):
            raise ValueError(f"snssai must be a Snssai, got {self.snssai!r}")
        if not isinstance(self.other, tuple) or any(
            not isinstance(p, tuple) or len(p) != 2 or p[0] not in LABEL_COMPONENTS for p in self.other
        ):
            raise ValueError(f"other must be (name, value) pairs with names from {LABEL_COMPONENTS}, got {self.other!r}")

    @property
    def is_no_label(self) -> bool:
        return self.snssai is None and not self.other

    def to_asn1(self) -> dict:
        if self.is_no_label:
            return {"noLabel": "true"}
        v: dict[str, Any] = {}
        if self.snssai is not None:
            v["sliceID"] = self.snssai.to_asn1()
        v.update(self.other)
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> MeasLabel:
        snssai = Snssai.from_asn1(v["sliceID"]) if "sliceID" in v else None
        other = tuple((k, x) for k, x in v.items() if k not in ("noLabel", "sliceID"))
        return cls(snssai, other)


def _meas_type_to_asn1(name: str | int) -> tuple[str, Any]:
    return ("measID", name) if isinstance(name, int) else ("measName", name)


def _check_meas_type(name: Any) -> None:
    if isinstance(name, int) and not isinstance(name, bool):
        _check_int("measID", name, 1, 65536)
    else:
        _check_printable("measName", name, 1, 150)


@dataclass(frozen=True)
class MeasInfo:
    """One requested/reported measurement: TS 28.552 name (or a numeric measID) plus labels."""

    name: str | int
    labels: tuple[MeasLabel, ...] = (MeasLabel(),)

    def __post_init__(self) -> None:
        _check_meas_type(self.name)
        for lab in _tuple("labels", self.labels):
            if not isinstance(lab, MeasLabel):
                raise ValueError(f"labels must hold MeasLabel, got {lab!r}")

    def to_asn1(self) -> dict:
        return {
            "measType": _meas_type_to_asn1(self.name),
            "labelInfoList": [{"measLabel": lab.to_asn1()} for lab in self.labels],
        }

    @classmethod
    def from_asn1(cls, v: dict) -> MeasInfo:
        return cls(v["measType"][1], tuple(MeasLabel.from_asn1(i["measLabel"]) for i in v["labelInfoList"]))


def _bin_value_to_asn1(x: int | float) -> tuple[str, Any]:
    return ("valueReal", x) if isinstance(x, float) else ("valueInt", x)


def _bin_value_from_asn1(v: tuple[str, Any]) -> int | float:
    kind, x = v
    if kind == "valueInt":
        return x
    if kind == "valueReal":
        return float(x)
    raise E2DecodeError("unknown BinRangeValue extension alternative")


@dataclass(frozen=True)
class BinRange:
    """BinRangeItem: bin `index` covers start..end; an int bound is valueInt, a float valueReal."""

    index: int
    start: int | float
    end: int | float

    def __post_init__(self) -> None:
        _check_int("binIndex", self.index, 1, 65535)
        for name in ("start", "end"):
            x = getattr(self, name)
            # A bound is a number a node reports; NaN or infinity would poison any comparison with it.
            if isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, float) and not math.isfinite(x)):
                raise ValueError(f"bin {name} must be an int or a finite float, got {x!r}")

    def to_asn1(self) -> dict:
        return {"binIndex": self.index, "startValue": _bin_value_to_asn1(self.start),
                "endValue": _bin_value_to_asn1(self.end)}

    @classmethod
    def from_asn1(cls, v: dict) -> BinRange:
        return cls(v["binIndex"], _bin_value_from_asn1(v["startValue"]), _bin_value_from_asn1(v["endValue"]))


@dataclass(frozen=True)
class BinRangeDef:
    """BinRangeDefinition of a distribution measurement: the X bins, and Y / Z bins when it has them."""

    x: tuple[BinRange, ...]
    y: tuple[BinRange, ...] | None = None
    z: tuple[BinRange, ...] | None = None

    def __post_init__(self) -> None:
        for axis in ("x", "y", "z"):
            bins = getattr(self, axis)
            if bins is None and axis != "x":
                continue
            for b in _tuple(f"bin range list {axis}", bins):
                _check_type(f"bin range list {axis}", b, BinRange)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"binRangeListX": [b.to_asn1() for b in self.x]}
        for axis, key in (("y", "binRangeListY"), ("z", "binRangeListZ")):
            bins = getattr(self, axis)
            if bins is not None:
                v[key] = [b.to_asn1() for b in bins]
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> BinRangeDef:
        def axis(key: str) -> tuple[BinRange, ...] | None:
            bins = v.get(key)
            return tuple(BinRange.from_asn1(b) for b in bins) if bins is not None else None

        return cls(tuple(BinRange.from_asn1(b) for b in v["binRangeListX"]), axis("binRangeListY"), axis("binRangeListZ"))


@dataclass(frozen=True)
class DistMeasBinRange:
    """DistMeasurementBinRangeItem (action definition format 1): one distribution measurement's bins."""

    name: str | int
    bins: BinRangeDef

    def __post_init__(self) -> None:
        _check_meas_type(self.name)
        _check_type("bins", self.bins, BinRangeDef)

    def to_asn1(self) -> dict:
        return {"measType": _meas_type_to_asn1(self.name), "binRangeDef": self.bins.to_asn1()}

    @classmethod
    def from_asn1(cls, v: dict) -> DistMeasBinRange:
        return cls(v["measType"][1], BinRangeDef.from_asn1(v["binRangeDef"]))


@dataclass(frozen=True)
class TestCond:
    """TestCondInfo: a test type (e.g. "gBR", "sNSSAI"), optional expression and value.

    `value` is (alternative, value) as in TestCond-Value, e.g. ("valueInt", 5), because valueInt and
    valueEnum are both integers and only the alternative tells them apart.
    """

    test_type: str
    expr: str | None = None
    value: tuple[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.test_type, str):
            raise ValueError("test_type must be a string")
        if self.expr is not None and not isinstance(self.expr, str):
            raise ValueError(f"expr must be a string or None, got {self.expr!r}")
        if self.value is not None and (not isinstance(self.value, tuple) or len(self.value) != 2
                                       or not isinstance(self.value[0], str)):
            raise ValueError(f"value must be (alternative, value) or None, got {self.value!r}")

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"testType": (self.test_type, "true")}
        if self.expr is not None:
            v["testExpr"] = self.expr
        if self.value is not None:
            v["testValue"] = self.value
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> TestCond:
        kind, _ = v["testType"]
        if kind is None:
            raise E2DecodeError("unknown TestCond-Type extension alternative")
        value = v.get("testValue")
        if value is not None and value[0] is None:
            raise E2DecodeError("unknown TestCond-Value extension alternative")
        return cls(kind, v.get("testExpr"), value)


@dataclass(frozen=True)
class OrNext:
    """A matching condition sent with logicalOR present: it is combined with the condition after it by
    OR rather than AND (MatchingCondItem and, in action definition format 4, MatchingUeCondPerSubItem)."""

    cond: MeasLabel | TestCond

    def __post_init__(self) -> None:
        _check_type("cond", self.cond, (MeasLabel, TestCond))


MatchCond = MeasLabel | TestCond | OrNext


def _logical_or(v: dict) -> bool:
    flag = v.get("logicalOR")
    if flag is not None and flag != "true":
        raise E2DecodeError("unknown LogicalOR extension value")
    return flag is not None


def _match_cond_to_asn1(c: MatchCond) -> dict:
    inner = c.cond if isinstance(c, OrNext) else c
    choice = ("measLabel", inner.to_asn1()) if isinstance(inner, MeasLabel) else ("testCondInfo", inner.to_asn1())
    v: dict[str, Any] = {"matchingCondChoice": choice}
    if isinstance(c, OrNext):
        v["logicalOR"] = "true"
    return v


def _match_cond_from_asn1(v: dict) -> MatchCond:
    kind, body = v["matchingCondChoice"]
    if kind == "measLabel":
        cond: MeasLabel | TestCond = MeasLabel.from_asn1(body)
    elif kind == "testCondInfo":
        cond = TestCond.from_asn1(body)
    else:
        raise E2DecodeError("unknown MatchingCondItem-Choice extension alternative")
    return OrNext(cond) if _logical_or(v) else cond


def _check_conds(conds: Any) -> None:
    for c in _tuple("matching conditions", conds):
        if not isinstance(c, (MeasLabel, TestCond, OrNext)):
            raise ValueError(f"a matching condition must be MeasLabel, TestCond or OrNext, got {c!r}")


@dataclass(frozen=True)
class MeasCond:
    """MeasurementCondItem (action definition format 3): a measurement, its matching conditions and,
    for a distribution measurement, its bins."""

    name: str | int
    conds: tuple[MatchCond, ...]
    bins: BinRangeDef | None = None

    def __post_init__(self) -> None:
        _check_meas_type(self.name)
        _check_conds(self.conds)
        if self.bins is not None:
            _check_type("bins", self.bins, BinRangeDef)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"measType": _meas_type_to_asn1(self.name),
                             "matchingCond": [_match_cond_to_asn1(c) for c in self.conds]}
        if self.bins is not None:
            v["binRangeDef"] = self.bins.to_asn1()
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> MeasCond:
        bins = v.get("binRangeDef")
        return cls(v["measType"][1], tuple(_match_cond_from_asn1(c) for c in v["matchingCond"]),
                   BinRangeDef.from_asn1(bins) if bins is not None else None)


@dataclass(frozen=True)
class MeasCondUe:
    """MeasurementCondUEidItem (indication message format 2): conditions plus the matching UEs.

    `ue_ids_per_gp` is MatchingUEidPerGP: the UEs matched in each granularity period of the report,
    in order; an empty tuple is that period's noUEmatched.
    """

    name: str | int
    conds: tuple[MatchCond, ...]
    ue_ids: tuple[UeId, ...] | None = None
    ue_ids_per_gp: tuple[tuple[UeId, ...], ...] | None = None

    def __post_init__(self) -> None:
        _check_meas_type(self.name)
        _check_conds(self.conds)
        if self.ue_ids is not None:
            for u in _tuple("ue_ids", self.ue_ids):
                check_ue_id("ue_ids", u)
        if self.ue_ids_per_gp is not None:
            for period in _tuple("ue_ids_per_gp", self.ue_ids_per_gp):
                for u in _tuple("ue_ids_per_gp item", period, lo=0):
                    check_ue_id("ue_ids_per_gp", u)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {
            "measType": _meas_type_to_asn1(self.name),
            "matchingCond": [_match_cond_to_asn1(c) for c in self.conds],
        }
        if self.ue_ids is not None:
            v["matchingUEidList"] = [{"ueID": u.to_asn1()} for u in self.ue_ids]
        if self.ue_ids_per_gp is not None:
            v["matchingUEidPerGP"] = [
                {"matchedPerGP": ("oneOrMoreUEmatched", [{"ueID": u.to_asn1()} for u in p]) if p
                 else ("noUEmatched", "true")}
                for p in self.ue_ids_per_gp
            ]
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> MeasCondUe:
        ues = v.get("matchingUEidList")
        per_gp = v.get("matchingUEidPerGP")
        return cls(
            v["measType"][1],
            tuple(_match_cond_from_asn1(c) for c in v["matchingCond"]),
            tuple(ue_id_from_asn1(u["ueID"]) for u in ues) if ues is not None else None,
            tuple(_matched_per_gp(p["matchedPerGP"]) for p in per_gp) if per_gp is not None else None,
        )


def _matched_per_gp(v: tuple[str, Any]) -> tuple[UeId, ...]:
    kind, body = v
    if kind == "noUEmatched" and body == "true":
        return ()
    if kind == "oneOrMoreUEmatched":
        return tuple(ue_id_from_asn1(u["ueID"]) for u in body)
    raise E2DecodeError("unknown MatchingUEidPerGP-Item extension alternative or value")


# ---------------------------------------------------------------------------------------------
# Event trigger


@dataclass(frozen=True)
class KpmEventTrigger:
    """Event trigger format 1: report every `period_ms` milliseconds."""

    period_ms: int

    def __post_init__(self) -> None:
        _check_int("reportingPeriod", self.period_ms, 1, U32)


@setup_memo
def encode_event_trigger(obj: KpmEventTrigger, version: KpmVersion) -> bytes:
    _expect(obj, KpmEventTrigger, version, "E2SM-KPM-EventTriggerDefinition")
    value = {"eventDefinition-formats": ("eventDefinition-Format1", {"reportingPeriod": obj.period_ms})}
    return _asn1.encode(version.module, "E2SM-KPM-EventTriggerDefinition", value)


@setup_memo
def decode_event_trigger(data: bytes, version: KpmVersion) -> KpmEventTrigger:
    v = _asn1.decode(version.module, "E2SM-KPM-EventTriggerDefinition", data)
    kind, body = v["eventDefinition-formats"]
    if kind != "eventDefinition-Format1":
        raise E2DecodeError("unknown event trigger format", "E2SM-KPM-EventTriggerDefinition")
    return KpmEventTrigger(body["reportingPeriod"])


# ---------------------------------------------------------------------------------------------
# Action definition


@dataclass(frozen=True)
class ActionDefFormat1:
    """Node-level measurements (report style 1)."""

    meas: tuple[MeasInfo, ...]
    granul_period_ms: int
    cell_global_id: NrCgi | None = None
    dist_bins: tuple[DistMeasBinRange, ...] | None = None    # distMeasBinRangeInfo (an extension addition)

    def __post_init__(self) -> None:
        for m in _tuple("meas", self.meas):
            if not isinstance(m, MeasInfo):
                raise ValueError(f"meas must hold MeasInfo, got {m!r}")
        _check_int("granulPeriod", self.granul_period_ms, 1, U32)
        if self.cell_global_id is not None and not isinstance(self.cell_global_id, NrCgi):
            raise ValueError("cell_global_id must be an NrCgi")
        if self.dist_bins is not None:
            for d in _tuple("dist_bins", self.dist_bins):
                _check_type("dist_bins", d, DistMeasBinRange)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"measInfoList": [m.to_asn1() for m in self.meas], "granulPeriod": self.granul_period_ms}
        if self.cell_global_id is not None:
            v["cellGlobalID"] = self.cell_global_id.to_asn1()
        if self.dist_bins is not None:
            v["distMeasBinRangeInfo"] = [d.to_asn1() for d in self.dist_bins]
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> ActionDefFormat1:
        cgi = v.get("cellGlobalID")
        dist = v.get("distMeasBinRangeInfo")
        return cls(
            tuple(MeasInfo.from_asn1(m) for m in v["measInfoList"]),
            v["granulPeriod"],
            NrCgi.from_asn1(cgi) if cgi is not None else None,
            tuple(DistMeasBinRange.from_asn1(d) for d in dist) if dist is not None else None,
        )


@dataclass(frozen=True)
class ActionDefFormat2:
    """One UE's measurements (report style 2)."""

    ue_id: UeId
    subscription: ActionDefFormat1

    def __post_init__(self) -> None:
        check_ue_id("ue_id", self.ue_id)
        _check_type("subscription", self.subscription, ActionDefFormat1)

    def to_asn1(self) -> dict:
        return {"ueID": self.ue_id.to_asn1(), "subscriptInfo": self.subscription.to_asn1()}

    @classmethod
    def from_asn1(cls, v: dict) -> ActionDefFormat2:
        return cls(ue_id_from_asn1(v["ueID"]), ActionDefFormat1.from_asn1(v["subscriptInfo"]))


@dataclass(frozen=True)
class ActionDefFormat3:
    """Condition-based, UE-level measurements (report style 3)."""

    conds: tuple[MeasCond, ...]
    granul_period_ms: int
    cell_global_id: NrCgi | None = None

    def __post_init__(self) -> None:
        for c in _tuple("conds", self.conds):
            if not isinstance(c, MeasCond):
                raise ValueError(f"conds must hold MeasCond, got {c!r}")
        _check_int("granulPeriod", self.granul_period_ms, 1, U32)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"measCondList": [c.to_asn1() for c in self.conds], "granulPeriod": self.granul_period_ms}
        if self.cell_global_id is not None:
            v["cellGlobalID"] = self.cell_global_id.to_asn1()
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> ActionDefFormat3:
        cgi = v.get("cellGlobalID")
        return cls(
            tuple(MeasCond.from_asn1(c) for c in v["measCondList"]),
            v["granulPeriod"],
            NrCgi.from_asn1(cgi) if cgi is not None else None,
        )


@dataclass(frozen=True)
class ActionDefFormat4:
    """Measurements of every UE matching common conditions (report style 4)."""

    ue_conds: tuple[TestCond | OrNext, ...]      # OrNext here wraps a TestCond (logicalOR present)
    subscription: ActionDefFormat1

    def __post_init__(self) -> None:
        for c in _tuple("ue_conds", self.ue_conds):
            if not isinstance(c.cond if isinstance(c, OrNext) else c, TestCond):
                raise ValueError(f"ue_conds must hold TestCond or OrNext(TestCond), got {c!r}")
        _check_type("subscription", self.subscription, ActionDefFormat1)

    def to_asn1(self) -> dict:
        def item(c: TestCond | OrNext) -> dict:
            if isinstance(c, OrNext):
                return {"testCondInfo": c.cond.to_asn1(), "logicalOR": "true"}
            return {"testCondInfo": c.to_asn1()}

        return {"matchingUeCondList": [item(c) for c in self.ue_conds], "subscriptionInfo": self.subscription.to_asn1()}

    @classmethod
    def from_asn1(cls, v: dict) -> ActionDefFormat4:
        def item(c: dict) -> TestCond | OrNext:
            cond = TestCond.from_asn1(c["testCondInfo"])
            return OrNext(cond) if _logical_or(c) else cond

        return cls(
            tuple(item(c) for c in v["matchingUeCondList"]),
            ActionDefFormat1.from_asn1(v["subscriptionInfo"]),
        )


@dataclass(frozen=True)
class ActionDefFormat5:
    """Measurements of a list of UEs (report style 5; the standard needs at least 2 UE IDs)."""

    ue_ids: tuple[UeId, ...]
    subscription: ActionDefFormat1

    def __post_init__(self) -> None:
        for u in _tuple("ue_ids", self.ue_ids, lo=2):
            check_ue_id("ue_ids", u)
        _check_type("subscription", self.subscription, ActionDefFormat1)

    def to_asn1(self) -> dict:
        return {
            "matchingUEidList": [{"ueID": u.to_asn1()} for u in self.ue_ids],
            "subscriptionInfo": self.subscription.to_asn1(),
        }

    @classmethod
    def from_asn1(cls, v: dict) -> ActionDefFormat5:
        return cls(
            tuple(ue_id_from_asn1(u["ueID"]) for u in v["matchingUEidList"]),
            ActionDefFormat1.from_asn1(v["subscriptionInfo"]),
        )


ActionDefFormat = ActionDefFormat1 | ActionDefFormat2 | ActionDefFormat3 | ActionDefFormat4 | ActionDefFormat5
_ACTION_FORMATS: dict[type, str] = {
    ActionDefFormat1: "actionDefinition-Format1",
    ActionDefFormat2: "actionDefinition-Format2",
    ActionDefFormat3: "actionDefinition-Format3",
    ActionDefFormat4: "actionDefinition-Format4",
    ActionDefFormat5: "actionDefinition-Format5",
}
_ACTION_FORMAT_BY_NAME = {name: cls for cls, name in _ACTION_FORMATS.items()}


@dataclass(frozen=True)
class KpmActionDefinition:
    """RIC action definition: report style plus one of the five formats (style N uses format N)."""

    style: int
    format: ActionDefFormat

    def __post_init__(self) -> None:
        _check_int("ric-Style-Type", self.style, -(1 << 31), (1 << 31) - 1)
        if type(self.format) not in _ACTION_FORMATS:
            raise ValueError(f"format must be ActionDefFormat1..5, got {self.format!r}")


@setup_memo
def encode_action_definition(obj: KpmActionDefinition, version: KpmVersion) -> bytes:
    _expect(obj, KpmActionDefinition, version, "E2SM-KPM-ActionDefinition")
    value = {
        "ric-Style-Type": obj.style,
        "actionDefinition-formats": (_ACTION_FORMATS[type(obj.format)], obj.format.to_asn1()),
    }
    return _asn1.encode(version.module, "E2SM-KPM-ActionDefinition", value)


@setup_memo
def decode_action_definition(data: bytes, version: KpmVersion) -> KpmActionDefinition:
    v = _asn1.decode(version.module, "E2SM-KPM-ActionDefinition", data)
    kind, body = v["actionDefinition-formats"]
    cls = _ACTION_FORMAT_BY_NAME.get(kind)
    if cls is None:
        raise E2DecodeError("unknown action definition format", "E2SM-KPM-ActionDefinition")
    return _typed(lambda: KpmActionDefinition(v["ric-Style-Type"], cls.from_asn1(body)), "E2SM-KPM-ActionDefinition")


# ---------------------------------------------------------------------------------------------
# Indication header


@dataclass(frozen=True)
class KpmIndicationHeader:
    """Indication header format 1.

    `collect_start_time` is the TimeStamp octets read as one unsigned big-endian integer: in v3.00
    64-bit NTP (seconds since 1900 in the high 32 bits, fraction in the low 32), in v2.03 32 bits.
    """

    collect_start_time: int
    file_format_version: str | None = None
    sender_name: str | None = None
    sender_type: str | None = None
    vendor_name: str | None = None

    def __post_init__(self) -> None:
        _check_int("colletStartTime", self.collect_start_time, 0, (1 << 64) - 1)
        for name, value, hi in (
            ("fileFormatversion", self.file_format_version, 15),
            ("senderName", self.sender_name, 400),
            ("senderType", self.sender_type, 8),
            ("vendorName", self.vendor_name, 32),
        ):
            if value is not None:
                _check_printable(name, value, 0, hi)


_HEADER_STRINGS = (
    ("fileFormatversion", "file_format_version"),
    ("senderName", "sender_name"),
    ("senderType", "sender_type"),
    ("vendorName", "vendor_name"),
)


# Windows a real 8-octet TimeStamp falls in, for dates 2000..2036 (NTP) or 2000..2100 (Unix epoch):
# nodes fill it as 64-bit NTP (srsRAN, the vectors), as Unix seconds in the low octets, or as Unix
# milli/micro/nanoseconds (FlexRIC uses microseconds). A v2.03 header misread as v3.00 puts string
# octets into the low half and usually lands outside all of them.
_NTP_2000 = 3155673600
_UNIX_2000, _UNIX_2100 = 946684800, 4102444800
_TS64_WINDOWS = tuple((_UNIX_2000 * k, _UNIX_2100 * k) for k in (10**3, 10**6, 10**9))


def plausible_timestamp(value: int, version: KpmVersion) -> bool:
    """Whether `value` is a TimeStamp some real node would send under `version`."""
    if value < 0 or value >= 1 << (8 * version.timestamp_octets):
        return False
    if version is KpmVersion.V2_03 or value < 1 << 32:
        return True
    return value >> 32 >= _NTP_2000 or any(lo <= value < hi for lo, hi in _TS64_WINDOWS)


_FAST_KPM: Any = None


def _readers() -> Any:
    """`e2sm._fast_kpm`, imported on first use: it builds this module's dataclasses, and it loads numba,
    which a process that never decodes a KPM message should not pay for. Called through the module each
    time, so tests can swap its readers. (A local import on every decode cost a tenth of a header's.) The
    callers catch `fast.Unsupported` from it, so importing this module loads neither the readers nor, through
    `e2sm._fast`, E2AP's pycrate tables."""
    global _FAST_KPM
    if _FAST_KPM is None:
        from e2sm import _fast_kpm
        _FAST_KPM = _fast_kpm
    return _FAST_KPM


def encode_indication_header(obj: KpmIndicationHeader, version: KpmVersion) -> bytes:
    _expect(obj, KpmIndicationHeader, version, "E2SM-KPM-IndicationHeader")
    n = version.timestamp_octets
    if not plausible_timestamp(obj.collect_start_time, version):
        raise E2EncodeError(
            f"colletStartTime {obj.collect_start_time:#x} is not a plausible {n}-octet TimeStamp of {version.module}"
            " (64-bit NTP, or Unix s/ms/us/ns)",
            "E2SM-KPM-IndicationHeader",
        )
    fast = _readers()
    try:
        return fast.encode_indication_header(obj, version)  # asn1tools' exact bytes, for validated values
    except fast.Unsupported:
        pass
    body: dict[str, Any] = {"colletStartTime": obj.collect_start_time.to_bytes(n, "big")}
    for asn_name, attr in _HEADER_STRINGS:
        value = getattr(obj, attr)
        if value is not None:
            body[asn_name] = value
    value = {"indicationHeader-formats": ("indicationHeader-Format1", body)}
    return _asn1.encode(version.module, "E2SM-KPM-IndicationHeader", value)


def decode_indication_header(data: bytes, version: KpmVersion) -> KpmIndicationHeader:
    header = _decode_header(data, version)
    if version.timestamp_octets == 8:
        # A v2.03 header whose first strings happen to be short can also parse as a plausible v3.00
        # one (about 2% of random v2 headers), while v3.00 bytes almost never parse as v2.03 (none in
        # 20,000 random headers). So bytes that are *also* a valid v2.03 header are far more likely a
        # v2.03 header sent to a node configured as v3.00 than a real v3.00 header.
        if not _also_a_v2_header(data):
            return header
        raise E2DecodeError(
            "bytes are also a valid kpm-v2.03 header; probable KPM version mismatch (node configured as kpm-v3.00)",
            "E2SM-KPM-IndicationHeader",
        )
    return header


def _also_a_v2_header(data: bytes) -> bool:
    fast = _readers()
    try:
        verdict = fast.reads_as_v2_header(data)
    except fast.Unsupported:         # not bytes: the reference names the type
        verdict = None
    if verdict is not None:
        return verdict
    try:
        _decode_header(data, KpmVersion.V2_03)
    except E2DecodeError:
        return False
    return True


def _decode_header(data: bytes, version: KpmVersion) -> KpmIndicationHeader:
    fast = _readers()
    try:
        header = fast.decode_indication_header(data, version)
    except fast.Unsupported:
        header = _decode_header_reference(data, version, _mismatch_hint(version))
    # Plausibility, on the typed value so that both paths apply it. (Strings are PrintableString on
    # both: the fast reader declines others, the reference path refuses them naming the mismatch.)
    if not plausible_timestamp(header.collect_start_time, version):
        raise E2DecodeError(f"colletStartTime {header.collect_start_time:#x} is not a plausible TimeStamp; "
                            f"{_mismatch_hint(version)}", "E2SM-KPM-IndicationHeader")
    return header


def _mismatch_hint(version: KpmVersion) -> str:
    """The error text's hint, built only for an error (it cost a sixth of a header's decode on every one)."""
    other = KpmVersion.V3_00 if version is KpmVersion.V2_03 else KpmVersion.V2_03
    return (f"probable KPM version mismatch: decoded as {version.module} "
            f"({version.timestamp_octets}-octet TimeStamp); the node may send {other.module}")


def _decode_header_reference(data: bytes, version: KpmVersion, hint: str) -> KpmIndicationHeader:
    where = "E2SM-KPM-IndicationHeader"
    try:
        v = _asn1.decode(version.module, where, data)
    except E2DecodeError as exc:
        raise E2DecodeError(f"{exc}; {hint}") from exc
    kind, body = v["indicationHeader-formats"]
    if kind != "indicationHeader-Format1":
        raise E2DecodeError(f"unknown indication header format; {hint}", where)
    for asn_name, _ in _HEADER_STRINGS:  # before the constructor, whose refusal would not name the cause
        text = body.get(asn_name)
        if text is not None and not _is_printable(text):
            raise E2DecodeError(f"{asn_name} {text[:40]!r} is not a PrintableString; {hint}", where)
    try:
        return KpmIndicationHeader(
            int.from_bytes(body["colletStartTime"], "big"), *(body.get(n) for n, _ in _HEADER_STRINGS)
        )
    except ValueError as exc:  # e.g. an extended-size string the typed header does not carry
        raise E2DecodeError(f"{exc}; {hint}", where) from None


# ---------------------------------------------------------------------------------------------
# Indication message

MeasValue = int | float | None


def _check_records(records: Any) -> None:
    for rec in _tuple("records", records):
        for x in _tuple("a record", rec):
            if x is None:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise ValueError(f"a measurement value must be int, float or None, got {x!r}")
            if isinstance(x, int):
                _check_int("integer measurement", x, 0, U32)


def _record_item(x: MeasValue) -> tuple[str, Any]:
    if x is None:
        return ("noValue", None)
    if isinstance(x, int):
        return ("integer", x)
    return ("real", x)


def _record_value(item: tuple[str, Any]) -> MeasValue:
    kind, x = item
    if kind == "integer":
        return x
    if kind == "real":
        return float(x)
    if kind == "noValue":
        return None
    raise E2DecodeError("unknown MeasurementRecordItem extension alternative")


def _meas_data_to_asn1(records: tuple, incomplete: tuple[int, ...]) -> list:
    out = []
    for i, rec in enumerate(records):
        item: dict[str, Any] = {"measRecord": [_record_item(x) for x in rec]}
        if i in incomplete:
            item["incompleteFlag"] = "true"
        out.append(item)
    return out


def _meas_data_from_asn1(v: list) -> tuple[tuple, tuple[int, ...]]:
    records = tuple(tuple(_record_value(x) for x in item["measRecord"]) for item in v)
    incomplete = tuple(i for i, item in enumerate(v) if "incompleteFlag" in item)
    return records, incomplete


def _check_incomplete(incomplete: Any, n: int) -> None:
    if not isinstance(incomplete, tuple) or any(
        not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n for i in incomplete
    ):
        raise ValueError(f"incomplete must be a tuple of record indices < {n}, got {incomplete!r}")


@dataclass(frozen=True)
class IndicationMessageFormat1:
    """Measurement records (one per granularity period; the i-th value belongs to the i-th
    measurement), the measurement list if the node sends it, the granularity period, and the indices
    of records flagged incomplete."""

    records: tuple[tuple[MeasValue, ...], ...]
    meas_info: tuple[MeasInfo, ...] | None = None
    granul_period_ms: int | None = None
    incomplete: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_records(self.records)
        if self.meas_info is not None:
            for m in _tuple("meas_info", self.meas_info):
                if not isinstance(m, MeasInfo):
                    raise ValueError(f"meas_info must hold MeasInfo, got {m!r}")
        if self.granul_period_ms is not None:
            _check_int("granulPeriod", self.granul_period_ms, 1, U32)
        _check_incomplete(self.incomplete, len(self.records))

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"measData": _meas_data_to_asn1(self.records, self.incomplete)}
        if self.meas_info is not None:
            v["measInfoList"] = [m.to_asn1() for m in self.meas_info]
        if self.granul_period_ms is not None:
            v["granulPeriod"] = self.granul_period_ms
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> IndicationMessageFormat1:
        records, incomplete = _meas_data_from_asn1(v["measData"])
        info = v.get("measInfoList")
        return cls(
            records,
            tuple(MeasInfo.from_asn1(m) for m in info) if info is not None else None,
            v.get("granulPeriod"),
            incomplete,
        )

    def columns(self) -> dict[str | int, tuple[MeasValue, ...]]:
        """Values per measurement name (needs `meas_info`): {name: (value per record, ...)}."""
        if self.meas_info is None:
            raise ValueError("no measInfoList in this message; take the names from the action definition")
        return {m.name: tuple(rec[i] if i < len(rec) else None for rec in self.records) for i, m in enumerate(self.meas_info)}


@dataclass(frozen=True)
class IndicationMessageFormat2:
    """Condition-based, UE-level measurement records (style 3)."""

    records: tuple[tuple[MeasValue, ...], ...]
    cond_ue: tuple[MeasCondUe, ...]
    granul_period_ms: int | None = None
    incomplete: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_records(self.records)
        for c in _tuple("cond_ue", self.cond_ue):
            if not isinstance(c, MeasCondUe):
                raise ValueError(f"cond_ue must hold MeasCondUe, got {c!r}")
        if self.granul_period_ms is not None:
            _check_int("granulPeriod", self.granul_period_ms, 1, U32)
        _check_incomplete(self.incomplete, len(self.records))

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {
            "measData": _meas_data_to_asn1(self.records, self.incomplete),
            "measCondUEidList": [c.to_asn1() for c in self.cond_ue],
        }
        if self.granul_period_ms is not None:
            v["granulPeriod"] = self.granul_period_ms
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> IndicationMessageFormat2:
        records, incomplete = _meas_data_from_asn1(v["measData"])
        return cls(
            records, tuple(MeasCondUe.from_asn1(c) for c in v["measCondUEidList"]), v.get("granulPeriod"), incomplete
        )


@dataclass(frozen=True)
class UeMeasReport:
    ue_id: UeId
    report: IndicationMessageFormat1

    def __post_init__(self) -> None:
        check_ue_id("ue_id", self.ue_id)
        _check_type("report", self.report, IndicationMessageFormat1)


@dataclass(frozen=True)
class IndicationMessageFormat3:
    """Per-UE format-1 reports (styles 4 and 5)."""

    reports: tuple[UeMeasReport, ...]

    def __post_init__(self) -> None:
        for r in _tuple("reports", self.reports):
            if not isinstance(r, UeMeasReport):
                raise ValueError(f"reports must hold UeMeasReport, got {r!r}")

    def to_asn1(self) -> dict:
        return {"ueMeasReportList": [{"ueID": r.ue_id.to_asn1(), "measReport": r.report.to_asn1()} for r in self.reports]}

    @classmethod
    def from_asn1(cls, v: dict) -> IndicationMessageFormat3:
        return cls(
            tuple(
                UeMeasReport(ue_id_from_asn1(r["ueID"]), IndicationMessageFormat1.from_asn1(r["measReport"]))
                for r in v["ueMeasReportList"]
            )
        )


KpmIndicationMessage = IndicationMessageFormat1 | IndicationMessageFormat2 | IndicationMessageFormat3
_MESSAGE_FORMATS: dict[type, str] = {
    IndicationMessageFormat1: "indicationMessage-Format1",
    IndicationMessageFormat2: "indicationMessage-Format2",
    IndicationMessageFormat3: "indicationMessage-Format3",
}
_MESSAGE_FORMAT_BY_NAME = {name: cls for cls, name in _MESSAGE_FORMATS.items()}


def encode_indication_message(obj: KpmIndicationMessage, version: KpmVersion) -> bytes:
    _expect(obj, tuple(_MESSAGE_FORMATS), version, "E2SM-KPM-IndicationMessage")
    name = _MESSAGE_FORMATS.get(type(obj))
    if name is None:
        raise E2EncodeError(f"not a KPM indication message: {obj!r}", "E2SM-KPM-IndicationMessage")
    _check_finite_reals(obj)
    fast = _readers()
    try:
        return fast.encode_indication_message(obj, version)  # asn1tools' exact bytes, for validated values
    except fast.Unsupported:
        pass
    value = {"indicationMessage-formats": (name, obj.to_asn1())}
    return _asn1.encode(version.module, "E2SM-KPM-IndicationMessage", value)


def decode_indication_message(data: bytes, version: KpmVersion) -> KpmIndicationMessage:
    fast = _readers()
    try:
        return fast.decode_indication_message(data, version)
    except fast.Unsupported:
        pass  # any shape the fast reader does not handle: the asn1tools reference decides
    v = _asn1.decode(version.module, "E2SM-KPM-IndicationMessage", data)
    kind, body = v["indicationMessage-formats"]
    cls = _MESSAGE_FORMAT_BY_NAME.get(kind)
    if cls is None:
        raise E2DecodeError("unknown indication message format", "E2SM-KPM-IndicationMessage")
    return _typed(lambda: cls.from_asn1(body), "E2SM-KPM-IndicationMessage")


def _check_finite_reals(obj: KpmIndicationMessage) -> None:
    # asn1tools encodes inf/nan as REAL special values, but a TS 28.552 counter never is one, and
    # a NaN would make decode(encode(m)) != m; refuse them on the way out.
    reports = obj.reports if isinstance(obj, IndicationMessageFormat3) else ()
    all_records = [obj.records] if not reports else [r.report.records for r in reports]
    for records in all_records:
        for rec in records:
            for x in rec:
                if isinstance(x, float) and not math.isfinite(x):
                    raise E2EncodeError(f"measurement value {x} is not finite", "E2SM-KPM-IndicationMessage")


# ---------------------------------------------------------------------------------------------
# RAN function description


@dataclass(frozen=True)
class ReportableMeas:
    """MeasurementInfo-Action-Item: a measurement a report style offers."""

    name: str
    meas_id: int | None = None
    bins: BinRangeDef | None = None     # binRangeDef (an extension addition): a distribution's bins

    def __post_init__(self) -> None:
        _check_printable("measName", self.name, 1, 150)
        if self.meas_id is not None:
            _check_int("measID", self.meas_id, 1, 65536)
        if self.bins is not None:
            _check_type("bins", self.bins, BinRangeDef)

    def to_asn1(self) -> dict:
        v: dict[str, Any] = {"measName": self.name}
        if self.meas_id is not None:
            v["measID"] = self.meas_id
        if self.bins is not None:
            v["binRangeDef"] = self.bins.to_asn1()
        return v

    @classmethod
    def from_asn1(cls, v: dict) -> ReportableMeas:
        bins = v.get("binRangeDef")
        return cls(v["measName"], v.get("measID"), BinRangeDef.from_asn1(bins) if bins is not None else None)


@dataclass(frozen=True)
class KpmReportStyle:
    style: int
    name: str
    action_format: int
    meas: tuple[ReportableMeas, ...]
    header_format: int = 1
    message_format: int = 1

    def __post_init__(self) -> None:
        _check_printable("ric-ReportStyle-Name", self.name, 1, 150)
        for m in _tuple("meas", self.meas):
            _check_type("meas", m, ReportableMeas)
        for f in ("style", "action_format", "header_format", "message_format"):
            _check_int(f, getattr(self, f), -(1 << 31), (1 << 31) - 1)

    @property
    def meas_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.meas)


@dataclass(frozen=True)
class KpmEventTriggerStyle:
    style: int = 1
    name: str = "Periodic Report"
    format: int = 1

    def __post_init__(self) -> None:
        _check_printable("ric-EventTriggerStyle-Name", self.name, 1, 150)
        _check_int("style", self.style, -(1 << 31), (1 << 31) - 1)
        _check_int("format", self.format, -(1 << 31), (1 << 31) - 1)


@dataclass(frozen=True)
class KpmRanFunctionDescription:
    """What a node's KPM RAN function offers: the report styles and the measurements of each."""

    oid: str = KPM_OID_V3
    short_name: str = "ORAN-E2SM-KPM"
    description: str = "KPM Monitor"
    instance: int | None = None
    event_trigger_styles: tuple[KpmEventTriggerStyle, ...] | None = (KpmEventTriggerStyle(),)
    report_styles: tuple[KpmReportStyle, ...] | None = ()

    def __post_init__(self) -> None:
        _check_printable("ranFunction-ShortName", self.short_name, 1, 150)
        _check_printable("ranFunction-E2SM-OID", self.oid, 1, 1000)
        _check_printable("ranFunction-Description", self.description, 1, 150)
        if self.instance is not None:
            _check_int("ranFunction-Instance", self.instance, -(1 << 31), (1 << 31) - 1)
        for s in _tuple("event_trigger_styles", self.event_trigger_styles or (), lo=0):
            _check_type("event_trigger_styles", s, KpmEventTriggerStyle)
        for s in _tuple("report_styles", self.report_styles or (), lo=0):
            _check_type("report_styles", s, KpmReportStyle)

    def report_style(self, style: int) -> KpmReportStyle | None:
        return next((s for s in self.report_styles or () if s.style == style), None)


@setup_memo
def encode_ran_function_description(obj: KpmRanFunctionDescription, version: KpmVersion) -> bytes:
    _expect(obj, KpmRanFunctionDescription, version, "E2SM-KPM-RANfunction-Description")
    name: dict[str, Any] = {
        "ranFunction-ShortName": obj.short_name,
        "ranFunction-E2SM-OID": obj.oid,
        "ranFunction-Description": obj.description,
    }
    if obj.instance is not None:
        name["ranFunction-Instance"] = obj.instance
    value: dict[str, Any] = {"ranFunction-Name": name}
    # An empty tuple means "none": the lists are SIZE(1..), so send the component absent.
    if obj.event_trigger_styles:
        value["ric-EventTriggerStyle-List"] = [
            {
                "ric-EventTriggerStyle-Type": s.style,
                "ric-EventTriggerStyle-Name": s.name,
                "ric-EventTriggerFormat-Type": s.format,
            }
            for s in obj.event_trigger_styles
        ]
    if obj.report_styles:
        value["ric-ReportStyle-List"] = [
            {
                "ric-ReportStyle-Type": s.style,
                "ric-ReportStyle-Name": s.name,
                "ric-ActionFormat-Type": s.action_format,
                "measInfo-Action-List": [m.to_asn1() for m in s.meas],
                "ric-IndicationHeaderFormat-Type": s.header_format,
                "ric-IndicationMessageFormat-Type": s.message_format,
            }
            for s in obj.report_styles
        ]
    return _asn1.encode(version.module, "E2SM-KPM-RANfunction-Description", value)


@setup_memo
def decode_ran_function_description(data: bytes, version: KpmVersion) -> KpmRanFunctionDescription:
    v = _asn1.decode(version.module, "E2SM-KPM-RANfunction-Description", data)

    def build() -> KpmRanFunctionDescription:
        n = v["ranFunction-Name"]
        ets = v.get("ric-EventTriggerStyle-List")
        rs = v.get("ric-ReportStyle-List")
        return KpmRanFunctionDescription(
            oid=n["ranFunction-E2SM-OID"],
            short_name=n["ranFunction-ShortName"],
            description=n["ranFunction-Description"],
            instance=n.get("ranFunction-Instance"),
            event_trigger_styles=tuple(
                KpmEventTriggerStyle(
                    s["ric-EventTriggerStyle-Type"], s["ric-EventTriggerStyle-Name"], s["ric-EventTriggerFormat-Type"]
                )
                for s in ets
            )
            if ets is not None
            else (),
            report_styles=tuple(
                KpmReportStyle(
                    s["ric-ReportStyle-Type"],
                    s["ric-ReportStyle-Name"],
                    s["ric-ActionFormat-Type"],
                    tuple(ReportableMeas.from_asn1(m) for m in s["measInfo-Action-List"]),
                    s["ric-IndicationHeaderFormat-Type"],
                    s["ric-IndicationMessageFormat-Type"],
                )
                for s in rs
            )
            if rs is not None
            else (),
        )

    return _typed(build, "E2SM-KPM-RANfunction-Description")


def _expect(obj: Any, cls: type | tuple[type, ...], version: Any, where: str) -> None:
    if not isinstance(obj, cls):
        raise E2EncodeError(f"cannot encode {type(obj).__name__} here", where)
    if not isinstance(version, KpmVersion):
        raise E2EncodeError(f"version must be a KpmVersion, got {version!r}", where)


def _typed(build: Any, where: str) -> Any:
    """Run a dataclass constructor over decoded values: a validation failure there means the bytes
    carried something the typed API refuses (e.g. non-printable names), so report it as a decode
    error rather than letting ValueError escape."""
    try:
        return build()
    except E2DecodeError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise E2DecodeError(f"decoded value rejected: {exc}", where) from exc
