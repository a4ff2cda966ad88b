"""The utilisation waterfall from one real `weaver up` run (1 site, 20 s: the world, the mini-RIC, the
xApp, a training agent, the cross-site Lighthouse, as processes), read twice: by a headless chromium on
the xApp's dashboard while it runs, and from the run's `--json` summary once it has stopped.

The summary's usable spare and used come from the platform's ground truth (the model's RAN peak, the
agent process's CPU clock); granted from the xApp, held from the agent's reports. Every leg's causes
must add up to its difference, and the one residual (`metering skew`, where the platform's meter and
the xApp's or the agent's disagree) must stay small: a cause that is not measured would show there.
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

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dashboard"))
from cdp import Chromium, chromium_path  # noqa: E402

pytestmark = pytest.mark.slow

DURATION_S = 20
STAGES = ("spare_above_peak", "usable", "granted", "held", "used")
WATERFALL = """[...document.querySelectorAll('canvas[data-testid=site-waterfall]')].map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i+3] > 200) ink++;
  const card = c.closest('[data-testid=site-card]');
  return {site: c.dataset.site, stages: +c.dataset.stages, causes: +(c.dataset.causes || 0), ink,
          used: +(c.dataset.usedOverUsable || 0),
          label: c.getAttribute('aria-label') || '',
          keys: [...card.querySelectorAll('[data-testid=waterfall-cause]')].map(k => k.textContent),
          text: card.querySelector('[data-testid=site-waterfall-causes]').textContent};
})"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, repo_root):
    """`weaver up` for DURATION_S with the dashboard watched in chromium halfway; (summary, page, output)."""
    tmp = tmp_path_factory.mktemp("waterfall")
    summary = tmp / "s.json"
    proc = subprocess.Popen([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", "--sites", "1",
                             "--duration", str(DURATION_S), "--json", str(summary), "--run-dir", str(tmp / "run")],
                            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    page = None
    try:
        deadline = time.monotonic() + 180
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"weaver up: dashboard\s+(http://\S+)", line)
            if m:
                url = m.group(1)
        assert url, "".join(lines)[-4000:]
        if chromium_path() is not None:
            page = asyncio.run(_watch(url, tmp / "profile", proc, lines))
        else:
            time.sleep(DURATION_S / 2)
        scraped = asyncio.run(_scrape(url))       # mid-run: the REST waterfall and /metrics
        out, _ = proc.communicate(timeout=180)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = "".join(lines)
    assert proc.returncode == 0, text[-4000:]
    return json.loads(summary.read_text()), page, text, scraped


async def _watch(url: str, profile: Path, proc, lines: list[str]) -> list | None:
    """The dashboard once its waterfall chart shows every stage, some SM·s used and some lost by cause."""
    browser = await Chromium.launch(profile, width=1200, height=900)
    try:
        await browser.goto(url)
        last = None
        for _ in range(DURATION_S * 2):
            last = await browser.evaluate(WATERFALL)
            if last and all(c["stages"] == 4 and c["causes"] > 0 and c["used"] > 0 and c["ink"] > 500 for c in last):
                break
            await asyncio.sleep(0.5)
        if os.environ.get("WEAVER_WATERFALL_SCREENSHOT"):   # keep a picture of what was checked
            await browser.screenshot(Path(os.environ["WEAVER_WATERFALL_SCREENSHOT"]))
        return last
    finally:
        await browser.close()


