"""Screenshot a running dashboard with headless chromium (how docs/img/dashboard.png is made):

    weaver up --duration 120 &          # prints "weaver up: dashboard  http://HOST:PORT/"
    .venv-xapp/bin/python tests/dashboard/screenshot.py http://HOST:PORT/ docs/img/dashboard.png --after 60
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdp import Chromium  # noqa: E402 - after the path tweak, run as a script


async def shoot(url: str, out: Path, after_s: float, width: int, height: int, window_min: int) -> None:
    with tempfile.TemporaryDirectory(prefix="weaver-shot-") as tmp:
        browser = await Chromium.launch(Path(tmp) / "profile", width=width, height=height)
        try:
            await browser.goto(url)
            await browser.evaluate(f"(() => {{ const w = document.getElementById('window'); w.value = '{window_min}';"
                                   " w.dispatchEvent(new Event('change')); })()")
            await asyncio.sleep(after_s)
            await browser.screenshot(out)
        finally:
            await browser.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--after", type=float, default=30.0, help="seconds to let the page collect data first")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=1100)
    p.add_argument("--window-min", type=int, default=1, choices=(1, 3, 5, 10))
    a = p.parse_args(argv)
    asyncio.run(shoot(a.url, a.out, a.after, a.width, a.height, a.window_min))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
