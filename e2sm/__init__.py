"""E2 codecs: E2AP (`e2sm.e2ap`), E2SM-KPM v2.03/v3.00/v4.00 (`e2sm.kpm`) and E2SM-RC v1.03 (`e2sm.rc`).

Pure and sans-IO: functions from bytes to frozen dataclasses and back. Every decoder of untrusted
bytes returns a value or raises `E2DecodeError`; encoders refuse bad values with `E2EncodeError`.
`decode_json` / `encode_json` speak the JSON form of `tests/vectors/README.md` for any kind
(`python -m e2sm kinds` lists them).
"""
from e2sm.errors import E2DecodeError, E2EncodeError
from e2sm.jsonform import decode_json, encode_json, kinds
from e2sm.kpm import KPM_OID_V2, KPM_OID_V3, KPM_OID_V4, KpmVersion, kpm_version_from_oid
from e2sm.rc import RC_OID

__all__ = [
    "E2DecodeError",
    "E2EncodeError",
    "KPM_OID_V2",
    "KPM_OID_V3",
    "KPM_OID_V4",
    "KpmVersion",
    "RC_OID",
    "decode_json",
    "encode_json",
    "kinds",
    "kpm_version_from_oid",
]
