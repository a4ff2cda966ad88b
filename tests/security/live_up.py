"""A live `weaver up` for the security tests that act on a running tier: started, its output read on a thread,
killed if the test leaves it running, and the processes of its run found by the kernel's view."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The guard of the live tests whose point is a fault, not the guard: the demo's derived guard (24 SMs, a tick
# of CFS slack per CPU, testbed.up.kernel_guard_sms) covers the kernel bound's usual overshoot, not its tail on
# this 2-vCPU host: 25.1 SMs beyond an 88-SM lease in one period of one of eight plain 45 s demo runs, and
# 45-54 when the worker never idled (README, "The tail the derived guard does not cover"); the kernel's own
# counter agreed with the meter each time (ground truth's meter_sms). Under this guard the runs still count
# every training-caused miss (== 0).
TAIL_GUARD = ("--guard", "56")


@dataclass
class LiveUp:
    proc: subprocess.Popen
    run_dir: Path
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def rounds(self) -> int:
        """Committed cross-site rounds on the last status line (0 before the first)."""
        found = re.findall(r"rounds\s+(\d+)", self.text)
        return int(found[-1]) if found else 0

    def poll_until(self, ready, timeout_s: float = 150.0):
        """`ready()`'s first truthy answer while the run lives, polled every 0.5 s; None if there was none."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.5)
            got = ready()
            if got:
                return got
        return None

    def pids(self) -> set[int]:
        """weaver up and every process of its run (their command lines name the run directory, or they are children)."""
        root, run_dir = self.proc.pid, str(self.run_dir)
        pids = {root}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if run_dir in cmd or ppid == root:
                pids.add(int(entry))
        return pids


@contextlib.contextmanager
def weaver_up(repo_root: Path, run_dir: Path, *argv: str) -> Iterator[LiveUp]:
    proc = subprocess.Popen([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", *argv, "--run-dir", str(run_dir)],
                            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    live = LiveUp(proc, run_dir)
    reader = threading.Thread(target=lambda: live.lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        yield live
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
