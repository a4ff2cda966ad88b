"""`python -m xapp.rmr listen|send|probe` as an operator runs them: real subprocesses over loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rmr_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RMR_")}
    e["PYTHONPATH"] = str(ROOT)
    e["RMR_SRC_ID"] = "127.0.0.1"
    return e


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "xapp.rmr", *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture()
def listener():
    """A `listen` process on a free port; yields (port, process); always killed at the end."""
    procs = []

    def start(*extra: str):
        port = free_port()
        p = subprocess.Popen([PY, "-m", "xapp.rmr", "listen", "--port", str(port), *extra], cwd=ROOT, env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stderr.readline()  # the readiness line
        assert json.loads(line)["listening"] == port, line
        return port, p
    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def table(tmp_path, port: int, mtype: int = 12050) -> str:
    path = tmp_path / "rt"
    path.write_text(f"newrt|start\nrte|{mtype}|127.0.0.1:{port}\nmse|12040|-1|%meid\nnewrt|end|2\n"
                    f"meid_map|start\nmme_ar|127.0.0.1:{port}|gnb1\nmeid_map|end|1\n")
    return str(path)


def test_send_to_listen_prints_json_lines(listener, tmp_path):
    port, proc = listener("--count", "2")
    rt = table(tmp_path, port)
    r1 = cli("send", "--rt", rt, "--mtype", "12050", "--sub-id", "7", "--payload-hex", "deadbeef")
    r2 = cli("send", "--rt", rt, "--mtype", "12040", "--meid", "gnb1", "--payload-hex", "00ff")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    out, err = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(m["mtype"], m["sub_id"], m["meid"], m["payload"]) for m in lines] == [
        (12050, 7, "", "deadbeef"), (12040, -1, "gnb1", "00ff")]
    assert all(m["src"].startswith("127.0.0.1:") for m in lines)
    assert proc.returncode == 0


def test_send_waits_for_a_reply(listener, tmp_path):
    port, _ = listener("--reply-mtype", "12051")
    r = cli("send", "--rt", table(tmp_path, port), "--mtype", "12050", "--payload-hex", "01", "--wait-reply", "10")
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout.splitlines()[-1])
    assert reply["mtype"] == 12051 and reply["payload"] == "01"


def test_send_errors_are_clear(tmp_path):
    rt = table(tmp_path, free_port())
    r = cli("send", "--rt", rt, "--mtype", "999", "--payload-hex", "00")
    assert r.returncode == 1 and "NOENDPT" in r.stderr
    r = cli("send", "--rt", rt, "--mtype", "12050", "--payload-hex", "00")  # nobody listens there
    assert r.returncode == 1 and "SENDFAILED" in r.stderr
    r = cli("send", "--rt", rt, "--mtype", "12050", "--payload-hex", "zz")
    assert r.returncode == 2 and "bad message" in r.stderr
    bad = tmp_path / "bad.rt"
    bad.write_text("newrt|start\nrte|1|a:1\n")
    r = cli("send", "--rt", str(bad), "--mtype", "1")
    assert r.returncode == 1 and "did not commit" in r.stderr


def test_probe_live_endpoint(listener):
    port, proc = listener()
    r = cli("probe", f"127.0.0.1:{port}", "--timeout", "10")
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.stdout, r.stderr)
    assert proc.poll() is None  # the listener is not bothered (health checks never reach the app)


def test_probe_dead_port_fails_fast():
    r = cli("probe", f"127.0.0.1:{free_port()}", "--timeout", "2")  # cli() times out if it hangs
    assert r.returncode == 1 and r.stdout.startswith("FAIL") and "SENDFAILED" in r.stdout


def test_probe_bad_target():
    r = cli("probe", "no-port-here")
    assert r.returncode == 2


def test_probe_silent_peer_times_out():
    import socket
    with socket.socket() as s:  # accepts connections, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = cli("probe", f"127.0.0.1:{s.getsockname()[1]}", "--timeout", "0.5")
    assert r.returncode == 1 and "no health-check reply" in r.stdout
