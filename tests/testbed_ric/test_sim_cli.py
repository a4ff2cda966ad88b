"""`weaver sim` as a subprocess: starts, prints its endpoints, serves REST, stops cleanly on SIGINT."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


@pytest.mark.timeout(90)
def test_weaver_sim_starts_prints_endpoints_and_stops_on_sigint(xapp_python, repo_root, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("DBAAS_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [str(xapp_python), "-m", "testbed.cli", "sim", "--sites", "2", "--cells", "2", "--e2term-port", "0",
         "--submgr-port", "0", "--speed", "1", "--route-dir", str(tmp_path), "--json", str(tmp_path / "ep.json")],
        cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if line.strip() == "weaver-sim: ready":
                break
        out = "\n".join(lines)
        assert "weaver-sim: ready" in out, out
        eps = dict(re.findall(r"^weaver-sim: (\S+) (.*)$", out, re.M))
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ric/v1/subscriptions", eps["submgr"]), eps
        assert re.fullmatch(r"127\.0\.0\.1:\d+", eps["e2term-rmr"])
        assert eps["nodes"] == "gnbd_001_001_000001_1,gnbd_001_001_000002_1"
        with urllib.request.urlopen(eps["sim-api"] + "/state", timeout=10) as r:
            assert len(json.loads(r.read())["sites"]) == 2
        table = Path(eps["route-table"]).read_text()
        assert f"rte|12040|{eps['e2term-rmr']}" in table
        assert json.loads((tmp_path / "ep.json").read_text())["submgr"] == eps["submgr"]
        # The REST endpoint is live: garbage gets a JSON 400.
        req = urllib.request.Request(eps["submgr"], data=b"garbage", method="POST",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 400 and json.loads(err.value.read())["error"]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, rest
        assert "weaver-sim: stopped after" in rest and "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sim_module_interface():
    from testbed import sim

    assert callable(sim.add_arguments) and callable(sim.run)
    assert sys.modules["testbed.sim"] is sim


def test_node_overrides_parse_and_refuse():
    from testbed.sim import parse_node_overrides

    assert parse_node_overrides(["1:kpm=v2.03,rc=oai", "0:rc=oai"]) == {
        1: {"kpm_version": "v2.03", "rc_table": "oai"}, 0: {"rc_table": "oai"}}
    assert parse_node_overrides(["0:sub_ms=20,control_ms=7.5"]) == {
        0: {"subscription_delay_ms": 20.0, "control_delay_ms": 7.5}}
    for bad in ("x", "1", "a:kpm=v2.03", "1:foo=bar", "1:kpm", "0:control_ms=soon"):
        with pytest.raises(ValueError):
            parse_node_overrides([bad])


def test_bad_settings_exit_2(xapp_python, repo_root):
    for argv in (["--scenario", "nope"], ["--node", "0:kpm=v1"], ["--period-ms", "3"], ["--node", "0:control_ms=-4"]):
        r = subprocess.run([str(xapp_python), "-m", "testbed.cli", "sim", "--e2term-port", "0", "--submgr-port", "0",
                            *argv], cwd=repo_root, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "weaver sim:" in r.stderr and "Traceback" not in r.stderr, r.stderr
