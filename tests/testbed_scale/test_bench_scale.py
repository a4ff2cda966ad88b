"""`weaver bench scale` runs the replica's deployed path at two site counts into a private real Redis and
writes self-describing JSON and a plot; bad arguments get one clear line."""
from __future__ import annotations

import argparse
import json

import pytest
import redis

from testbed.bench import scale


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    scale.add_arguments(p)
    return p.parse_args(list(argv))


def test_bench_scale_smoke(tmp_path, capsys, redis_server):
    where = f"{redis_server['host']}:{redis_server['port']}"
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    assert scale.run(_args("--sites", "4,16", "--periods", "3", "--no-handover", "--sessions", "none", "--tier-sites", "none",
                           "--redis", where, "--json", str(out), "--plot", str(png))) == 0
    doc = json.loads(out.read_text())
    assert doc["ledger_backend"] == f"redis {where}" and doc["handover"] is None
    assert [r["sites"] for r in doc["rows"]] == [4, 16]
    for r in doc["rows"]:
        assert r["indications"] == 3 * r["sites"]
        assert r["lease_decisions"] > 0 and r["lease_decisions_per_s"] > 0      # agents connected: leases flow
        assert 0 < r["tick_p50_ms"] <= r["tick_p99_ms"] <= r["tick_max_ms"]
        assert r["memory_kib_per_site"] > 0 and r["cpu_us_per_indication"] > r["ingest_us_per_indication"] > 0
    assert doc["rows"][0]["cpu_per_indication_vs_baseline"] == 1.0
    cap = doc["capacity"]
    assert cap["from_row_sites"] == 16 and cap["sites_per_replica"] >= 1 and cap["replicas_for_region"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "weaver bench scale" in capsys.readouterr().out
    # the bench's namespace is gone from the Redis it wrote to
    assert not list(redis.Redis(redis_server["host"], redis_server["port"]).scan_iter(match="{weaver-bench-scale*"))


@pytest.mark.parametrize("bad", ["abc", "0,10", "", "10,x"])
def test_bad_site_lists_get_one_line(bad):
    with pytest.raises(SystemExit) as e:
        scale.run(_args("--sites", bad, "--no-handover"))
    assert "--sites" in str(e.value)
    with pytest.raises(SystemExit) as e:
        scale.run(_args("--sites", "3", "--tier-sites", "5000"))
    assert "--tier-sites" in str(e.value)


def test_the_tier_rows_put_every_site_in_every_quorum_through_a_gate_of_one_relay_thread(tmp_path, redis_server,
                                                                                        repo_root):
    """agent.tierregion under the bench: a gated Lighthouse and 12 model sites, each through its own egress with
    its own pass; every site in a quorum, one quorum of all of them, nothing failed, and the gate's process runs 3 threads (main,
    accept, relay), not two a connection."""
    if not (repo_root / ".venv-agent" / "bin" / "python").exists():
        pytest.fail("the agent venv is missing (scripts/bootstrap)")
    where = f"{redis_server['host']}:{redis_server['port']}"
    out = tmp_path / "s.json"
    assert scale.run(_args("--sites", "3", "--periods", "2", "--no-handover", "--redis", where, "--sessions", "none",
                           "--tier-sites", "12", "--json", str(out))) == 0
    (row,) = json.loads(out.read_text())["tier"]
    assert row["ran"] and row["sites_joined"] == 12 and row["sites_in_a_quorum"] == 12, row
    assert row["quorum_sites_max"] == 12 and row["quorums"] >= 12, row
    assert row["quorum_failures"] == 0 and row["heartbeat_failures"] == 0 and row["heartbeats"] > 0, row
    assert row["gate_process_threads"] <= 4 and row["gate_max_connections"] >= 24, row


def test_the_live_broker_stage_serves_model_agents_over_grpc(tmp_path, redis_server, repo_root):
    """Five agent.loadmodel agents (the agent's real lease client and enforcer, in the agent venv) register with
    their site credentials, get every lease the loop grants, report usage the broker accepts, and stay connected."""
    if not (repo_root / ".venv-agent" / "bin" / "python").exists():
        pytest.fail("the agent venv is missing (scripts/bootstrap)")
    where = f"{redis_server['host']}:{redis_server['port']}"
    out = tmp_path / "s.json"
    assert scale.run(_args("--sites", "3", "--periods", "2", "--no-handover", "--redis", where, "--sessions", "5",
                           "--sessions-seconds", "2", "--tier-sites", "none", "--json", str(out), "--plot", str(tmp_path / "s.png"))) == 0
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    (row,) = json.loads(out.read_text())["sessions"]
    assert row["ran"] and row["sessions_connected"] == 5, row
    a = row["agents"]
    assert a["sites_connected"] == 5 and a["disconnects"] == 0 and a["redirects"] == 0, a
    assert row["leases_granted_whole_run"] > 0 and a["leases_received"] == row["leases_granted_whole_run"], (row, a)
    assert 0 <= a["lease_delivery_ms_p50"] <= a["lease_delivery_ms_p99"] <= a["lease_delivery_ms_max"]
    assert row["sites_with_usage_accepted"] == 5 and row["usage_reports_refused"] == {}, row
    assert a["leases_received_past_hard_end"] == 0, a
