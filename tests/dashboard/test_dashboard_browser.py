"""The operator dashboard in a real headless Debian chromium (CDP) during a real run: `weaver sim` (2 sites)
and `weaver-xapp` as processes over RMR / SubMgr REST / Redis, plus one real training agent on site-0.

The page must show live data for every site (points drawn on every chart, checked on the canvas pixels
too), keep going when a site is taken off the air mid-run (that site is shown "lost", the other stays
live), show an agent that dies as lost, and say "xApp unreachable" when the xApp goes away, keeping
what it drew. Screenshots go to the test's tmp dir (WEAVER_DASHBOARD_SCREENSHOT=PATH keeps a copy of the
lost-site one); docs/img/dashboard.png comes from tests/dashboard/screenshot.py over `weaver up`.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from cdp import Chromium, chromium_path
from live_run import LiveRun, http_json, until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CARDS = """[...document.querySelectorAll('[data-testid=site-card]')].map(c => {
  const k = c.querySelector('canvas');
  return {site: c.dataset.site, status: c.dataset.status, why: c.querySelector('[data-testid=site-why]').textContent,
          points: +k.dataset.points, envelope: +k.dataset.envelopePoints, grant: +k.dataset.grantPoints};
})"""

# Pixels of the RAN-demand line (#1565c0, with anti-aliasing slack) on each site's canvas.
DEMAND_PIXELS = """Object.fromEntries([...document.querySelectorAll('canvas[data-testid=site-chart]')].map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i+3] > 200 && Math.abs(d[i]-0x15) < 40 && Math.abs(d[i+1]-0x65) < 40 && Math.abs(d[i+2]-0xc0) < 40) n++;
  return [c.dataset.site, n];
}))"""

AGENTS = """[...document.querySelectorAll('[data-testid=agent-row]')].map(r => ({site: r.dataset.site,
  status: r.dataset.status, cells: [...r.cells].map(td => td.textContent)}))"""


@pytest.mark.timeout(170)
def test_dashboard_shows_live_sites_then_a_lost_one(tmp_path, redis_server):
    if chromium_path() is None:
        pytest.fail("chromium is not installed (.ci/run installs the Debian chromium package)")
    asyncio.run(_scenario(tmp_path, redis_server))


async def _scenario(tmp: Path, redis: dict) -> None:
    run = browser = None
    try:
        run = LiveRun.start(tmp / "run", redis, sites=2, cells=2, agent_sites=(0,))
        ep = run.endpoints
        sites = [f"site-{i}" for i in range(len(ep.meids))]
        browser = await Chromium.launch(tmp / "profile", width=1400, height=1000)
        await browser.goto(ep.dashboard + "/")           # the xApp redirects / to /static/index.html

        async def cards():
            return {c["site"]: c for c in await browser.evaluate(CARDS) or []}

        async def all_live():
            c = await cards()
            ok = sorted(c) == sites and all(v["status"] == "live" and v["points"] >= 30 and v["envelope"] > 0
                                            for v in c.values())
            return c if ok else None

        # the operator narrows the chart window to one minute (a real change event on the select)
        await browser.evaluate("(() => { const w = document.getElementById('window'); w.value = '1';"
                               " w.dispatchEvent(new Event('change')); return w.value; })()")
        live = await until(all_live, 45, "every site live with points on its chart", run)
        await browser.screenshot(tmp / "dashboard-first-live.png")
        pixels = await browser.evaluate(DEMAND_PIXELS)
        assert all(pixels.get(s, 0) >= 15 for s in sites), pixels       # the lines really are on the canvas
        assert await browser.evaluate("document.getElementById('conn').dataset.state") == "ok"

        async def agent_training():
            rows = await browser.evaluate(AGENTS) or []
            ok = [r for r in rows if r["site"] == "site-0" and r["status"] == "connected"]
            return ok or None
        agent = await until(agent_training, 45, "site-0's agent shown connected", run)
        assert agent[0]["cells"][1] == "agent-0", agent
        ctl = await browser.evaluate("[...document.querySelectorAll('[data-testid=control-row]')]"
                                     ".map(r => r.dataset.outcome)")
        assert "ack" in ctl, ctl                                          # RC controls the nodes ACKed
        subs = await browser.evaluate("[...document.querySelectorAll('[data-testid=subscription-row]')]"
                                      ".map(r => [r.dataset.site, r.dataset.state])")
        assert sorted(subs) == [[s, "active"] for s in sites], subs       # each node's KPM subscription
        await browser.screenshot(tmp / "dashboard-live.png")

        # take site-1 off the air: its card turns "lost", site-0 keeps updating
        status, doc = http_json("POST", ep.sim_api + "/sites/1/stop")
        assert status == 200, doc
        before = live["site-0"]["points"]

        async def site1_lost():
            c = await cards()
            ok = c.get("site-1", {}).get("status") == "lost" and c["site-0"]["status"] == "live"
            return c if ok else None
        after = await until(site1_lost, 20, "site-1 shown lost while site-0 stays live", run)
        assert after["site-0"]["points"] > before, (before, after)       # still drawing the live site
        assert "KPM" in after["site-1"]["why"], after["site-1"]
        shot = await browser.screenshot(tmp / "dashboard-site-lost.png")
        assert shot.stat().st_size > 20_000
        if os.environ.get("WEAVER_DASHBOARD_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["WEAVER_DASHBOARD_SCREENSHOT"])

        # site-0's agent dies: its row turns "lost", the site itself stays live
        run.sup.stop(run.sup.get("agent:0"), timeout=5.0)

        async def agent_lost():
            rows = await browser.evaluate(AGENTS) or []
            c = await cards()
            ok = [r for r in rows if r["site"] == "site-0" and r["status"] == "lost"] and c["site-0"]["status"] == "live"
            return rows if ok else None
        await until(agent_lost, 20, "site-0's agent shown lost while the site stays live", run)

        # the xApp goes away: the page says so and keeps what it drew
        run.sup.stop(run.sup.get("xapp"))

        async def unreachable():
            text = await browser.evaluate("document.getElementById('conn').textContent")
            return text if "xApp unreachable" in text else None
        await until(unreachable, 15, "'xApp unreachable'", run)
        left = await cards()
        assert sorted(left) == sites and left["site-0"]["points"] > 0, left
        await browser.screenshot(tmp / "dashboard-unreachable.png")
    finally:
        if browser is not None:
            await browser.close()
        if run is not None:
            run.close()
            assert not [c.name for c in run.sup.children if c.alive]
