"""Typed forms of the E2SM-COMMON-IEs that KPM and RC share: PLMN identity, NR cell global ID and
the UE ID alternatives seen in practice (gNB-DU-UEID from srsRAN/oran-sc-ric, gNB-UEID from FlexRIC).

Each class converts to and from the asn1tools value of its ASN.1 type (`to_asn1` / `from_asn1`).
`from_asn1` only sees values that asn1tools already decoded under constraint checks, so it raises
`E2DecodeError` just for alternatives Weaver does not model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from e2sm.errors import E2DecodeError

U32 = (1 << 32) - 1


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")


def plmn_to_bcd(plmn: str) -> bytes:
    """"00101" (MCC 001, MNC 01) -> 00 f1 10, the 3-octet TBCD form of TS 38.413 PLMN Identity."""
    if not isinstance(plmn, str) or len(plmn) not in (5, 6) or not plmn.isdigit():
        raise ValueError(f"PLMN must be 5 or 6 digits (MCC+MNC), got {plmn!r}")
    mcc, mnc = plmn[:3], plmn[3:]
    d = [int(c) for c in mcc] + [int(c) for c in mnc]
    mnc3 = d[5] if len(mnc) == 3 else 0xF
    return bytes([(d[1] << 4) | d[0], (mnc3 << 4) | d[2], (d[4] << 4) | d[3]])


def plmn_from_bcd(data: bytes) -> str:
    """Inverse of `plmn_to_bcd`; raises E2DecodeError on non-BCD nibbles."""
    if len(data) != 3:
        raise E2DecodeError(f"PLMN identity must be 3 octets, got {len(data)}")
    n = [data[0] & 0xF, data[0] >> 4, data[1] & 0xF, data[2] & 0xF, data[2] >> 4, data[1] >> 4]
    if any(x > 9 for x in n[:5]) or (n[5] > 9 and n[5] != 0xF):
        raise E2DecodeError(f"PLMN identity {data.hex()} is not BCD")
    digits = "".join(str(x) for x in n[:5])
    return digits + (str(n[5]) if n[5] != 0xF else "")


@dataclass(frozen=True)
class NrCgi:
    """NR cell global ID: PLMN plus the 36-bit NR cell identity."""

    plmn: str = "00101"
    cell_id: int = 0

    def __post_init__(self) -> None:
        plmn_to_bcd(self.plmn)
        _check_int("NR cell identity", self.cell_id, 0, (1 << 36) - 1)

    def to_asn1(self) -> tuple[str, dict]:
        bits = (self.cell_id << 4).to_bytes(5, "big")
        return ("nR-CGI", {"pLMNIdentity": plmn_to_bcd(self.plmn), "nRCellIdentity": (bits, 36)})

    @classmethod
    def from_asn1(cls, value: tuple[str, dict]) -> NrCgi:
        kind, body = value
        if kind != "nR-CGI":
            raise E2DecodeError(f"cell global ID {kind!r} is not supported (only nR-CGI)")
        bits, _ = body["nRCellIdentity"]
        return cls(plmn_from_bcd(body["pLMNIdentity"]), int.from_bytes(bits[:5], "big") >> 4)


@dataclass(frozen=True)
class GnbDuUeId:
    """UEID gNB-DU-UEID: the gNB-CU UE F1AP ID (srsRAN names the UE this way), optional RAN UE ID."""

    f1ap_id: int = 0
    ran_ue_id: bytes | None = None

    def __post_init__(self) -> None:
        _check_int("gNB-CU-UE-F1AP-ID", self.f1ap_id, 0, U32)
        if self.ran_ue_id is not None and (not isinstance(self.ran_ue_id, bytes) or len(self.ran_ue_id) != 8):
            raise ValueError("ran_ue_id must be 8 bytes")

    def to_asn1(self) -> tuple[str, dict]:
        body: dict[str, Any] = {"gNB-CU-UE-F1AP-ID": self.f1ap_id}
        if self.ran_ue_id is not None:
            body["ran-UEID"] = self.ran_ue_id
        return ("gNB-DU-UEID", body)


@dataclass(frozen=True)
class GnbUeId:
    """UEID gNB-UEID: AMF UE NGAP ID plus GUAMI (the form FlexRIC examples use)."""

    amf_ue_ngap_id: int = 0
    plmn: str = "00101"
    amf_region_id: int = 0
    amf_set_id: int = 0
    amf_pointer: int = 0

    def __post_init__(self) -> None:
        _check_int("AMF-UE-NGAP-ID", self.amf_ue_ngap_id, 0, (1 << 40) - 1)
        plmn_to_bcd(self.plmn)
        _check_int("AMF region ID", self.amf_region_id, 0, 255)
        _check_int("AMF set ID", self.amf_set_id, 0, 1023)
        _check_int("AMF pointer", self.amf_pointer, 0, 63)

    def to_asn1(self) -> tuple[str, dict]:
        guami = {
            "pLMNIdentity": plmn_to_bcd(self.plmn),
            "aMFRegionID": (bytes([self.amf_region_id]), 8),
            "aMFSetID": ((self.amf_set_id << 6).to_bytes(2, "big"), 10),
            "aMFPointer": (bytes([self.amf_pointer << 2]), 6),
        }
        return ("gNB-UEID", {"amf-UE-NGAP-ID": self.amf_ue_ngap_id, "guami": guami})


UeId = GnbDuUeId | GnbUeId
UE_ID_TYPES = (GnbDuUeId, GnbUeId)


def check_ue_id(name: str, value: Any) -> None:
    if not isinstance(value, UE_ID_TYPES):
        raise ValueError(f"{name} must be a GnbDuUeId or GnbUeId, got {value!r}")


def ue_id_from_asn1(value: tuple[str, Any]) -> UeId:
    kind, body = value
    if kind == "gNB-DU-UEID":
        return GnbDuUeId(body["gNB-CU-UE-F1AP-ID"], body.get("ran-UEID"))
    if kind == "gNB-UEID":
        extra = set(body) - {"amf-UE-NGAP-ID", "guami"}
        if extra:
            raise E2DecodeError(f"gNB-UEID carries {sorted(extra)}, which Weaver does not model")
        g = body["guami"]
        return GnbUeId(
            body["amf-UE-NGAP-ID"],
            plmn_from_bcd(g["pLMNIdentity"]),
            g["aMFRegionID"][0][0],
            int.from_bytes(g["aMFSetID"][0][:2], "big") >> 6,
            g["aMFPointer"][0][0] >> 2,
        )
    raise E2DecodeError(f"UE ID alternative {kind!r} is not supported (gNB-DU-UEID, gNB-UEID are)")