async def _scrape(url: str) -> dict:
    """The xApp's REST waterfall and its /metrics, one right after the other."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        async with s.get(url.rstrip("/") + "/api/v1/waterfall") as r:
            rest = await r.json()
        async with s.get(url.rstrip("/") + "/metrics") as r:
            metrics = await r.text()
    return {"rest": rest, "metrics": metrics}


def test_every_leg_of_the_waterfall_adds_up_and_names_its_causes(run):
    s, _, out, _ = run
    site = s["sites"]["site-0"]
    wf = site["waterfall"]
    st = wf["stages_sm_s"]
    assert list(st) == list(STAGES)
    assert st["usable"] == pytest.approx(site["usable_spare_sm_s"])          # the platform's figures
    assert st["used"] == pytest.approx(site["sm_seconds_used_in_lease"])
    assert 0 < st["used"] <= st["held"] and 0 < st["granted"] <= st["usable"] < st["spare_above_peak"]
    # the stages are what their owners measured: granted is the xApp's (its counter, a period per grant)
    assert st["granted"] == pytest.approx(site["sm_seconds_granted"], rel=0.05)
    legs = {(leg["from"], leg["to"]): leg for leg in wf["legs"]}
    assert list(legs) == list(zip(STAGES, STAGES[1:], strict=False))
    for (a, b), leg in legs.items():
        assert leg["lost_sm_s"] == pytest.approx(st[a] - st[b], abs=1e-6)
        assert sum(leg["causes_sm_s"].values()) == pytest.approx(leg["lost_sm_s"], abs=1e-6), leg
        # the residual is small against what flows through the leg: the causes are measured, not inferred
        skew = abs(leg["causes_sm_s"].get("metering skew", 0.0))
        assert skew <= 0.06 * st[a], (leg, st)
    head = legs[("spare_above_peak", "usable")]["causes_sm_s"]
    periods = wf["platform_meter"]["periods"]
    assert head["guard"] == pytest.approx(s["guard_sms"] * periods * s["period_ms"] / 1000, rel=0.05)
    agent = legs[("held", "used")]["causes_sm_s"]
    assert set(agent) - {"metering skew"} <= {"host-starvation", "nothing-fits", "round-wait", "host-reserve",
                                              "agent-loop", "enforcer-closing-term", "beyond-grant"}
    assert sum(v for k, v in agent.items() if k != "metering skew") > 0
    # the total is the sum of the sites (one here), in the same shape
    assert s["totals"]["waterfall"]["stages_sm_s"] == pytest.approx(st)
    assert "waterfall" in out and "metering skew" in out     # the live line and the final line


def test_the_dashboard_draws_the_waterfall_of_every_site(run):
    if chromium_path() is None:
        pytest.fail("chromium is not installed (.ci/run installs the Debian chromium package)")
    _, page, _, _ = run
    assert page, "the dashboard never drew a waterfall"
    (card,) = page
    assert card["site"] == "site-0"
    assert card["stages"] == 4 and card["causes"] > 0 and card["ink"] > 500 and 0 < card["used"] <= 1, card
    assert re.search(r"usable \d+ > granted \d+ > held \d+ > used \d+", card["label"]), card
    assert card["keys"] and "SM·s lost" in card["text"], card


def test_rest_and_metrics_serve_the_xapps_waterfall(run):
    """GET /api/v1/waterfall (the xApp's own meters) adds up too, and /metrics carries its stages and causes."""
    _, _, _, scraped = run
    rest = scraped["rest"]
    wf = rest["sites"]["site-0"]
    st = wf["stages_sm_s"]
    assert list(st) == ["usable", "granted", "held", "used"] and st["used"] > 0
    for leg in wf["legs"]:
        assert sum(leg["causes_sm_s"].values()) == pytest.approx(leg["lost_sm_s"], abs=1e-6), leg
    assert rest["total"]["stages_sm_s"] == pytest.approx(st)
    gauges = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^weaver_site_waterfall_sm_seconds\{site="site-0",stage="(\w+)"\} (\S+)$', scraped["metrics"], re.M)}
    assert set(gauges) == set(st)
    for k, v in st.items():   # read a moment later: at most a second of the run more
        assert v <= gauges[k] <= v + 132 * 1.5, (k, v, gauges[k])
    lost = re.findall(r'^weaver_site_waterfall_lost_sm_seconds\{cause="([^"]+)",site="site-0"\}', scraped["metrics"], re.M)
    assert any(c.startswith("held-used/") for c in lost) and any(c.startswith("usable-granted/") for c in lost), lost
