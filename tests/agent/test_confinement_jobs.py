"""Jobs written as users write them (agent.jobs.userland) stay inside their lease because the kernel holds
them there, not because they behave. Each is run confined (the default) and, as the injected fault, with
the bound turned off (WEAVER_NO_CGROUP=1 --cooperative): the same job then executes with no lease, which
shows these tests can fail. CPU is the platform's meter of the worker tree (threads and loader processes
included), never the agent's report."""
from __future__ import annotations

import pytest

from agent.confine import ConfinementError, detect
from tests.agent.confined_run import run_agent

try:
    detect()
    HAVE_CGROUP = True
except ConfinementError:
    HAVE_CGROUP = False

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_CGROUP, reason="no writable cgroup on this host")]

# The kernel's own granularity over a 100 ms window: CFS checks the quota at the scheduler tick (4 ms
# here) on each CPU the tree runs on (2 here); measured 1-6 ms beyond a 20 ms quota.
KERNEL_SLACK_MS = 8.0
NO_LEASE_MS = 0.5       # CPU a 100 ms window may show with no lease (the meter's own noise: frozen is 0.0)
JOBS = ["agent.jobs.userland:make_metrics_thread_job", "agent.jobs.userland:make_loader_job",
        "agent.jobs.userland:make_threads_job"]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.split(":make_")[1])
def test_a_users_job_runs_only_inside_its_lease(tmp_path, job):
    r = run_agent(tmp_path, job)
    assert "bound by cgroup-v" in r.line
    assert max(r.leased_ms) <= r.lease_ms + KERNEL_SLACK_MS, (r.leased_ms, r.lease_ms)
    assert sum(r.leased_ms) / len(r.leased_ms) > 0.5 * r.lease_ms, "it trained"
    assert max(r.revoked_ms) < NO_LEASE_MS, f"CPU with no lease: {r.revoked_ms}"
    assert r.rc == 0
    # the supervisor's own CPU is bounded apart, in a sibling cgroup of the worker's, never in the worker's
    assert not any(line.endswith("/worker") for line in r.supervisor_cgroups.splitlines())
    assert any(line.split(":")[1] in ("cpu", "cpu,cpuacct", "") and line.endswith("/supervisor")
               for line in r.supervisor_cgroups.splitlines())


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.split(":make_")[1])
def test_without_the_kernel_bound_the_same_job_runs_with_no_lease(tmp_path, job):
    r = run_agent(tmp_path, job, cooperative=True, leased_s=2.0, revoked_s=2.0)
    assert "bound by cooperative (WEAVER_NO_CGROUP is set)" in r.line
    # the confined test's own bounds fail: a window beyond the lease and the kernel's slack, or CPU with no
    # lease at all (the threads job's extra threads the cooperative agent charges as host CPU, so what
    # escapes it is its idle loop's: 0.4-0.8 ms a window; the metrics thread's is 31 ms)
    assert max(r.leased_ms) > r.lease_ms + KERNEL_SLACK_MS or max(r.revoked_ms) >= NO_LEASE_MS, \
        (r.leased_ms, r.revoked_ms)


def test_no_cgroup_and_no_cooperative_flag_refuses_to_train(tmp_path):
    import os
    import subprocess
    import sys

    from tests.agent.confined_run import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT), WEAVER_NO_CGROUP="1")
    p = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--device", "cpu",
                        "--broker", "127.0.0.1:9", "--checkpoint-dir", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("weaver-agent: refusing to train: no kernel confinement")
    assert "--cooperative" in p.stderr and "Traceback" not in p.stderr


def test_a_killed_worker_ends_its_supervisor_with_the_cause_and_no_cgroup_left(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.agent.broker import ScriptedBroker
    from tests.agent.confined_run import ROOT
    broker = ScriptedBroker(heartbeat_ms=100)
    port = broker.start()
    broker.renew_every_period(sm_count=1, period_ms=100, valid_for_ms=300, duty=0.5)
    try:
        p = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu",
                              "--device", "cpu", "--cores", "1", "--broker", f"127.0.0.1:{port}",
                              "--checkpoint-dir", str(tmp_path), "--inspect-addr", "127.0.0.1:0", "--metrics-addr", ""],
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        worker = int(line.split("worker pid ")[1].split()[0])
        subtree = os.path.dirname(os.path.dirname(line.split(" meter ")[1].split(",")[0]))
        assert broker.wait_for(lambda: len(broker.usage()) >= 3, 60)
        os.kill(worker, signal.SIGKILL)
        assert p.wait(30) == 1
        assert "worker exited with -9" in p.stderr.read()
        assert not os.path.isdir(subtree)
    finally:
        broker.stop()


def test_a_killed_supervisors_worker_dies_with_it_and_the_next_agent_sweeps_its_cgroups(tmp_path):
    """SIGKILL of the supervisor leaves no worker running past its lease (PR_SET_PDEATHSIG), and its
    cgroup subtree is removed by the next agent that starts on the host."""
    import os
    import subprocess
    import sys
    import time

    from agent.confine import PREFIX
    from tests.agent.broker import ScriptedBroker
    from tests.agent.confined_run import ROOT
    broker = ScriptedBroker(heartbeat_ms=100)
    port = broker.start()
    broker.renew_every_period(sm_count=1, period_ms=100, valid_for_ms=300, duty=0.5)
    argv = [sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu", "--device", "cpu",
            "--cores", "1", "--broker", f"127.0.0.1:{port}", "--checkpoint-dir", str(tmp_path),
            "--inspect-addr", "127.0.0.1:0", "--metrics-addr", ""]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = p.stdout.readline()
        worker = int(line.split("worker pid ")[1].split()[0])
        meter = line.split(" meter ")[1].split(",")[0]
        assert broker.wait_for(lambda: len(broker.usage()) >= 3, 60)
        p.kill()
        p.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and os.path.exists(f"/proc/{worker}") \
                and open(f"/proc/{worker}/stat").read().split()[2] != "Z":
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{worker}") or open(f"/proc/{worker}/stat").read().split()[2] == "Z"
        subtree = os.path.dirname(os.path.dirname(meter))
        assert os.path.basename(subtree) == f"{PREFIX}{p.pid}" and os.path.isdir(subtree)   # left behind
        q = subprocess.run([*argv, "--max-seconds", "1"], cwd=ROOT, env=env, capture_output=True, timeout=120)
        assert q.returncode == 0 and not os.path.isdir(subtree)
    finally:
        broker.stop()
