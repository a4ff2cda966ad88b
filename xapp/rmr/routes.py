"""RMR route tables (`shared/design/rmr-wire.md` §9): parsing, atomic commit, lookup, round-robin.

Sans-IO: `RouteParser` takes record text (a whole `RMR_SEED_RT` file, or the payload of a route-manager
mtype-20 message) and only ever swaps in a table at a good `newrt|end` / `updatert|end`; `Router` adds the
per-group round-robin cursors and answers "where does this message go".

Dynamic route tables: `updatert|start/end` and `del` records are applied atomically on top of the active
table, so route-manager pushes (mtype 20, records possibly spread over several messages) go through the same
parser via `Router.apply_update`, which returns the `RouteOutcome`s the endpoint acknowledges (mtype 22).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .message import RmrSendError, RmrState

MEID_ROUTE = "%meid"


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """What became of one table at its end marker (a route manager is told, mtype 22)."""

    committed: bool
    table_id: str
    reason: str = ""

    def state_payload(self) -> bytes:
        """The RMRRM_TABLE_STATE payload: `OK <id> \\n` or `ERR <id> <reason>\\n` (rmr-wire.md §9)."""
        return (f"OK {self.table_id} \n" if self.committed else f"ERR {self.table_id} {self.reason}\n").encode()


class RouteTableError(ValueError):
    """A record that cannot be parsed; the table it belongs to will be discarded."""


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """Where (mtype, sub_id) goes: one endpoint per group per send, or by meid through the meid map."""

    mtype: int
    sub_id: int
    groups: tuple[tuple[str, ...], ...] = ()
    by_meid: bool = False


@dataclass(frozen=True, slots=True)
class RouteTable:
    entries: Mapping[tuple[int, int], RouteEntry] = field(default_factory=lambda: MappingProxyType({}))
    table_id: str = ""

    def lookup(self, mtype: int, sub_id: int) -> RouteEntry | None:
        """(S, M) if present, else (-1, M) when S != -1, else None (§9 Lookup)."""
        entry = self.entries.get((sub_id, mtype))
        if entry is None and sub_id != -1:
            entry = self.entries.get((-1, mtype))
        return entry


def _strip_comment(line: str) -> str:
    # '#' starts a comment at the start of a line or after whitespace; elsewhere it is data.
    for i, ch in enumerate(line):
        if ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise RouteTableError(f"{what} {text.strip()!r} is not an integer") from None


class RouteParser:
    """Applies route-table records; holds the committed table and meid map plus anything pending.

    Args:
        self_names: this process's `name:port` and `ip:port` strings; they drive sender filters and are
            removed from groups (one table can be shared by every process).
        table: the table active before this parser (kept when a new one is discarded).
        meid_map: the meid map active before this parser.
    """

    def __init__(self, self_names: frozenset[str] | set[str] = frozenset(), table: RouteTable | None = None,
                 meid_map: Mapping[str, str] | None = None):
        self.self_names = frozenset(self_names)
        self.table = table
        self.meid_map: Mapping[str, str] = MappingProxyType(dict(meid_map or {}))
        self.commits = 0  # route tables committed by this parser
        self.meid_commits = 0
        self.notes: list[str] = []  # discarded tables and skipped records, for the log
        self.outcomes: list[RouteOutcome] = []  # one per table end marker, for route-manager acks
        self._pending: dict[tuple[int, int], RouteEntry] | None = None
        self._pending_kind = ""
        self._pending_id = ""
        self._pending_count = 0
        self._pending_error = ""
        self._meid_pending: dict[str, str] | None = None
        self._meid_count = 0

    def feed(self, text: str) -> None:
        for raw in text.splitlines():
            line = _strip_comment(raw).strip()
            if line:
                self.feed_record(line)

    def feed_record(self, line: str) -> None:
        fields = [f.strip() for f in line.split("|")]
        kind = fields[0]
        try:
            if kind in ("newrt", "updatert"):
                self._table_marker(kind, fields)
            elif kind in ("rte", "mse", "del"):
                self._route_record(kind, fields)
            elif kind == "meid_map":
                self._meid_marker(fields)
            elif kind in ("mme_ar", "mme_del"):
                self._meid_record(kind, fields)
            else:
                self.notes.append(f"unknown record {kind!r} ignored")
        except RouteTableError as exc:
            if kind in ("rte", "mse", "del") and self._pending is not None:
                self._pending_error = self._pending_error or f"{line!r}: {exc}"
            elif kind in ("mme_ar", "mme_del") and self._meid_pending is not None:
                self._meid_pending = None
                self.notes.append(f"meid map discarded: {line!r}: {exc}")
            else:
                self.notes.append(f"{line!r}: {exc}")

    # -- route table --------------------------------------------------------------------------------

    def _table_marker(self, kind: str, fields: list[str]) -> None:
        what = fields[1] if len(fields) > 1 else ""
        if what == "start":
            if self._pending is not None:
                self.notes.append(f"unfinished {self._pending_kind} discarded by a new start")
            base = self.table.entries if (kind == "updatert" and self.table is not None) else {}
            self._pending = dict(base)
            self._pending_kind = kind
            self._pending_id = fields[2] if len(fields) > 2 else ""
            self._pending_count = 0
            self._pending_error = ""
        elif what == "end":
            if self._pending is None or self._pending_kind != kind:
                raise RouteTableError(f"{kind}|end without a matching start")
            pending, self._pending = self._pending, None
            reason = self._pending_error
            if not reason and len(fields) > 2 and fields[2]:
                try:
                    count = _int(fields[2], "record count")
                except RouteTableError as exc:
                    reason = str(exc)
                else:
                    if count != self._pending_count:
                        reason = f"count {count} given, {self._pending_count} records seen"
            if reason:
                self.notes.append(f"{kind} table discarded: {reason}")
                self.outcomes.append(RouteOutcome(False, self._pending_id, reason))
                return
            self.table = RouteTable(MappingProxyType(pending), self._pending_id)
            self.commits += 1
            self.outcomes.append(RouteOutcome(True, self._pending_id))
        else:
            raise RouteTableError(f"{kind} needs start or end, not {what!r}")

    def _applies_here(self, mtype_field: str) -> tuple[int, bool]:
        parts = [p.strip() for p in mtype_field.split(",")]
        mtype = _int(parts[0], "mtype")
        senders = [p for p in parts[1:] if p]
        return mtype, (not senders or any(s in self.self_names for s in senders))

    def _groups(self, text: str) -> tuple[tuple[str, ...], ...]:
        groups = []
        for grp in text.split(";"):
            eps = tuple(e.strip() for e in grp.split(",") if e.strip() and e.strip() not in self.self_names)
            if eps:
                groups.append(eps)
        return tuple(groups)

    def _route_record(self, kind: str, f: list[str]) -> None:
        if self._pending is None:
            raise RouteTableError(f"{kind} record outside newrt/updatert start..end: ignored")
        self._pending_count += 1  # filtered entries still count toward newrt|end|count
        if kind == "del":
            if len(f) < 2:
                raise RouteTableError("del needs an mtype")
            mtype, here = self._applies_here(f[1])
            sub_id = _int(f[2], "sub_id") if len(f) > 2 and f[2] else -1
            if here:
                self._pending.pop((sub_id, mtype), None)
            return
        if kind == "rte":
            if len(f) < 3:
                raise RouteTableError("rte needs mtype and endpoints")
            target, sub_text = f[2], (f[3] if len(f) > 3 and f[3] else "-1")  # subid last (P7)
        else:
            if len(f) < 4:
                raise RouteTableError("mse needs mtype, sub_id and endpoints")
            sub_text, target = f[2], f[3]  # subid third (P7)
        mtype, here = self._applies_here(f[1])
        sub_id = _int(sub_text, "sub_id")
        if not target:
            raise RouteTableError("empty endpoint list")
        if not here:
            return
        if target == MEID_ROUTE:
            entry = RouteEntry(mtype, sub_id, (), True)
        else:
            entry = RouteEntry(mtype, sub_id, self._groups(target))
        self._pending[(sub_id, mtype)] = entry

    # -- meid map -----------------------------------------------------------------------------------

    def _meid_marker(self, fields: list[str]) -> None:
        what = fields[1] if len(fields) > 1 else ""
        if what == "start":
            if self._pending is not None:
                # As C does: the meid map block ends an unfinished route table (put it after newrt|end).
                self.notes.append("unfinished route table discarded by meid_map|start")
                self._pending = None
            self._meid_pending = dict(self.meid_map)
            self._meid_count = 0
        elif what == "end":
            if self._meid_pending is None:
                raise RouteTableError("meid_map|end without a start (or after a bad record)")
            pending, self._meid_pending = self._meid_pending, None
            if len(fields) > 2 and fields[2]:
                count = _int(fields[2], "record count")
                if count != self._meid_count:
                    self.notes.append(f"meid map discarded: count {count} given, {self._meid_count} seen")
                    return
            self.meid_map = MappingProxyType(pending)
            self.meid_commits += 1
        else:
            raise RouteTableError(f"meid_map needs start or end, not {what!r}")

    def _meid_record(self, kind: str, f: list[str]) -> None:
        if self._meid_pending is None:
            raise RouteTableError(f"{kind} outside meid_map start..end: ignored")
        self._meid_count += 1
        if kind == "mme_ar":
            if len(f) < 3 or not f[1]:
                raise RouteTableError("mme_ar needs an owner and meids")
            for meid in f[2].split():
                self._meid_pending[meid] = f[1]
        else:
            if len(f) < 2:
                raise RouteTableError("mme_del needs meids")
            for meid in f[1].split():
                self._meid_pending.pop(meid, None)


def parse_route_table(text: str, self_names: frozenset[str] | set[str] = frozenset()) -> RouteParser:
    """Parse a whole static table file; the result's `.table` is None if nothing committed."""
    parser = RouteParser(self_names)
    parser.feed(text)
    return parser


