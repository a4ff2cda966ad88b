"""`weaver-agent` end to end: a real agent process (`weaver-agent run`) leased by a real gRPC broker,
inspected by the CLI in other processes; plus the unreachable case."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.broker import ScriptedBroker
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, timeout=30):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def running_agent(tmp_path_factory):
    broker = ScriptedBroker(heartbeat_ms=100)
    port = broker.start()
    broker.renew_every_period(sm_count=1, period_ms=100, valid_for_ms=300, duty=0.5)
    ckpt = tmp_path_factory.mktemp("ckpt")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu",
                             "--broker", f"127.0.0.1:{port}", "--site-id", "site-7", "--cores", "1",
                             "--device", "cpu", "--checkpoint-dir", str(ckpt), "--inspect-addr", "127.0.0.1:0",
                             "--metrics-addr", "127.0.0.1:0",
                             "--max-seconds", "120"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "inspect on " in line, line
    addr = line.rsplit("inspect on ", 1)[1].strip()
    metrics = line.split("metrics on ", 1)[1].split(",")[0].strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:       # wait until it has trained under a few leases
        r = cli("status", "--addr", addr, "--json")
        if r.returncode == 0 and int(json.loads(r.stdout)["step"]) >= 3:
            break
        time.sleep(0.2)
    yield {"addr": addr, "proc": proc, "broker": broker, "ckpt": ckpt, "metrics": metrics}
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    broker.stop()


def test_status_table_and_json(running_agent):
    r = cli("status", "--addr", running_agent["addr"])
    assert r.returncode == 0, r.stderr
    for field in ("site", "mode", "device", "lease", "step", "loss", "checkpoint"):
        assert field in r.stdout
    assert "site-7" in r.stdout and "connected" in r.stdout
    st = json.loads(cli("status", "--addr", running_agent["addr"], "--json").stdout)
    assert st["site_id"] == "site-7" and st["device"] == "cpu" and st["connected"] is True
    assert int(st["step"]) >= 3 and int(st["tokens"]) > 0 and st["mode"] == "gpu"


def test_watch_prints_one_line_per_period_with_a_progress_bar(running_agent):
    r = cli("watch", "--addr", running_agent["addr"], "--count", "4")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 4
    assert all("[" in ln and "]" in ln and "ms" in ln for ln in lines)
    js = cli("watch", "--addr", running_agent["addr"], "--count", "2", "--json")
    assert [json.loads(ln)["site_id"] for ln in js.stdout.strip().splitlines()] == ["site-7", "site-7"]


def test_metrics_endpoint_exports_the_agent_measurements(running_agent):
    import urllib.error
    import urllib.request
    text = urllib.request.urlopen(f"http://{running_agent['metrics']}/metrics", timeout=10).read().decode()
    for name in ("weaver_agent_step", "weaver_agent_tokens_total", "weaver_agent_overrun_ms_p99",
                 "weaver_agent_used_busy_ms_total", "weaver_agent_nvml_available"):
        assert f"# TYPE {name} " in text
    assert 'weaver_agent_mode{mode="gpu",site="site-7"} 1.0' in text
    assert 'weaver_agent_nvml_available{site="site-7"} 0.0' in text          # no driver here: optional
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{running_agent['metrics']}/nope", timeout=10)


def test_leases_history(running_agent):
    r = cli("leases", "--addr", running_agent["addr"], "--limit", "5")
    assert r.returncode == 0 and r.stdout.splitlines()[0].split()[:2] == ["lease", "units"]
    assert 2 <= len(r.stdout.splitlines()) <= 6
    hist = json.loads(cli("leases", "--addr", running_agent["addr"], "--json").stdout)["leases"]
    assert hist and all(h["end"] in ("active", "replaced", "expired", "revoked") for h in hist)
    assert sum(h["granted_ms"] for h in hist) > 0 and sum(h["used_ms"] for h in hist) > 0
    bad = cli("leases", "--addr", running_agent["addr"], "--limit", "100000")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr


def test_forced_checkpoint_and_clean_shutdown(running_agent):
    r = cli("checkpoint", "--addr", running_agent["addr"], "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert Path(rep["path"]).exists() and Path(rep["path"]).parent == running_agent["ckpt"]
    assert running_agent["broker"].sessions == 1          # one stream held for the whole module, no reconnects
    proc = running_agent["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert sorted(p.name for p in running_agent["ckpt"].iterdir())[-1].startswith("ckpt-")


def test_unreachable_agent_gives_a_clear_error():
    addr = f"127.0.0.1:{free_port()}"
    for cmd in ("status", "leases", "checkpoint", "watch"):
        r = cli(cmd, "--addr", addr)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"no agent reachable at {addr}" in r.stderr and "Traceback" not in r.stderr


def test_bad_config_is_refused(tmp_path):
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({"train": {"lr": -1}}))
    r = cli("run", "--config", str(cfg))
    assert r.returncode == 2 and "TrainConfig.lr" in r.stderr
    cfg.write_text(json.dumps({"trian": {}}))
    r = cli("run", "--config", str(cfg))
    assert r.returncode == 2 and "unknown keys" in r.stderr


def test_inspection_port_in_use_is_refused_not_shared(tmp_path):
    from dataclasses import replace

    from agent.config import tiny_cpu
    from agent.inspect_service import serve_inspect
    from agent.monitors import cpu_facts
    from agent.site_agent import SiteAgent
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(1))
    first, addr = serve_inspect(agent, "127.0.0.1:0")
    try:
        with pytest.raises(OSError, match="cannot listen"):
            serve_inspect(agent, addr)
        from agent.cli import _listen
        with pytest.raises(OSError):                                  # asked for explicitly: an error
            _listen(serve_inspect, agent, addr, explicit=True)
        second, addr2 = _listen(serve_inspect, agent, addr, explicit=False)   # only the default: any free port
        assert addr2 != addr
        second.stop(0)
    finally:
        first.stop(0)
