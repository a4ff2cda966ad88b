"""Headless Debian `chromium` driven over the Chrome DevTools Protocol (a websocket, JSON messages).

Just what the dashboard test needs: open a page, evaluate JavaScript, take a screenshot. The browser
runs in its own process group with a fresh profile directory; `close()` kills the group, so no
renderer or GPU helper process outlives the test.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import aiohttp

# As root in a container: no sandbox; no GPU; nothing that phones home or updates itself.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


class BrowserError(RuntimeError):
    """The browser did not start, a CDP call failed, or page JavaScript threw."""


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    def __init__(self, proc: subprocess.Popen, http: aiohttp.ClientSession, ws, log_path: Path) -> None:
        self.proc = proc
        self.http = http
        self.ws = ws
        self.log_path = log_path
        self._ids = itertools.count(1)

    @classmethod
    async def launch(cls, profile_dir: Path, *, width: int = 1400, height: int = 1000,
                     timeout: float = 30.0) -> Chromium:
        exe = chromium_path()
        if exe is None:
            raise BrowserError("chromium is not installed (apt-get install chromium)")
        profile_dir.mkdir(parents=True, exist_ok=True)
        log_path = profile_dir.parent / f"{profile_dir.name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-port=0",
                                     "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}",
                                     "about:blank"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)
        http = None
        try:
            port = await _devtools_port(profile_dir / "DevToolsActivePort", proc, timeout, log_path)
            http = aiohttp.ClientSession()
            deadline = time.monotonic() + timeout
            while True:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [p for p in await r.json() if p.get("type") == "page"]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise BrowserError("chromium opened no page")
                await asyncio.sleep(0.1)
            ws = await http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=64 << 20)
        except BaseException:
            if http is not None:
                await http.close()
            _kill_group(proc)
            raise
        browser = cls(proc, http, ws, log_path)
        await browser.call("Page.enable")
        await browser.call("Runtime.enable")
        await browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                           deviceScaleFactor=1, mobile=False)
        return browser

    async def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        """One CDP command; events arriving meanwhile are dropped (this driver polls the page instead)."""
        msg_id = next(self._ids)
        await self.ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {timeout:.0f}s")
            msg = await self.ws.receive(timeout=left)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise BrowserError(f"{method}: devtools connection closed ({msg.type})")
            doc = json.loads(msg.data)
            if doc.get("id") == msg_id:
                if "error" in doc:
                    raise BrowserError(f"{method}: {doc['error']}")
                return doc.get("result", {})

    async def goto(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait until the new document has loaded (its scripts have run)."""
        res = await self.call("Page.navigate", url=url)
        if res.get("errorText"):
            raise BrowserError(f"cannot open {url}: {res['errorText']}")
        deadline = time.monotonic() + timeout
        while True:
            state = await self.evaluate("[document.readyState, location.href]")
            if state and state[0] == "complete" and state[1] != "about:blank":
                return
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading within {timeout:.0f}s: {state}")
            await asyncio.sleep(0.05)

    async def evaluate(self, expression: str):
        """Value of a JavaScript expression (promises awaited), as JSON; page exceptions raise."""
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise BrowserError(f"page JavaScript threw: {d.get('exception', {}).get('description') or d.get('text')}")
        return res.get("result", {}).get("value")

    async def screenshot(self, path: Path) -> Path:
        res = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(res["data"]))
        return path

    async def close(self) -> None:
        try:
            if not self.ws.closed:
                await self.ws.close()
        finally:
            await self.http.close()
            _kill_group(self.proc)


async def _devtools_port(path: Path, proc: subprocess.Popen, timeout: float, log_path: Path) -> int:
    """Chromium writes the port it chose into the profile's DevToolsActivePort file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrowserError(f"chromium exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-2000:]}")
        try:
            first = path.read_text().splitlines()[0]
            return int(first)
        except (FileNotFoundError, IndexError, ValueError):
            await asyncio.sleep(0.05)
    raise BrowserError(f"chromium wrote no DevToolsActivePort within {timeout:.0f}s")


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # renderer and utility children share the group
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