class Router:
    """The active table, meid map and round-robin cursors; `targets` picks one endpoint per group."""

    def __init__(self, self_names: frozenset[str] | set[str] = frozenset()):
        self.self_names = frozenset(self_names)
        self.table: RouteTable | None = None
        self.meid_map: Mapping[str, str] = MappingProxyType({})
        self._cursors: dict[tuple[int, int, int], int] = {}
        self._fixed: dict[tuple[int, int], list[str]] = {}  # lookups with no round-robin: answer cached
        self._updates = RouteParser(self.self_names)  # persistent: route-manager records span messages
        self.update_notes: list[str] = []

    @property
    def ready(self) -> bool:
        return self.table is not None

    def load_text(self, text: str) -> list[str]:
        """Load a full table file. Its table replaces ours only if it commits; its meid map block, if it
        commits, replaces ours (the file is the whole truth). Returns notes for the log."""
        parser = RouteParser(self.self_names, self.table, {})
        parser.feed(text)
        if parser.commits:
            self._swap(parser.table)
        if parser.meid_commits:
            self.meid_map = parser.meid_map
        if not parser.commits and not parser.notes:
            parser.notes.append("no newrt|end in the table text: nothing committed")
        return parser.notes

    def apply_update(self, text: str) -> list[RouteOutcome]:
        """Feed route-manager records (mtype 20 payloads, a table may span several); tables commit at their
        end markers. Returns one outcome per end marker seen (notes go to `update_notes`)."""
        p = self._updates
        p.table, p.meid_map = self.table, self.meid_map
        before = (p.commits, p.meid_commits)
        del p.notes[:]
        del p.outcomes[:]
        p.feed(text)
        if p.commits != before[0]:
            self._swap(p.table)
        if p.meid_commits != before[1]:
            self.meid_map = p.meid_map
        self.update_notes = list(p.notes)
        return list(p.outcomes)

    def _swap(self, table: RouteTable | None) -> None:
        self.table = table
        self._cursors.clear()
        self._fixed.clear()

    def targets(self, mtype: int, sub_id: int = -1, meid: str = "") -> list[str]:
        """One endpoint name per group; raises `RmrSendError(NOENDPT)` when there is none.
        The list returned is shared: do not modify it."""
        fixed = self._fixed.get((mtype, sub_id))
        if fixed is not None:
            return fixed
        table = self.table
        if table is None:
            raise RmrSendError(RmrState.NOENDPT, "no route table committed yet (RMR_SEED_RT?)")
        entry = table.lookup(mtype, sub_id)
        if entry is None:
            raise RmrSendError(RmrState.NOENDPT, f"no route for mtype {mtype} sub_id {sub_id}")
        if entry.by_meid:
            owner = self.meid_map.get(meid) if meid else None
            if owner is None or owner in self.self_names:
                raise RmrSendError(RmrState.NOENDPT, f"mtype {mtype}: no owner for meid {meid!r}")
            return [owner]
        if not entry.groups:
            raise RmrSendError(RmrState.NOENDPT, f"mtype {mtype} sub_id {sub_id}: every endpoint is this process")
        if all(len(g) == 1 for g in entry.groups):
            out = [g[0] for g in entry.groups]
            self._fixed[(mtype, sub_id)] = out
            return out
        out = []
        for gi, group in enumerate(entry.groups):
            if len(group) == 1:
                out.append(group[0])
                continue
            key = (entry.sub_id, mtype, gi)
            cur = self._cursors.get(key, 0)
            out.append(group[cur % len(group)])
            self._cursors[key] = cur + 1
        return out
