"""E2 node discovery: the R-NIB in SDL namespace `e2Manager` (as e2mgr, and the testbed's mini-RIC, write
it: `RAN:<inventory name>` -> NodebInfo protobuf with `gnb.ran_functions[]`, definitions as hex text),
or the static list in config. Service models are matched by OID, never by short name or function ID
(e2-facts §5): KPM `1.3.6.1.4.1.53148.1.2.2.*` / `.1.3.2.*` / `.1.4.2.*` (v4.00), RC `1.3.6.1.4.1.53148.1.1.2.3`.
"""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError
from ricxappframe.entities.rnib import nb_identity_pb2, nodeb_info_pb2

from e2sm import kpm
from xapp.config import E2Config

NAMESPACE = "e2Manager"
KPM_OID_PREFIXES = kpm.KPM_OID_PREFIXES  # v2.0x, v3.00 and v4.00
RC_OID = "1.3.6.1.4.1.53148.1.1.2.3"


@dataclass(frozen=True, kw_only=True)
class RanFunction:
    ran_function_id: int
    oid: str
    definition: bytes
    revision: int = 0


@dataclass(frozen=True, kw_only=True)
class E2Node:
    meid: str
    connected: bool
    functions: tuple[RanFunction, ...] = ()
    envelope: bool = False       # static config's claim that the node takes the Weaver envelope control

    @property
    def kpm(self) -> RanFunction | None:
        return next((f for f in self.functions if f.oid.startswith(KPM_OID_PREFIXES)), None)

    @property
    def rc(self) -> RanFunction | None:
        return next((f for f in self.functions if f.oid == RC_OID), None)


def parse_nodeb(raw: bytes) -> E2Node:
    """One `RAN:<name>` value -> E2Node; ValueError for bytes that are not a NodebInfo."""
    info = nodeb_info_pb2.NodebInfo()
    try:
        info.ParseFromString(raw)
    except DecodeError as exc:
        raise ValueError(f"R-NIB entry is not a NodebInfo: {exc}") from None
    funcs = []
    for f in info.gnb.ran_functions:
        try:
            definition = bytes.fromhex(f.ran_function_definition)
        except ValueError:
            # e2mgr stores hex text; tolerate a raw-bytes writer rather than dropping the node
            definition = f.ran_function_definition.encode("latin-1", "replace")
        funcs.append(RanFunction(ran_function_id=f.ran_function_id, oid=f.ran_function_oid, definition=definition,
                                 revision=f.ran_function_revision))
    return E2Node(meid=info.ran_name, connected=info.connection_status == nb_identity_pb2.CONNECTED,
                  functions=tuple(funcs))


def read_rnib(sdl) -> tuple[list[E2Node], list[str]]:
    """All nodes in the R-NIB and a list of problems (unreadable entries are reported, not fatal)."""
    nodes, problems = [], []
    for key, raw in sorted(sdl.find_and_get(NAMESPACE, "RAN:", usemsgpack=False).items()):
        try:
            nodes.append(parse_nodeb(raw))
        except ValueError as exc:
            problems.append(f"{key}: {exc}")
    return nodes, problems


def static_nodes(e2: E2Config) -> list[E2Node]:
    """Nodes from config (no definitions: the RC IDs fall back to the configured table)."""
    out = []
    for n in e2.static_nodes:
        funcs = [RanFunction(ran_function_id=n.kpm_function_id, oid=n.kpm_oid, definition=b"")]
        if n.rc_function_id is not None:
            funcs.append(RanFunction(ran_function_id=n.rc_function_id, oid=RC_OID, definition=b""))
        out.append(E2Node(meid=n.meid, connected=True, functions=tuple(funcs), envelope=n.envelope))
    return out
