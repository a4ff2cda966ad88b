"""R-NIB writer: what e2mgr stores in SDL when an E2 node completes E2 setup.

Real xApps read the RAN inventory from the SDL namespace `e2Manager` through ricxappframe's R-NIB
helpers (`GetNodeb`, `GetListNodebIds`, `GetRanFunctionDefinition`), so the mini-RIC writes the same
keys with the same protobuf payloads (ricxappframe.entities.rnib, e2mgr's R-NIB entities):

- `RAN:<inventory name>`     -> `NodebInfo` (serialized protobuf): ran name, connection status,
  global NB id, node type GNB, and `gnb.ran_functions[]` {id, definition, revision, OID}.
- `GNB:<plmn hex>:<nb id>`   -> `NbIdentity` (serialized protobuf).
- set `GNB`                  -> members are serialized `NbIdentity` (what `get_list_gnb_ids` reads).

`ran_function_definition` is a protobuf *string*, so the APER bytes are stored as upper-case hex
text, as e2mgr stores the XER rendering of the OCTET STRING. Decode with `bytes.fromhex`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ricxappframe.entities.rnib import nb_identity_pb2, nodeb_info_pb2
from ricxappframe.xapp_sdl import SDLWrapper

NAMESPACE = "e2Manager"


@dataclass(frozen=True)
class RanFunctionRecord:
    """One RAN function as the node advertised it in E2 setup."""

    ran_function_id: int
    definition: bytes
    revision: int
    oid: str


@dataclass(frozen=True)
class NodeRecord:
    """A gNB(-DU) as the R-NIB knows it."""

    inventory_name: str
    plmn: str  # digits, e.g. "00101" (MCC 001, MNC 01)
    gnb_id: int
    gnb_id_bits: int
    ran_functions: tuple[RanFunctionRecord, ...]
    e2t_address: str = ""
    ip: str = ""
    port: int = 0

    @property
    def plmn_hex(self) -> str:
        return plmn_to_hex(self.plmn)

    @property
    def nb_id(self) -> str:
        # e2mgr renders the gNB-ID BIT STRING as its bits, most significant first.
        return format(self.gnb_id, f"0{self.gnb_id_bits}b")


def plmn_to_hex(plmn: str) -> str:
    """TS 38.413 PLMN Identity: 3 BCD octets, MNC filler 0xF for a 2-digit MNC ("00101" -> "00F110")."""
    if not plmn.isdigit() or len(plmn) not in (5, 6):
        raise ValueError(f"PLMN must be 5 or 6 digits, got {plmn!r}")
    d = [int(c) for c in plmn]
    mcc, mnc = d[:3], d[3:]
    mnc3 = mnc[2] if len(mnc) == 3 else 0xF
    octets = bytes([(mcc[1] << 4) | mcc[0], (mnc3 << 4) | mcc[2], (mnc[1] << 4) | mnc[0]])
    return octets.hex().upper()


def _identity(node: NodeRecord, status: int) -> nb_identity_pb2.NbIdentity:
    ident = nb_identity_pb2.NbIdentity()
    ident.inventory_name = node.inventory_name
    ident.global_nb_id.plmn_id = node.plmn_hex
    ident.global_nb_id.nb_id = node.nb_id
    ident.connection_status = status
    return ident


def nodeb_info(node: NodeRecord, connected: bool = True) -> nodeb_info_pb2.NodebInfo:
    """The `RAN:<name>` value for `node`."""
    info = nodeb_info_pb2.NodebInfo()
    info.ran_name = node.inventory_name
    info.ip = node.ip
    info.port = node.port
    info.connection_status = nb_identity_pb2.CONNECTED if connected else nb_identity_pb2.DISCONNECTED
    info.global_nb_id.plmn_id = node.plmn_hex
    info.global_nb_id.nb_id = node.nb_id
    info.node_type = nodeb_info_pb2.Node.GNB
    info.associated_e2t_instance_address = node.e2t_address
    info.setup_from_network = True
    info.gnb.gnb_type = 1  # entities.GnbType.GNB
    for rf in node.ran_functions:
        item = info.gnb.ran_functions.add()
        item.ran_function_id = rf.ran_function_id
        item.ran_function_definition = rf.definition.hex().upper()
        item.ran_function_revision = rf.revision
        item.ran_function_oid = rf.oid
    return info


class RnibWriter:
    """Writes and updates R-NIB entries; `sdl` is ricxappframe's SDLWrapper (Redis via DBAAS_*, or fake)."""

    def __init__(self, sdl: SDLWrapper) -> None:
        self._sdl = sdl
        self._members: dict[str, bytes] = {}  # inventory name -> NbIdentity bytes now in the GNB set

    def _replace_member(self, name: str, member: bytes) -> None:
        old = self._members.pop(name, None)
        if old is not None and old != member:
            self._sdl.remove_member(NAMESPACE, "GNB", old, usemsgpack=False)
        self._sdl.add_member(NAMESPACE, "GNB", member, usemsgpack=False)
        self._members[name] = member

    def node_connected(self, node: NodeRecord) -> None:
        """E2 setup succeeded: store the node and its RAN functions as CONNECTED."""
        self._write(node, connected=True)

    def node_disconnected(self, node: NodeRecord) -> None:
        """The association is gone: keep the entry (as e2mgr does) but mark it DISCONNECTED."""
        self._write(node, connected=False)

    def _write(self, node: NodeRecord, connected: bool) -> None:
        status = nb_identity_pb2.CONNECTED if connected else nb_identity_pb2.DISCONNECTED
        ident = _identity(node, status).SerializeToString()
        self._sdl.set(NAMESPACE, f"RAN:{node.inventory_name}", nodeb_info(node, connected).SerializeToString(),
                      usemsgpack=False)
        self._sdl.set(NAMESPACE, f"GNB:{node.plmn_hex}:{node.nb_id}", ident, usemsgpack=False)
        self._replace_member(node.inventory_name, ident)


def read_nodeb(sdl: SDLWrapper, inventory_name: str) -> nodeb_info_pb2.NodebInfo | None:
    """Read back `RAN:<name>` (what ricxappframe's `GetNodeb` does), for tests and tools."""
    raw = sdl.get(NAMESPACE, f"RAN:{inventory_name}", usemsgpack=False)
    if raw is None:
        return None
    info = nodeb_info_pb2.NodebInfo()
    info.ParseFromString(raw)
    return info
