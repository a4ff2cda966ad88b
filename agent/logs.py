"""The agent's log lines: plain on a terminal, JSON lines in the OSC MDC format (mdclogpy's) in a pod or
when configured (WEAVER_LOG_FORMAT = auto | mdc | plain; level from WEAVER_LOG_LEVEL, default INFO).

The agent's venv has no mdclogpy (ricxappframe's stack pins an old protobuf), so `MdcFormatter` writes
the library's line itself: `{"ts": ms, "crit": "INFO", "id": <component>, "mdc": {"PID", "SYSTEM_NAME",
"HOST_NAME", "SERVICE_NAME", "CONTAINER_NAME", "POD_NAME", "logger"}, "msg": ...}`, keys in the library's
order. tests/observability/test_logs_mdc.py holds it to the xApp's formatter, which the library writes.
"""
from __future__ import annotations

import json
import logging
import os
import sys

FORMATS = ("auto", "mdc", "plain")
PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"
POD_ENV = ("KUBERNETES_SERVICE_HOST",)
COMPONENT = "weaver-agent"
MDC_ENV = ("SYSTEM_NAME", "HOST_NAME", "SERVICE_NAME", "CONTAINER_NAME", "POD_NAME")   # mdclogpy's, in order


def _crit(levelno: int) -> str:       # mdclogpy's LEVEL_STRINGS: nothing above ERROR, nothing below DEBUG
    if levelno >= logging.ERROR:
        return "ERROR"
    return "WARNING" if levelno >= logging.WARNING else "INFO" if levelno >= logging.INFO else "DEBUG"


def choose_format(configured: str = "auto", env=os.environ, stream=None) -> str:
    fmt = (env.get("WEAVER_LOG_FORMAT") or configured or "auto").lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {FORMATS}")
    if fmt != "auto":
        return fmt
    stream = sys.stderr if stream is None else stream
    in_pod = any(env.get(k) for k in POD_ENV)
    return "mdc" if in_pod and not (hasattr(stream, "isatty") and stream.isatty()) else "plain"


class MdcFormatter(logging.Formatter):
    def __init__(self, component: str = COMPONENT) -> None:
        super().__init__()
        self.component = component
        self._base = {"PID": os.getpid(), **{k: os.environ.get(k, "") for k in MDC_ENV}}

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            msg = f"{msg}\n{record.exc_text}"
        if record.stack_info:
            msg = f"{msg}\n{self.formatStack(record.stack_info)}"
        return json.dumps({"ts": int(round(record.created * 1000)), "crit": _crit(record.levelno),
                           "id": self.component, "mdc": {**self._base, "logger": record.name}, "msg": msg})


def setup(fmt: str | None = None, level: str | int | None = None, stream=None, env=os.environ) -> str:
    """One stderr handler on the root logger in the chosen format; returns `mdc` or `plain`."""
    stream = sys.stderr if stream is None else stream
    chosen = choose_format(fmt or "auto", env, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(MdcFormatter() if chosen == "mdc" else logging.Formatter(PLAIN))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    logging.captureWarnings(True)       # warnings become log lines in the same format
    lvl = level or env.get("WEAVER_LOG_LEVEL") or "INFO"
    root.setLevel(lvl.upper() if isinstance(lvl, str) else lvl)
    return chosen
