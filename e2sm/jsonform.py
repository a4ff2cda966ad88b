"""The JSON form of `tests/vectors/README.md` <-> asn1tools values, by walking the ASN.1 type.

| ASN.1            | JSON                                  | asn1tools value      |
|------------------|---------------------------------------|----------------------|
| SEQUENCE / SET   | object, component names as keys      | dict                 |
| SEQUENCE OF      | array                                 | list                 |
| CHOICE           | object with one key, the alternative  | (name, value)        |
| INTEGER, BOOLEAN | number, true/false                    | int, bool            |
| ENUMERATED       | identifier string                     | str                  |
| NULL             | null                                  | None                 |
| REAL             | number                                | float                |
| OCTET STRING     | lowercase hex                         | bytes                |
| BIT STRING       | {"bitstring": hex, "length": bits}    | (bytes, bits)        |
| character string | string                                | str                  |

`to_json` reads values that asn1tools decoded (so it trusts their shapes, except for unknown
extension alternatives, which it refuses with E2DecodeError). `from_json` reads JSON written by a
person and checks every node against the type, raising E2EncodeError with the JSON path.

The JSON codec says what the bytes hold under the named module (constraints checked, all input
consumed); the semantic checks - TimeStamp plausibility, a v3.00 header that also parses as v2.03 -
belong to the typed API (`e2sm.kpm`), which the xApp uses. A header that fails to decode here still
gets a "probable KPM version mismatch" hint.

`decode_json(kind, data)` / `encode_json(kind, value)` are the generic codec for kinds
`kpm-v2.03:<Type>`, `kpm-v3.00:<Type>`, `rc-v1.03:<Type>` and `e2ap:E2AP-PDU` (delegated to
`e2sm.e2ap`).
"""
from __future__ import annotations

import math
from typing import Any

from asn1tools.codecs import per

from e2sm import _asn1
from e2sm.errors import E2DecodeError, E2EncodeError

E2AP_KIND = "e2ap:E2AP-PDU"

_STRING_TYPES = (per.KnownMultiplierStringType, per.StringType, per.UTF8String)


def kinds() -> list[str]:
    """Every kind the generic codec accepts, E2AP included."""
    out = [E2AP_KIND]
    for module, types in _asn1.TOP_LEVEL_TYPES.items():
        out.extend(f"{module}:{t}" for t in types)
    return out


def _split(kind: str, error: type[ValueError]) -> tuple[str, str]:
    module, sep, type_name = kind.partition(":") if isinstance(kind, str) else ("", "", "")
    if not sep or module not in _asn1.TOP_LEVEL_TYPES or type_name not in _asn1.TOP_LEVEL_TYPES[module]:
        raise error(f"unknown kind {kind!r}; `python -m e2sm kinds` lists them")
    return module, type_name


def decode_json(kind: str, data: bytes) -> Any:
    """Decode APER bytes of `kind` into the JSON form (dicts/lists/str/numbers)."""
    if kind == E2AP_KIND:
        return _e2ap().decode_json(data)
    module, type_name = _split(kind, E2DecodeError)
    try:
        value = _asn1.decode(module, type_name, data)
    except E2DecodeError as exc:
        if type_name == "E2SM-KPM-IndicationHeader":  # the one KPM type whose bytes differ by version
            other = "kpm-v3.00" if module == "kpm-v2.03" else "kpm-v2.03"
            raise E2DecodeError(f"{exc}; probable KPM version mismatch (try {other})") from exc
        raise
    try:
        return to_json(_asn1.per_type(module, type_name), value, type_name)
    except RecursionError:
        raise E2DecodeError("nesting too deep", kind) from None


def encode_json(kind: str, value: Any) -> bytes:
    """Encode a JSON-form value of `kind` into APER bytes."""
    if kind == E2AP_KIND:
        return _e2ap().encode_json(value)
    module, type_name = _split(kind, E2EncodeError)
    try:
        asn1_value = from_json(_asn1.per_type(module, type_name), value, type_name)
    except RecursionError:
        raise E2EncodeError("nesting too deep", kind) from None
    return _asn1.encode(module, type_name, asn1_value)


def _e2ap() -> Any:
    try:
        from e2sm import e2ap
    except ImportError as exc:
        raise _Unavailable(f"the E2AP codec (e2sm.e2ap) is not available: {exc}") from exc
    if not hasattr(e2ap, "decode_json") or not hasattr(e2ap, "encode_json"):
        raise _Unavailable("the E2AP codec (e2sm.e2ap) has no JSON form yet")
    return e2ap


class _Unavailable(E2DecodeError, E2EncodeError):
    """The kind exists but its codec is not installed: both a decode and an encode error."""


# ---------------------------------------------------------------------------------------------


def _resolve(t: Any) -> Any:
    while isinstance(t, per.Recursive):
        t = t._inner
    return t


