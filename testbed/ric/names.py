"""E2 node inventory names exactly as OSC's E2 termination derives them from the E2 setup's GlobalE2node-ID.

The rule is `buildRanName` of `RIC-E2-TERMINATION/BuildRunName.h` in o-ran-sc/ric-plt-e2 (read at commit
5aa396f6f43b, 2026-04-10). e2mgr stores the node under that name in the R-NIB, and xApps use it as the
meid of their subscriptions and controls, so a node that any OSC xApp can reach must be named the same way.

- Prefix by node type: gNB `gnb_` (also a gNB with both CU-UP and DU IDs, or none), gNB-CU-UP `gnbc_`, gNB-DU
  `gnbd_`, en-gNB `en_gnb_`, ng-eNB `ng_enB_macro_` / `ng_enB_shortmacro_` / `ng_enB_longmacro_`, eNB
  `enB_macro_` / `enB_home_` / `enB_shortmacro_` / `enB_longmacro_`.
- PLMN: `translatePlmnId` reads the TBCD octets b0 b1 b2 as MCC = b0 low, b0 high, b1 low and MNC = b1
  high, b2 low, b2 high, printed `MCC_MNC`; a filler b1 high nibble (2-digit MNC) prints as `0` followed by
  the two digits. So 001/01 (`00 f1 10`) is `001_001`, and a 3-digit MNC 234 (`00 41 32`) prints `423`:
  OSC prints the third MNC digit first, and so does this module.
- The prefix and PLMN go through `snprintf(plmnId, 20, ...)`: at most 19 characters survive, which cuts the
  long eNB prefixes (`ng_enB_shortmacro_001_001` becomes `ng_enB_shortmacro_0`). Reproduced as is.
- Node ID: `_` and the BIT STRING right-aligned (trailing unused bits dropped) as two lowercase hex digits
  per octet of its encoding: a 22-bit gNB ID 0x19b is `00019b`, a 32-bit one 8 digits.
- Suffix (gNB only): `_<DU ID in hex>` for a gNB-DU, `_<CU-UP ID in hex>` for a gNB-CU-UP, nothing when both
  or neither are present (OSC treats CU+DU as one gNB). en-gNB, ng-eNB and eNB IDs get no suffix.
"""
from __future__ import annotations

from e2sm.e2ap import GlobalE2NodeId, plmn_to_bytes

# (node type, BIT STRING alternative) -> the prefix BuildRunName.h prints before the PLMN
_PREFIX = {
    ("en-gNB", "gNB-ID"): "en_gnb_",
    ("ng-eNB", "enb-ID-macro"): "ng_enB_macro_",
    ("ng-eNB", "enb-ID-shortmacro"): "ng_enB_shortmacro_",
    ("ng-eNB", "enb-ID-longmacro"): "ng_enB_longmacro_",
    ("eNB", "macro-eNB-ID"): "enB_macro_",
    ("eNB", "home-eNB-ID"): "enB_home_",
    ("eNB", "short-Macro-eNB-ID"): "enB_shortmacro_",
    ("eNB", "long-Macro-eNB-ID"): "enB_longmacro_",
}


def _plmn(prefix: str, plmn: bytes) -> str:
    """`translatePlmnId`, including its 20-byte buffer (19 characters and the NUL)."""
    mcc = (plmn[0] & 0x0F, plmn[0] >> 4, plmn[1] & 0x0F)
    mnc1, mnc2, mnc3 = plmn[1] >> 4, plmn[2] & 0x0F, plmn[2] >> 4
    mnc = f"{mnc1}{mnc2}{mnc3}" if mnc1 != 15 else f"0{mnc2}{mnc3}"
    return f"{prefix}{''.join(map(str, mcc))}_{mnc}"[:19]


def _node_bits(value: int, nbits: int) -> str:
    """`translateBitStringToChar`: two hex digits per octet of the BIT STRING, its value right-aligned."""
    octets = (nbits + 7) // 8
    return f"_{value:0{2 * octets}x}"


def ran_name(node_id: GlobalE2NodeId) -> str:
    """The RAN inventory name OSC's E2T (and so e2mgr and the R-NIB) gives the node with this global ID."""
    plmn = plmn_to_bytes(node_id.plmn)
    if node_id.node_type != "gNB":
        return _plmn(_PREFIX[(node_id.node_type, node_id.choice)], plmn) + _node_bits(node_id.gnb_id,
                                                                                       node_id.gnb_id_bits)
    du, cu = node_id.du_id, node_id.cu_up_id
    prefix = "gnbc_" if cu is not None and du is None else "gnbd_" if du is not None and cu is None else "gnb_"
    name = _plmn(prefix, plmn) + _node_bits(node_id.gnb_id, node_id.gnb_id_bits)
    if prefix == "gnbc_":
        name += f"_{cu:x}"
    elif prefix == "gnbd_":
        name += f"_{du:x}"
    return name
