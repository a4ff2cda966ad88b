"""`weaver up` killed outright (SIGKILL, no handler runs) leaves nothing behind: its children get SIGTERM from
the kernel (testbed.procs: PR_SET_PDEATHSIG) and stop as on a Ctrl-C, so the xApp revokes its leases, each agent
removes the cgroups it made, and no process of the run is left. Before, a test that killed a stuck `weaver up`
left its xApp, agents and frozen workers running for good, with their cgroups."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.up.test_weaver_up import _processes_mentioning

pytestmark = pytest.mark.slow
HIERARCHIES = ("cpu", "cpuacct", "cpuset", "freezer", "memory")


def _agent_cgroups(pids: set[int]) -> list[str]:
    return [f"/sys/fs/cgroup/{h}/weaver-agent-{p}" for h in HIERARCHIES for p in pids
            if os.path.isdir(f"/sys/fs/cgroup/{h}/weaver-agent-{p}")]


def test_a_killed_weaver_up_leaves_no_process_and_no_cgroup(tmp_path, repo_root):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", "--duration", "120",
                             "--no-cross-site", "--run-dir", str(run_dir)],
                            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not re.search(r"\[\s+3s/", "".join(lines)):
            assert proc.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.2)
        run = _processes_mentioning(str(run_dir))
        agents = {p for p in run if b"agent.cli" in open(f"/proc/{p}/cmdline", "rb").read()}
        assert len(agents) == 3 and _agent_cgroups(agents), "".join(lines)[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)               # the fault: no handler of weaver up runs
        proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (_processes_mentioning(str(run_dir)) or _agent_cgroups(agents)):
        time.sleep(0.5)
    assert not _processes_mentioning(str(run_dir)), "processes of the run outlived it"
    assert not _agent_cgroups(agents), "cgroups of the run outlived it"
