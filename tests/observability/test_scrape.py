"""Scrape a running xApp and a running agent as Prometheus does, and read their logs as a RIC's log
collector does.

One testbed site (E2 node + mini-RIC in this process), the real xApp (`python -m xapp`, its config saying
`log_format: mdc`) and a real CPU agent (`agent.cli run` in the agent venv, WEAVER_LOG_FORMAT=mdc) that
trains under the xApp's leases; the node's KPM is muted once so the lease is revoked (stale-kpm) and the
agent goes idle. Then, with prometheus_client's own text parser:
- every family has HELP and a TYPE, and every histogram has its buckets (cumulative, +Inf = count);
- the distributions issue 19 names were observed (KPM age at decision, loop step, RC round trip, grant ->
  first launch, revoke -> idle, window overrun);
- every metric docker/grafana/weaver.json queries is in one of the two scrapes;
and every line both processes logged is a JSON object with mdclogpy's fields.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import SimBed, XappProcess, free_port, until, xapp_config  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "grafana" / "weaver.json"
MDC_FIELDS = {"PID", "SYSTEM_NAME", "HOST_NAME", "SERVICE_NAME", "CONTAINER_NAME", "POD_NAME"}
XAPP_HISTOGRAMS = ("weaver_kpm_age_at_decision_seconds", "weaver_loop_step_seconds",
                   "weaver_control_round_trip_seconds")
AGENT_HISTOGRAMS = ("weaver_agent_lease_first_launch_seconds", "weaver_agent_yield_seconds",
                    "weaver_agent_overrun_seconds")


async def _scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain"), r.headers
        return await r.text()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _count(fams: dict, name: str, **labels) -> float:
    f = fams.get(name)
    return sum(s.value for s in (f.samples if f else ()) if s.name == name + "_count"
               and all(s.labels.get(k) == v for k, v in labels.items()))


def _check_exposition(text: str, who: str) -> dict:
    fams = _families(text)
    assert fams, f"{who}: nothing scraped"
    for f in fams.values():
        assert f.documentation.strip(), f"{who}: {f.name} has no HELP"
        assert f.type in ("counter", "gauge", "histogram"), f"{who}: {f.name} is {f.type!r} (no TYPE?)"
        if f.type != "histogram":
            continue
        series: dict[tuple, list] = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, []).append(s)
        for key, samples in series.items():
            buckets = [(float(s.labels["le"]), s.value) for s in samples if s.name == f.name + "_bucket"]
            assert len(buckets) > 2 and buckets[-1][0] == float("inf"), f"{who}: {f.name}{key} has no buckets"
            assert [le for le, _ in buckets] == sorted(le for le, _ in buckets)
            assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False)), f"{f.name} not cumulative"
            [count] = [s.value for s in samples if s.name == f.name + "_count"]
            assert count == buckets[-1][1] and any(s.name == f.name + "_sum" for s in samples)
    # the text itself: a HELP before each TYPE, no family twice
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)) == len(re.findall(r"^# HELP (\S+) ", text, re.M))
    return fams


def _names(fams: dict) -> set[str]:
    out = set()
    for f in fams.values():
        out |= {f.name, *(s.name for s in f.samples)} | ({f.name + "_total"} if f.type == "counter" else set())
    return out


def dashboard_metrics() -> set[str]:
    """Every metric name in the dashboard's PromQL (panel targets and template-variable queries)."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]
    for v in doc.get("templating", {}).get("list", ()):
        q = v.get("query")
        exprs.append(q.get("query", "") if isinstance(q, dict) else str(q or ""))
    # identifiers in PromQL outside strings and label matchers; ours all start weaver_
    return {m for e in exprs for m in re.findall(r"\b(weaver_[A-Za-z0-9_]+)\b", re.sub(r'"[^"]*"', '""', e))}


def _mdc_lines(path: Path, component: str) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    assert lines, f"{path.name}: nothing logged"
    out = []
    for ln in lines:
        rec = json.loads(ln)            # every line, not just those that look like JSON
        assert list(rec) == ["ts", "crit", "id", "mdc", "msg"], rec
        assert rec["id"] == component and rec["crit"] in ("DEBUG", "INFO", "WARNING", "ERROR")
        assert MDC_FIELDS <= set(rec["mdc"]) and rec["mdc"]["POD_NAME"] == "weaver-test-0", rec
        assert isinstance(rec["ts"], int) and abs(rec["ts"] / 1000 - time.time()) < 600
        out.append(rec)
    return out


def test_dashboard_is_grafana_json_over_these_metrics():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["panels"] and all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
    names = dashboard_metrics()
    for h in XAPP_HISTOGRAMS + AGENT_HISTOGRAMS:            # as heatmaps or quantiles
        assert h + "_bucket" in names, h
    for m in ("weaver_site_envelope_sms", "weaver_site_grant_sms", "weaver_site_used_sms_seconds_total",
              "weaver_site_deadline_misses_total", "weaver_site_waterfall_sm_seconds",
              "weaver_site_waterfall_lost_sm_seconds"):
        assert m in names, m
    kinds = {p["type"] for p in doc["panels"]}
    assert {"heatmap", "timeseries", "bargauge"} <= kinds


