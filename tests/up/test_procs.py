"""The supervisor that `weaver up` uses: learns endpoints from child output and leaves no orphans."""
import os
import sys
import textwrap
import time

import pytest

from testbed.procs import ChildFailed, Supervisor


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_wait_for_line_and_group_kill_leaves_no_orphan(tmp_path):
    code = textwrap.dedent("""
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("grandchild", g.pid, flush=True)
        print("listening on 127.0.0.1:4242", flush=True)
        time.sleep(60)
    """)
    sup = Supervisor(log_dir=tmp_path)
    child = sup.start("demo", [sys.executable, "-c", code])
    m = child.wait_for_line(r"listening on (\S+)", timeout=20)
    assert m.group(1) == "127.0.0.1:4242"
    gpid = int(child.wait_for_line(r"grandchild (\d+)", timeout=5).group(1))
    sup.stop_all(timeout=5)
    deadline = time.monotonic() + 5
    while _alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.alive
    assert not _alive(gpid)
    assert "listening on" in (tmp_path / "demo.log").read_text()


def test_child_exit_before_line_is_reported():
    sup = Supervisor()
    child = sup.start("bad", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    with pytest.raises(ChildFailed, match="exited with 3"):
        child.wait_for_line("never", timeout=20)
    sup.stop_all()


def test_a_group_is_signalled_at_once_then_waited_for(tmp_path):
    # Each child logs when SIGTERM reaches it and when it exits, 0.5 s later (an agent finishing its
    # round). Stopped as a group, the second hears SIGTERM before the first has exited.
    code = textwrap.dedent("""
        import signal, sys, time
        def term(*_):
            print("term", time.time(), flush=True)
            time.sleep(0.5)
            print("exit", time.time(), flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("ready", flush=True)
        time.sleep(60)
    """)
    sup = Supervisor(log_dir=tmp_path)
    kids = [sup.start(f"agent:{i}", [sys.executable, "-c", code]) for i in range(2)]
    for k in kids:
        k.wait_for_line("ready", timeout=20)
    sup.stop_all(["agent"], timeout=5)
    first_exit = float(kids[0].wait_for_line(r"exit (\S+)", timeout=1).group(1))
    second_term = float(kids[1].wait_for_line(r"term (\S+)", timeout=1).group(1))
    assert second_term < first_exit
    assert not any(k.alive for k in kids)
