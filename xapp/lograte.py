"""Rate limits for log lines whose count a peer decides (stray RMR frames, bad indications, malformed HTTP).

A peer that sends 10,000 stray frames must not get 10,000 log lines: the disk and the operator's
attention are resources too. `RateLimitFilter` lets the first `burst` records per (logger, message
template) through in each `interval_s` window, replaces the next one by a notice that lines like it are
being suppressed, drops the rest, and puts the count of what it dropped on the first record of the next
window: at most burst + 1 lines per key and window. The key is the template (`record.msg`), not the
formatted text, so lines that differ only in a node name or an mtype share one budget. The number of
keys is bounded too: a logger that formats its own messages would otherwise grow the table without end.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

# Loggers whose lines a peer can trigger: the xApp's own and aiohttp's (a malformed request line
# logs a traceback per connection on "aiohttp.server").
PREFIXES = ("weaver.xapp", "xapp.", "aiohttp.", "pycrate")
_OVERFLOW = "<other messages>"


@dataclass
class _Window:
    end: float
    passed: int = 0
    suppressed: int = 0


class RateLimitFilter(logging.Filter):
    def __init__(self, burst: int = 10, interval_s: float = 60.0, max_keys: int = 1024, clock=time.monotonic):
        super().__init__()
        self.burst, self.interval_s, self.max_keys, self.clock = burst, interval_s, max_keys, clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self.suppressed_total = 0

    def reset(self) -> None:
        self._windows.clear()

    def _key(self, record: logging.LogRecord, now: float) -> tuple[str, str]:
        key = (record.name, record.msg if isinstance(record.msg, str) else type(record.msg).__name__)
        if key in self._windows or len(self._windows) < self.max_keys:
            return key
        # expired windows go; one with an unreported count waits one more interval for its next line
        for k in [k for k, w in self._windows.items() if w.end + (self.interval_s if w.suppressed else 0) <= now]:
            del self._windows[k]
        return key if len(self._windows) < self.max_keys else (record.name, _OVERFLOW)

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        key = self._key(record, now)
        w = self._windows.get(key)
        carried = 0
        if w is None or now >= w.end:
            carried = w.suppressed if w else 0
            w = self._windows[key] = _Window(end=now + self.interval_s)
        w.passed += 1
        if w.passed <= self.burst:
            if carried:
                _rewrite(record, f"{record.getMessage()} [{carried} similar lines suppressed before this one]")
            return True
        if w.passed == self.burst + 1:      # say once that the flood is being cut, and for how long
            _rewrite(record, f"{record.getMessage()} [more lines like this suppressed for "
                             f"{w.end - now:.0f} s; the count follows]")
            return True
        w.suppressed += 1
        self.suppressed_total += 1
        return False


def _rewrite(record: logging.LogRecord, text: str) -> None:
    record.msg, record.args = text, None


_installed: RateLimitFilter | None = None


def install(burst: int = 10, interval_s: float = 60.0) -> RateLimitFilter:
    """Put one shared filter on every existing logger under PREFIXES (idempotent). Filters on a logger
    do not apply to its children's records, so each logger gets it; the xApp's modules are imported,
    and their loggers exist, before `XappApp.start` calls this."""
    global _installed
    if _installed is None:
        _installed = RateLimitFilter(burst=burst, interval_s=interval_s)
    _installed.reset()      # a new xApp in this process (tests) starts with full budgets
    names = {"weaver.xapp", "xapp.rmr", "aiohttp.server", "aiohttp.web", "aiohttp.access", "pycrate.asn1rt"}
    # pycrate says INFO "unable to retrieve a table-looked up object" for every frame it cannot decode: a
    # peer's garbage, already counted and logged (rate-limited) by us; its own warnings still show
    logging.getLogger("pycrate.asn1rt").setLevel(logging.WARNING)
    names |= {n for n in logging.root.manager.loggerDict if n.startswith(PREFIXES)}
    for name in sorted(names):
        lg = logging.getLogger(name)
        if _installed not in lg.filters:
            lg.addFilter(_installed)
    return _installed


def suppressed_total() -> int:
    return _installed.suppressed_total if _installed else 0