def test_running_xapp_and_agent_scrape_and_log_clean(tmp_path, redis_env, agent_python, monkeypatch):
    monkeypatch.setenv("POD_NAME", "weaver-test-0")       # an MDC field both processes must carry
    monkeypatch.delenv("WEAVER_LOG_FORMAT", raising=False)
    asyncio.run(_run(tmp_path, redis_env, agent_python))


async def _run(tmp: Path, redis: dict, agent_python: Path) -> None:
    rmr_port, broker_port = free_port(), free_port()
    tb = await SimBed.start(tmp, rmr_port, n_sites=1)
    x = agent = None
    agent_log = tmp / "agent.log"
    try:
        cfg_path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=broker_port, mode="quota", stale_periods=1.5)
        doc = json.loads(cfg_path.read_text())
        doc["controls"]["log_format"] = "mdc"               # the config, not the environment, asks for it
        cfg_path.write_text(json.dumps(doc))
        x = await XappProcess.start(sys.executable, cfg_path, redis, tmp / "xapp.log")
        await x.wait_ready()
        env = dict(os.environ, PYTHONPATH=str(ROOT), WEAVER_LOG_FORMAT="mdc")
        with open(agent_log, "wb") as err:
            agent = subprocess.Popen(
                [str(agent_python), "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu",
                 "--broker", f"127.0.0.1:{broker_port}", "--site-id", "site-0", "--agent-id", "agent-0",
                 "--cores", "1", "--device", "cpu", "--checkpoint-dir", str(tmp / "ckpt"),
                 "--inspect-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--max-seconds", "120"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        line = await asyncio.wait_for(asyncio.to_thread(agent.stdout.readline), 60)
        assert "metrics on " in line, (line, agent_log.read_text()[-2000:])
        agent_metrics = "http://" + line.split("metrics on ", 1)[1].split(",")[0].strip() + "/metrics"

        async def trained():        # the agent ran under a lease and closed windows
            fams = _families(await _scrape(agent_metrics))
            return (_count(fams, "weaver_agent_lease_first_launch_seconds") > 0
                    and _count(fams, "weaver_agent_overrun_seconds") > 2)
        await until(trained, 60, "the agent to launch under a lease")

        tb.muted.add(tb.meids[0])                            # stale KPM: the xApp revokes, the agent yields
        await until(lambda: _revoked(agent_metrics), 15, "the agent to go idle after a revocation")
        tb.muted.clear()

        async def decided():
            fams = _families(await _scrape(x.rest + "/ric/v1/metrics"))
            return all(_count(fams, h) > 0 for h in XAPP_HISTOGRAMS) and fams
        await until(decided, 20, "decisions and acknowledged controls")

        xapp_text = await _scrape(x.rest + "/ric/v1/metrics")
        agent_text = await _scrape(agent_metrics)
        xf, af = _check_exposition(xapp_text, "xApp"), _check_exposition(agent_text, "agent")
        assert _count(xf, "weaver_control_round_trip_seconds", site="site-0", outcome="ack") > 0
        assert _count(af, "weaver_agent_yield_seconds", site="site-0", cause="revoked") > 0
        revoked = {s.labels["reason"]: s.value for s in xf["weaver_lease_revocations"].samples}
        assert revoked.get("stale-kpm", 0) >= 1, revoked
        ended = {s.labels["reason"]: s.value for s in xf["weaver_broker_revocations"].samples}
        assert ended.get("stale-kpm", 0) >= 1, ended                  # the agent's lease, ended by the broker
        assert (await _scrape(x.rest + "/metrics")).count("# TYPE") == xapp_text.count("# TYPE")
        missing = dashboard_metrics() - _names(xf) - _names(af)
        assert not missing, f"the dashboard queries metrics neither process exposes: {sorted(missing)}"
    finally:
        if agent is not None:
            agent.terminate()
            await asyncio.to_thread(agent.wait, 30)
        if x is not None:
            await x.stop()
        await tb.close()
    xlog = _mdc_lines(tmp / "xapp.log", "weaver-xapp")
    alog = _mdc_lines(agent_log, "weaver-agent")
    assert any("lease revoked (stale-kpm)" in r["msg"] for r in xlog), [r["msg"] for r in xlog][-20:]
    assert {r["mdc"]["logger"] for r in alog} & {"weaver.agent", "weaver.agent.site"}, alog[-5:]


async def _revoked(url: str) -> bool:
    return _count(_families(await _scrape(url)), "weaver_agent_yield_seconds", cause="revoked") > 0
