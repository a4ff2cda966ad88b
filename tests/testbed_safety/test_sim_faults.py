"""`weaver sim --fault`: node-side faults run in the standalone simulator; the others are refused."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest


def _sim(xapp_python, repo_root, tmp_path, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("DBAAS_SERVICE_HOST", None)
    return subprocess.Popen(
        [str(xapp_python), "-m", "testbed.cli", "sim", "--sites", "1", "--cells", "1", "--e2term-port", "0",
         "--submgr-port", "0", "--route-dir", str(tmp_path), *extra],
        cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(90)
def test_weaver_sim_runs_a_node_restart_and_reports_it(xapp_python, repo_root, tmp_path):
    proc = _sim(xapp_python, repo_root, tmp_path, "--fault", "node-restart:site=0,down=0.2", "--fault-at", "0.3")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.stdout.readline().strip() != "weaver-sim: ready":
            pass
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    faults = [json.loads(line.split("weaver-sim: fault ", 1)[1]) for line in out.splitlines()
              if line.startswith("weaver-sim: fault ")]
    assert [f["kind"] for f in faults] == ["node-restart"], out
    assert faults[0]["applicable"] and faults[0]["end_s"] >= faults[0]["start_s"] + 0.2
    assert "fault node-restart:site=0,down=0.2: start" in out  # logged when it starts and ends


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["xapp-kill", "partition", "bogus", "node-lost:site=4"])
def test_weaver_sim_refuses_faults_it_cannot_inject(xapp_python, repo_root, tmp_path, spec):
    proc = _sim(xapp_python, repo_root, tmp_path, "--fault", spec)
    out, _ = proc.communicate(timeout=50)
    assert proc.returncode == 2 and "weaver sim: --fault" in out, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["bogus", "ack-delay:ms=x", "partition:site=7"])
def test_weaver_up_refuses_a_bad_fault_before_starting_anything(xapp_python, repo_root, spec):
    proc = subprocess.run([str(xapp_python), "-m", "testbed.cli", "up", "--sites", "1", "--fault", spec],
                          cwd=repo_root, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2 and "weaver up: --fault" in proc.stderr, proc.stderr
