"""Where the xApp's log lines go and how they look: plain lines on a terminal, JSON lines in the MDC format
of the OSC frameworks (`mdclogpy`, the library ricxappframe logs through) on a RIC.

The format is `log_format` in the config (`auto` | `mdc` | `plain`; WEAVER_LOG_FORMAT overrides it):
`auto` means MDC when the process runs where a RIC runs xApps (a Kubernetes pod, or the RMR variables
the xApp charts set: RIC_ENV) and its stderr is not a terminal, plain otherwise. The level is the
config's `log_level` (a reload changes it too, `set_level`).

An MDC line is exactly what `mdclogpy.Logger.log` prints - `{"ts": ms, "crit": "INFO", "id": <component>,
"mdc": {"PID", "SYSTEM_NAME", "HOST_NAME", "SERVICE_NAME", "CONTAINER_NAME", "POD_NAME", ...}, "msg": ...}`
- because the library writes it: `MdcFormatter` hands each record to an `mdclogpy.Logger` and keeps what it
would have printed. The MDC also carries `logger` (the stdlib logger's name). Lines go to stderr like the
plain ones (stdout carries the `weaver-xapp: ...` lines that `weaver up` and the tests read).
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import threading

import mdclogpy

FORMATS = ("auto", "mdc", "plain")
PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Set in an xApp's pod by the RIC's charts (RMR's) or by Kubernetes itself.
RIC_ENV = ("RMR_SRC_ID", "RMR_SEED_RT", "RMR_RTG_SVC", "KUBERNETES_SERVICE_HOST")
COMPONENT = "weaver-xapp"
# mdclogpy's levels stop at ERROR
_LEVELS = {logging.DEBUG: mdclogpy.Level.DEBUG, logging.INFO: mdclogpy.Level.INFO,
           logging.WARNING: mdclogpy.Level.WARNING, logging.ERROR: mdclogpy.Level.ERROR}


def choose_format(configured: str = "auto", env=os.environ, stream=None) -> str:
    """`mdc` or `plain` for a configured `auto` | `mdc` | `plain` (WEAVER_LOG_FORMAT wins)."""
    fmt = (env.get("WEAVER_LOG_FORMAT") or configured or "auto").lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {FORMATS}")
    if fmt != "auto":
        return fmt
    stream = sys.stderr if stream is None else stream
    on_ric = any(env.get(k) for k in RIC_ENV)
    return "mdc" if on_ric and not (hasattr(stream, "isatty") and stream.isatty()) else "plain"


class _Captured(mdclogpy.Logger):
    """The library's logger, its line kept instead of printed."""

    line = ""

    def _output_log(self, log: str) -> None:
        self.line = log


class MdcFormatter(logging.Formatter):
    def __init__(self, component: str = COMPONENT) -> None:
        super().__init__()
        self._lib = _Captured(name=component, level=mdclogpy.Level.DEBUG)   # the stdlib filters by level
        # mdclog_format_init's fields from the environment, without its config-map watch (which prints to
        # stdout when CONFIG_MAP_NAME is unset)
        self._lib.mdc = {"PID": "", "SYSTEM_NAME": "", "HOST_NAME": "", "SERVICE_NAME": "", "CONTAINER_NAME": "",
                         "POD_NAME": ""}
        self._lib.get_env_params_values()
        self._base = dict(self._lib.mdc)
        self._lock = threading.Lock()

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            msg = f"{msg}\n{record.exc_text}"
        if record.stack_info:
            msg = f"{msg}\n{self.formatStack(record.stack_info)}"
        level = _LEVELS.get(record.levelno, mdclogpy.Level.ERROR if record.levelno > logging.ERROR
                            else mdclogpy.Level.DEBUG)
        with self._lock:
            self._lib.mdc = {**self._base, "logger": record.name}
            self._lib.log(level, msg)
            return self._lib.line


_held: logging.handlers.MemoryHandler | None = None


def setup(fmt: str = "auto", level: str | int = "INFO", stream=None, env=os.environ, hold: bool = False) -> str:
    """Route every log record through one stderr handler in the chosen format; returns `mdc` or `plain`.
    Replaces handlers an earlier `setup` (or `logging.basicConfig`) put on the root logger.

    `hold`: the format is provisional (the config, read next, may choose another): records wait in memory
    and go out through the handler of the next `setup`, so a RIC's collector never gets a line in the
    wrong format; if none comes, at exit through this one."""
    global _held
    stream = sys.stderr if stream is None else stream
    chosen = choose_format(fmt, env, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(MdcFormatter() if chosen == "mdc" else logging.Formatter(PLAIN))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    set_level(level)
    held, _held = _held, None
    if hold:
        _held = logging.handlers.MemoryHandler(100_000, flushLevel=logging.CRITICAL + 1, target=handler)
        root.addHandler(_held)
    else:
        root.addHandler(handler)
    if held is not None:
        for record in held.buffer:
            if record.levelno >= root.level:
                (_held or handler).handle(record)
        held.buffer.clear()
        held.close()
    logging.captureWarnings(True)       # warnings become log lines in the same format
    return chosen


def set_level(level: str | int) -> None:
    logging.getLogger().setLevel(level.upper() if isinstance(level, str) else level)


def configure(cfg, level_override: str | None = None) -> str:
    """`setup` from an `XappConfig` (its `log_level`, and `log_format` from its controls)."""
    return setup(cfg.controls.get("log_format", "auto"), level_override or cfg.log_level)
