"""The dashboard at 1,000 sites (issue 27 item 3), in a real headless chromium against a real run: `weaver sim`
with 4 live sites and a `weaver-xapp` configured for 1,000 (996 dark sites whose nodes never connect).

Above a dozen sites the page shows a summary table of every site, worst first, and charts only the sites an
operator opens from it: a site taken off the air must come first, the filter finds any site, a click opens
its chart with live points, and the browser's own resource timing shows series requests for the opened site
only (a chart a site would be 1,000 requests a second into the xApp's event loop)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cdp import Chromium, chromium_path
from live_run import LiveRun, http_json, until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROWS = """[...document.querySelectorAll('[data-testid=summary-row]')].map(r => ({site: r.dataset.site,
  status: r.dataset.status, drilled: r.dataset.drilled}))"""
SERIES = """performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/series'))
  .map(n => decodeURIComponent(n.split('/api/v1/sites/')[1].split('/')[0]))"""
CARDS = """[...document.querySelectorAll('[data-testid=site-card]')].map(c => ({site: c.dataset.site,
  status: c.dataset.status, points: +c.querySelector('canvas').dataset.points}))"""


@pytest.mark.timeout(200)
def test_a_thousand_sites_worst_first_with_a_drill_down(tmp_path, redis_server):
    if chromium_path() is None:
        pytest.fail("chromium is not installed (.ci/run installs the Debian chromium package)")
    asyncio.run(_scenario(tmp_path, redis_server))


async def _scenario(tmp: Path, redis: dict) -> None:
    run = browser = None
    try:
        run = LiveRun.start(tmp / "run", redis, sites=4, cells=1, absent_sites=996)
        ep = run.endpoints
        browser = await Chromium.launch(tmp / "profile", width=1400, height=1000)
        await browser.goto(ep.dashboard + "/")
        await browser.evaluate("performance.setResourceTimingBufferSize(1000000)")

        async def count_text():
            return await browser.evaluate("document.getElementById('summary-count').textContent")

        async def live_four():
            t = await count_text()
            return t if t.startswith("1000 sites") and "4 live" in t else None

        await until(live_four, 60, "1,000 sites in the summary, 4 of them live", run)
        assert await browser.evaluate("document.body.dataset.view") == "summary"
        rows = await browser.evaluate(ROWS)
        assert len(rows) == 50 and {r["status"] for r in rows} == {"waiting"}, rows[:3]   # dark sites first
        assert await browser.evaluate(CARDS) == []                       # no chart until one is opened
        assert await browser.evaluate(SERIES) == []

        # a live site taken off the air goes to the top of the table
        status, _ = http_json("POST", ep.sim_api + "/sites/1/stop")
        assert status == 200

        async def lost_first():
            r = await browser.evaluate(ROWS)
            return r if r and r[0]["site"] == "site-1" and r[0]["status"] == "lost" else None

        await until(lost_first, 30, "the stopped site-1 first, lost", run)
        assert "1 lost" in await count_text()

        # the filter finds a live site beyond the first 50 rows; a click opens its chart
        await browser.evaluate("const f = document.getElementById('site-filter'); f.value = 'site-2';"
                               "f.dispatchEvent(new Event('input'))")
        rows = await browser.evaluate(ROWS)
        assert [r["site"] for r in rows] == ["site-2"] and rows[0]["status"] == "live", rows
        await browser.evaluate("document.querySelector('[data-testid=summary-row][data-site=\"site-2\"]').click()")

        async def chart():
            c = await browser.evaluate(CARDS)
            return c if len(c) == 1 and c[0]["site"] == "site-2" and c[0]["points"] >= 10 else None

        await until(chart, 30, "site-2's chart with points", run)
        polls0 = int(await browser.evaluate("document.body.dataset.polls || 0"))
        series0 = len(await browser.evaluate(SERIES))
        await asyncio.sleep(4)
        polls = int(await browser.evaluate("document.body.dataset.polls || 0")) - polls0
        series = await browser.evaluate(SERIES)
        assert polls >= 2 and set(series) == {"site-2"}, (polls, sorted(set(series))[:5])
        assert len(series) - series0 <= polls + 1        # one series request a poll, for the one open site
        # a second click closes it again
        await browser.evaluate("document.querySelector('[data-testid=summary-row][data-site=\"site-2\"]').click()")
        assert await browser.evaluate(CARDS) == []
        await browser.screenshot(tmp / "many-sites.png")
    finally:
        if browser is not None:
            await browser.close()
        if run is not None:
            run.close()
