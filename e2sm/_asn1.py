"""The E2SM ASN.1 modules compiled with asn1tools (aligned PER), once per process, and the two calls
every E2SM codec goes through.

`decode(module, type_name, data)` is the only place untrusted E2SM bytes meet asn1tools: it caps the
input size, decodes with constraint checks, insists that the whole input was consumed (APER pads the
last octet with zero bits, so the bit count rounds up to exactly `len(data)`), and turns every
failure - asn1tools errors, IndexError, RecursionError from a hostile nesting depth, anything - into
`E2DecodeError` naming the type and what went wrong. `encode` does the same for values, raising
`E2EncodeError`.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import asn1tools
from asn1tools.codecs import per

from e2sm.errors import E2DecodeError, E2EncodeError

ASN1_DIR = Path(__file__).resolve().parent.parent / "schemas" / "asn1"
COMMON = "e2sm-common-v2.asn"

# Module token (as in the vectors' `kind`) -> the .asn files that make it up.
MODULE_FILES: dict[str, tuple[str, ...]] = {
    "kpm-v2.03": (COMMON, "e2sm-kpm-v02.03.asn"),
    "kpm-v3.00": (COMMON, "e2sm-kpm-v03.00.asn"),
    # v4.00 imports Beam-ID, which only the v5.00 common module has (as srsRAN's oran-sc-ric compiles it)
    "kpm-v4.00": ("e2sm-common-v5.00.asn", "e2sm-kpm-v04.00.asn"),
    "rc-v1.03": (COMMON, "e2sm-rc-v01.03.asn"),
}

# Top-level types: what travels inside an E2AP OCTET STRING for each module.
TOP_LEVEL_TYPES: dict[str, tuple[str, ...]] = {
    "kpm-v2.03": (
        "E2SM-KPM-EventTriggerDefinition",
        "E2SM-KPM-ActionDefinition",
        "E2SM-KPM-IndicationHeader",
        "E2SM-KPM-IndicationMessage",
        "E2SM-KPM-RANfunction-Description",
    ),
    "kpm-v3.00": (
        "E2SM-KPM-EventTriggerDefinition",
        "E2SM-KPM-ActionDefinition",
        "E2SM-KPM-IndicationHeader",
        "E2SM-KPM-IndicationMessage",
        "E2SM-KPM-RANfunction-Description",
    ),
    "kpm-v4.00": (
        "E2SM-KPM-EventTriggerDefinition",
        "E2SM-KPM-ActionDefinition",
        "E2SM-KPM-IndicationHeader",
        "E2SM-KPM-IndicationMessage",
        "E2SM-KPM-RANfunction-Description",
    ),
    "rc-v1.03": (
        "E2SM-RC-ControlHeader",
        "E2SM-RC-ControlMessage",
        "E2SM-RC-ControlOutcome",
        "E2SM-RC-RANFunctionDefinition",
    ),
}

# Largest E2SM payload accepted. Real indications are a few kB (10 x 100 records is 3.4 kB); the cap
# bounds the memory and time a hostile length field can cost (every list element eats >= 1 bit).
MAX_PAYLOAD = 128 * 1024

_lock = threading.Lock()
_specs: dict[str, Any] = {}


def spec(module: str) -> Any:
    """The compiled asn1tools specification for `module` (compiled on first use, then shared)."""
    compiled = _specs.get(module)
    if compiled is not None:
        return compiled
    if module not in MODULE_FILES:
        raise KeyError(f"unknown E2SM module {module!r}; known: {', '.join(MODULE_FILES)}")
    with _lock:
        compiled = _specs.get(module)
        if compiled is None:
            files = [str(ASN1_DIR / name) for name in MODULE_FILES[module]]
            compiled = asn1tools.compile_files(files, "per")
            _specs[module] = compiled
    return compiled


def per_type(module: str, type_name: str) -> Any:
    """The asn1tools PER type object for `type_name` (walked by `e2sm.jsonform`)."""
    try:
        return spec(module).types[type_name].type
    except KeyError:
        raise KeyError(f"{module} has no top-level type {type_name!r}") from None


def decode(module: str, type_name: str, data: bytes) -> Any:
    """Decode APER `data` as `type_name` of `module`; raises only `E2DecodeError`."""
    where = f"{module}:{type_name}"
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise E2DecodeError(f"expected bytes, got {type(data).__name__}", where)
    data = bytes(data)
    if not data:
        raise E2DecodeError("empty input", where)
    if len(data) > MAX_PAYLOAD:
        raise E2DecodeError(f"input is {len(data)} bytes, over the {MAX_PAYLOAD}-byte cap", where)
    compiled = spec(module).types[type_name]
    decoder = per.Decoder(bytearray(data))
    try:
        value = compiled.type.decode(decoder)
        compiled.check_constraints(value)
    except RecursionError:
        raise E2DecodeError("nesting too deep", where) from None
    except Exception as exc:  # asn1tools raises many types (DecodeError, IndexError, KeyError...)
        raise E2DecodeError(f"{_describe(exc)} after {decoder.number_of_read_bits()} bits", where) from exc
    bits = decoder.number_of_read_bits()
    used = (bits + 7) // 8
    if used != len(data):
        raise E2DecodeError(f"{len(data) - used} trailing bytes after a {used}-byte value", where)
    if bits % 8 and data[-1] & ((1 << (8 - bits % 8)) - 1):
        raise E2DecodeError("non-zero padding bits after the value", where)
    return value


def encode(module: str, type_name: str, value: Any) -> bytes:
    """Encode an asn1tools value as APER, checking constraints; raises only `E2EncodeError`."""
    where = f"{module}:{type_name}"
    try:
        return spec(module).encode(type_name, value, check_constraints=True)
    except RecursionError:
        raise E2EncodeError("nesting too deep", where) from None
    except Exception as exc:
        raise E2EncodeError(_describe(exc), where) from exc


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."
