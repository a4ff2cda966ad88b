"""A real `weaver-agent run` (supervisor + confined worker) under a scripted broker, with the worker tree's
CPU measured by the platform's meter (testbed.groundtruth: /proc, the worker and every descendant),
never by the agent: per 100 ms window while leased, then after a revocation."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.groundtruth import ProcCpuSampler
from tests.agent.broker import ScriptedBroker

ROOT = Path(__file__).resolve().parents[2]
WINDOW_S = 0.1


@dataclass
class ConfinedRun:
    line: str                     # the agent's start-up line
    leased_ms: list[float]        # worker-tree CPU per 100 ms window while a lease of `lease_ms` is held
    revoked_ms: list[float]       # the same after the revocation (no lease)
    lease_ms: float
    rc: int
    released: list                # what the broker received
    supervisor_cgroups: str = ""  # /proc/<supervisor>/cgroup while it ran


def run_agent(tmp_path: Path, job: str = "", *, duty: float = 0.2, cooperative: bool = False,
              leased_s: float = 3.0, revoked_s: float = 1.0, extra: tuple[str, ...] = ()) -> ConfinedRun:
    broker = ScriptedBroker(heartbeat_ms=100)
    port = broker.start()
    broker.renew_every_period(sm_count=1, period_ms=100, valid_for_ms=300, duty=duty)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cooperative:
        env["WEAVER_NO_CGROUP"] = "1"
    argv = [sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu", "--device", "cpu",
            "--cores", "1", "--broker", f"127.0.0.1:{port}", "--site-id", "site-7",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--inspect-addr", "127.0.0.1:0", "--metrics-addr", "",
            "--max-seconds", "90", *(["--job", job] if job else []), *(["--cooperative"] if cooperative else []),
            *extra]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "worker pid " in line, line
        sampler = ProcCpuSampler(int(line.split("worker pid ")[1].split()[0]))
        own = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert broker.wait_for(lambda: len(broker.usage()) >= 5, 60), "no usage reports: the worker never trained"
        time.sleep(1.0)        # the loader's processes are found by the sampler's rescan
        sampler.sample()
        leased = [_window(sampler) for _ in range(round(leased_s / WINDOW_S))]
        broker.stop_renewing()
        broker.revoke()
        time.sleep(0.3)
        sampler.sample()
        revoked = [_window(sampler) for _ in range(round(revoked_s / WINDOW_S))]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        broker.stop()
    return ConfinedRun(line, leased, revoked, duty * WINDOW_S * 1e3, rc, broker.released(), own)


def _window(sampler: ProcCpuSampler) -> float:
    time.sleep(WINDOW_S)
    return (sampler.sample() or 0.0) * 1e3
