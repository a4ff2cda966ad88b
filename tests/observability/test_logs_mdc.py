"""Log lines in the OSC MDC format: the xApp's are what mdclogpy itself prints, the agent's (its venv has no
mdclogpy) have the same fields in the same order; which format is chosen where; the level and format come
from the config. The processes' own lines are checked in test_scrape.py."""
from __future__ import annotations

import io
import json
import logging
import sys

import mdclogpy
import pytest

from agent import logs as agent_logs
from xapp import logs as xapp_logs
from xapp.config import ConfigError, XappConfig

MDC_ENV = {"SYSTEM_NAME": "ric", "HOST_NAME": "node-3", "SERVICE_NAME": "service-ricxapp-weaver",
           "CONTAINER_NAME": "weaver", "POD_NAME": "ricxapp-weaver-0"}


@pytest.fixture()
def mdc_env(monkeypatch):
    for k, v in MDC_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CONFIG_MAP_NAME", raising=False)


@pytest.fixture()
def root_logger():
    """setup() replaces the root logger's handlers and level: give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)


def _record(level: int, msg: str = "site %s: lease revoked (%s)", args=("site-0", "stale-kpm"), exc=None):
    return logging.LogRecord("weaver.xapp", level, __file__, 1, msg, args, exc)


def test_the_xapp_line_is_the_one_mdclogpy_prints(mdc_env, capsys):
    lib = mdclogpy.Logger(name="weaver-xapp", level=mdclogpy.Level.DEBUG)
    lib.mdclog_format_init()          # the library's own MDC fields, as ricxappframe initialises them
    capsys.readouterr()               # it says it cannot watch a config map (none is set)
    lib.info("site site-0: lease revoked (stale-kpm)")
    theirs = json.loads(capsys.readouterr().out)
    ours = json.loads(xapp_logs.MdcFormatter().format(_record(logging.INFO)))
    assert list(ours) == list(theirs) == ["ts", "crit", "id", "mdc", "msg"]
    assert ours.pop("mdc") == {**theirs.pop("mdc"), "logger": "weaver.xapp"}
    assert abs(ours.pop("ts") - theirs.pop("ts")) < 5000 and ours == theirs
    assert theirs == {"crit": "INFO", "id": "weaver-xapp", "msg": "site site-0: lease revoked (stale-kpm)"}


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL])
def test_the_agent_line_matches_the_xapp_line(mdc_env, level):
    try:
        raise ValueError("bad frame")
    except ValueError:
        exc = sys.exc_info()
    for rec in (_record(level), _record(level, exc=exc), _record(level, "100% \"quoted\"\nline", ())):
        x = json.loads(xapp_logs.MdcFormatter(component="weaver-agent").format(rec))
        a = json.loads(agent_logs.MdcFormatter().format(rec))
        assert list(a) == list(x) and list(a["mdc"]) == list(x["mdc"])
        assert abs(a.pop("ts") - x.pop("ts")) < 5000 and a == x
        assert x["crit"] == {logging.CRITICAL: "ERROR"}.get(level, logging.getLevelName(level))
        assert x["mdc"]["POD_NAME"] == "ricxapp-weaver-0" and isinstance(x["mdc"]["PID"], int)
        assert ("ValueError: bad frame" in x["msg"]) == (rec.exc_info is not None)     # the traceback rides along


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("mod", [xapp_logs, agent_logs], ids=["xapp", "agent"])
def test_format_choice(mod):
    pipe, tty = io.StringIO(), _Tty()
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert mod.choose_format("auto", {}, pipe) == "plain"                 # a developer's shell, a CI log
    assert mod.choose_format("auto", pod, pipe) == "mdc"                  # a pod: the log collector reads JSON
    assert mod.choose_format("auto", pod, tty) == "plain"                 # kubectl exec -it: a terminal
    assert mod.choose_format("mdc", {}, tty) == "mdc" and mod.choose_format("plain", pod, pipe) == "plain"
    assert mod.choose_format("plain", {"WEAVER_LOG_FORMAT": "mdc"}, tty) == "mdc"
    with pytest.raises(ValueError, match="log format"):
        mod.choose_format("json", {}, pipe)
    if mod is xapp_logs:                                                  # the RIC's xApp charts set RMR_*
        assert mod.choose_format("auto", {"RMR_SRC_ID": "service-ricxapp-weaver-rmr"}, pipe) == "mdc"


def _controls(**extra) -> dict:
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    c = json.loads((root / "descriptors" / "config-file.json").read_text())["controls"]
    return {**c, **extra}


def test_level_and_format_come_from_the_config(mdc_env, root_logger, monkeypatch):
    monkeypatch.delenv("WEAVER_LOG_FORMAT", raising=False)
    cfg = XappConfig.from_controls(_controls(log_level="WARNING", log_format="mdc"))
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert xapp_logs.configure(cfg) == "mdc" and root_logger.level == logging.WARNING
    log = logging.getLogger("weaver.xapp.test")
    log.info("not at WARNING")
    log.warning("node %s lost", "gnb-1")
    lines = [json.loads(ln) for ln in stream.getvalue().splitlines()]
    assert [(r["crit"], r["msg"], r["mdc"]["logger"]) for r in lines] == [("WARNING", "node gnb-1 lost",
                                                                           "weaver.xapp.test")]
    assert xapp_logs.configure(XappConfig.from_controls(_controls(log_format="plain")), "DEBUG") == "plain"
    assert root_logger.level == logging.DEBUG
    with pytest.raises(ConfigError):
        XappConfig.from_controls(_controls(log_format="json"))     # the schema knows the three formats
