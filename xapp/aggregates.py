"""Aggregate-transfer announcements (issue 18): a site's federated aggregator says that one aggregate
of `bytes` will be ready at `earliest_start_unix_ms` and must reach its destination by
`deadline_unix_ms`; a transport controller reads them and provisions capacity for just that window.

Pure: `parse_announcement` validates one body as hostile input (every field typed and bounded, a clear
message naming the field) and `AnnouncementBook` keeps the latest announcement per (site, round), at
most `per_site` a site (its own least recently announced dropped first: a site's flood evicts nothing of
another's) and at most `capacity` in all (past it, a new key is refused, not made room for). The REST adapter
(`xapp.rest`) authenticates each POST as the site it names (its broker credential).
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass

MAX_BYTES = 1 << 40            # 1 TiB: no single aggregate is larger
MAX_WINDOW_MS = 24 * 3600e3    # a window longer than a day is a mistake, not a plan
MAX_ROUND = (1 << 31) - 1
UNIX_MS_RANGE = (0.0, 4102444800e3)  # 1970 .. 2100
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
FIELDS = ("site_id", "round", "bytes", "earliest_start_unix_ms", "deadline_unix_ms", "destination")


class AnnouncementError(ValueError):
    """A body the API refuses; the message names the field."""


@dataclass(frozen=True)
class Announcement:
    site_id: str
    round: int
    bytes: int
    earliest_start_unix_ms: float
    deadline_unix_ms: float
    destination: str = "cloud"


def _int(body: dict, name: str, lo: int, hi: int) -> int:
    v = body.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise AnnouncementError(f"{name} must be an integer in {lo}..{hi}")
    return v


def _time(body: dict, name: str) -> float:
    v = body.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not UNIX_MS_RANGE[0] <= v <= UNIX_MS_RANGE[1]:
        raise AnnouncementError(f"{name} must be a finite number of Unix milliseconds (1970..2100)")
    return float(v)


def _name(body: dict, name: str, default: str | None = None) -> str:
    v = body.get(name, default)
    if not isinstance(v, str) or not _NAME.fullmatch(v):
        raise AnnouncementError(f"{name} must be 1-64 characters of [A-Za-z0-9_.:-]")
    return v


def parse_announcement(body: object) -> Announcement:
    if not isinstance(body, dict):
        raise AnnouncementError("body must be a JSON object")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise AnnouncementError(f"unknown field {unknown[0][:64]!r} (fields: {', '.join(FIELDS)})")
    a = Announcement(site_id=_name(body, "site_id"), round=_int(body, "round", 0, MAX_ROUND),
                     bytes=_int(body, "bytes", 1, MAX_BYTES),
                     earliest_start_unix_ms=_time(body, "earliest_start_unix_ms"),
                     deadline_unix_ms=_time(body, "deadline_unix_ms"),
                     destination=_name(body, "destination", "cloud"))
    window = a.deadline_unix_ms - a.earliest_start_unix_ms
    if not 0 < window <= MAX_WINDOW_MS:
        raise AnnouncementError("deadline_unix_ms must be after earliest_start_unix_ms, by at most a day")
    return a


class AnnouncementBook:
    def __init__(self, capacity: int = 4096, per_site: int = 64):
        self.capacity = capacity
        self.per_site = per_site
        self._items: OrderedDict[tuple[str, int], Announcement] = OrderedDict()
        self._count: dict[str, int] = {}

    def add(self, a: Announcement) -> bool:
        """Store (a re-announcement of a (site, round) replaces the earlier one). True if it replaced.
        Raises AnnouncementError when the book is full of other sites' entries."""
        key = (a.site_id, a.round)
        if self._items.pop(key, None) is not None:
            self._items[key] = a
            return True
        if self._count.get(a.site_id, 0) >= self.per_site:      # the site's own oldest goes
            oldest = next(k for k in self._items if k[0] == a.site_id)
            del self._items[oldest]
            self._count[a.site_id] -= 1
        elif len(self._items) >= self.capacity:
            raise AnnouncementError(f"the book holds {self.capacity} announcements of other sites; retry later")
        self._items[key] = a
        self._count[a.site_id] = self._count.get(a.site_id, 0) + 1
        return False

    def view(self) -> list[dict]:
        return [asdict(a) for a in sorted(self._items.values(), key=lambda a: (a.earliest_start_unix_ms, a.site_id))]

    def __len__(self) -> int:
        return len(self._items)
