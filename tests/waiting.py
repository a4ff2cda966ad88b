"""Polling for a condition in a live test, with the thing waited for named in the failure. Plain standard
library: the tests of both venvs use it."""
from __future__ import annotations

import time


def until(pred, timeout_s: float, what: str, every_s: float = 0.1):
    """`pred()`'s first truthy value within `timeout_s`, else AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)
