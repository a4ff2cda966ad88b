"""`weaver up` on a host that offers no writable cgroup (a laptop without root): it still runs as a demo,
says so in one start-up line, gives the agents --cooperative and the cooperative agents' guard (32 SMs),
instead of failing at the first agent's refusal."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.slow


def test_weaver_up_without_cgroups_runs_cooperative_and_says_so(tmp_path, repo_root):
    weaver = repo_root / ".venv-xapp" / "bin" / "weaver"
    r = subprocess.run([str(weaver), "up", "--duration", "6", "--sites", "1", "--cells", "2", "--json",
                        str(tmp_path / "s.json"), "--no-cross-site"], cwd=repo_root,
                       env={**os.environ, "WEAVER_NO_CGROUP": "1"}, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "weaver up: confinement none (WEAVER_NO_CGROUP is set): the agents run --cooperative" in r.stdout
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["guard_sms"] == 32
    assert s["sites"]["site-0"]["ground_truth"]["worker_meter"] == ""    # measured from /proc instead
