"""The torchft binary ends with the wrapper that started it, however the wrapper ends: a SIGKILLed wrapper
(a test's or an operator's kill -9 of `weaver up`'s tree) once left a Lighthouse serving a quorum for good."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.agent


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_a_sigkilled_wrapper_takes_its_lighthouse_binary_with_it(repo_root):
    p = subprocess.Popen([sys.executable, "-m", "agent.crosssite.lighthouse", "--port", "0", "--round-ms", "800"],
                         cwd=repo_root, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo_root)})
    try:
        assert p.stdout.readline().startswith("lighthouse http://127.0.0.1:")
        [binary] = [int(k) for k in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        assert _alive(binary)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 5
        while _alive(binary) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(binary), "the torchft binary outlived its wrapper"
    finally:
        if p.poll() is None:
            p.kill()