def _members(t: Any) -> list:
    out = list(t.root_members)
    for a in t.additions or ():
        out.extend(a.root_members if isinstance(a, per.AdditionGroup) else [a])
    return out


def to_json(t: Any, value: Any, path: str) -> Any:
    t = _resolve(t)
    if isinstance(t, (per.Sequence, per.Set)):
        return {m.name: to_json(m, value[m.name], f"{path}.{m.name}") for m in _members(t) if m.name in value}
    if isinstance(t, (per.SequenceOf, per.SetOf)):
        return [to_json(t.element_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(t, per.Choice):
        name, inner = value
        if name is None:
            raise E2DecodeError("unknown extension alternative of a CHOICE", path)
        member = _choice_member(t, name)
        return {name: to_json(member, inner, f"{path}.{name}")}
    if isinstance(t, per.OctetString):
        return bytes(value).hex()
    if isinstance(t, per.BitString):
        data, length = value
        return {"bitstring": bytes(data).hex(), "length": length}
    if isinstance(t, per.Enumerated):
        if value is None:
            raise E2DecodeError("unknown extension value of an ENUMERATED", path)
        return value
    if isinstance(t, per.Real):
        if not math.isfinite(value):
            raise E2DecodeError(f"REAL {value} has no JSON form", path)
        return value
    if isinstance(t, (per.Integer, per.Boolean, per.Null)) or isinstance(t, _STRING_TYPES):
        return value
    raise E2DecodeError(f"no JSON form for {type(t).__name__}", path)


def _choice_member(t: Any, name: str) -> Any:
    index = t.root_name_to_index.get(name)
    if index is not None:
        return t.root_index_to_member[index]
    if t.additions_name_to_index and name in t.additions_name_to_index:
        return t.additions_index_to_member[t.additions_name_to_index[name]]
    return None


def from_json(t: Any, node: Any, path: str) -> Any:
    t = _resolve(t)
    if isinstance(t, (per.Sequence, per.Set)):
        if not isinstance(node, dict):
            raise E2EncodeError("expected an object", path)
        members = {m.name: m for m in _members(t)}
        unknown = set(node) - set(members)
        if unknown:
            raise E2EncodeError(f"unknown component(s) {sorted(unknown)}; expected some of {list(members)}", path)
        out = {}
        for name, m in members.items():
            if name in node:
                out[name] = from_json(m, node[name], f"{path}.{name}")
            elif not (m.optional or m.default is not None) and m in t.root_members:
                raise E2EncodeError(f"missing mandatory component {name!r}", path)
        return out
    if isinstance(t, (per.SequenceOf, per.SetOf)):
        if not isinstance(node, list):
            raise E2EncodeError("expected an array", path)
        return [from_json(t.element_type, v, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(t, per.Choice):
        if not isinstance(node, dict) or len(node) != 1:
            raise E2EncodeError("expected an object with exactly one key (the CHOICE alternative)", path)
        ((name, inner),) = node.items()
        member = _choice_member(t, name)
        if member is None:
            raise E2EncodeError(f"{name!r} is not an alternative here", path)
        return (name, from_json(member, inner, f"{path}.{name}"))
    if isinstance(t, per.OctetString):
        return _hex(node, path)
    if isinstance(t, per.BitString):
        if not isinstance(node, dict) or set(node) != {"bitstring", "length"}:
            raise E2EncodeError('expected {"bitstring": hex, "length": bits}', path)
        data, length = _hex(node["bitstring"], path + ".bitstring"), node["length"]
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= 8 * len(data):
            raise E2EncodeError(f"length {length!r} does not fit {len(data)} octets", path)
        if len(data) != (length + 7) // 8:
            raise E2EncodeError(f"{length} bits need {(length + 7) // 8} octets, got {len(data)}", path)
        return (data, length)
    if isinstance(t, per.Enumerated):
        if not isinstance(node, str):
            raise E2EncodeError("expected an ENUMERATED identifier string", path)
        return node
    if isinstance(t, per.Null):
        if node is not None:
            raise E2EncodeError("expected null", path)
        return None
    if isinstance(t, per.Boolean):
        if not isinstance(node, bool):
            raise E2EncodeError("expected true or false", path)
        return node
    if isinstance(t, per.Integer):
        if not isinstance(node, int) or isinstance(node, bool):
            raise E2EncodeError("expected an integer", path)
        return node
    if isinstance(t, per.Real):
        if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
            raise E2EncodeError("expected a finite number", path)
        return float(node)
    if isinstance(t, _STRING_TYPES):
        if not isinstance(node, str):
            raise E2EncodeError("expected a string", path)
        return node
    raise E2EncodeError(f"no JSON form for {type(t).__name__}", path)


def _hex(node: Any, path: str) -> bytes:
    if not isinstance(node, str):
        raise E2EncodeError("expected a hex string", path)
    try:
        return bytes.fromhex(node)
    except ValueError:
        raise E2EncodeError(f"{node[:40]!r} is not hex", path) from None
