"""The dashboard's files as the xApp serves them (no browser): `/` leads to the page, every asset the page
names is served with the right type, and every element the script looks up by id exists in the page."""
from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser

from aiohttp.test_utils import TestClient, TestServer

from xapp.rest import STATIC, build_app


class Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.assets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "script" and a.get("src"):
            self.assets.append(a["src"])
        if tag == "link" and a.get("rel") == "stylesheet":
            self.assets.append(a["href"])
        if tag == "a" and (a.get("href") or "").startswith("/"):
            self.assets.append(a["href"])


async def _served() -> None:
    # The static routes never touch the running xApp, so none is needed here.
    async with TestClient(TestServer(build_app(None))) as client:
        r = await client.get("/", allow_redirects=False)
        assert r.status == 302 and r.headers["Location"] == "/static/index.html"
        r = await client.get("/")
        assert r.status == 200 and r.content_type == "text/html"
        refs = Refs()
        refs.feed(await r.text())
        assert "/static/dashboard.js" in refs.assets and "/static/dashboard.css" in refs.assets, refs.assets
        types = {".js": "javascript", ".css": "text/css", ".json": "json", "/metrics": ""}
        for path in refs.assets:
            if path in ("/openapi.json", "/metrics"):
                continue                            # served by the API handlers, need a running xApp
            r = await client.get(path)
            assert r.status == 200, path
            want = next(v for k, v in types.items() if path.endswith(k))
            assert want in r.content_type, (path, r.content_type)
        r = await client.get("/static/%2e%2e/rest.py")
        assert r.status in (403, 404)                 # no escaping the static directory


def test_page_and_assets_are_served():
    asyncio.run(_served())


def test_every_id_the_script_uses_is_in_the_page():
    page = (STATIC / "index.html").read_text()
    script = (STATIC / "dashboard.js").read_text()
    refs = Refs()
    refs.feed(page)
    used = set(re.findall(r'\$\("([\w-]+)"\)', script)) | set(re.findall(r"getElementById\('([\w-]+)'\)", script))
    assert used and used <= refs.ids, used - refs.ids
