"""Fixtures for the RMR tests (helpers live in rmr_helpers.py, a name no other test directory uses)."""
from __future__ import annotations

import asyncio

import pytest
from rmr_helpers import EXAMPLE_FRAME


@pytest.fixture()
def example_frame() -> bytes:
    return EXAMPLE_FRAME


@pytest.fixture()
def run():
    """Run a coroutine on a fresh loop with a deadline; any exception that escapes into the loop's
    exception handler (an unhandled error in a callback or task) fails the test."""
    def _run(coro, timeout: float = 20.0):
        escaped: list[dict] = []

        async def main():
            asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: escaped.append(ctx))
            return await asyncio.wait_for(coro, timeout)

        result = asyncio.run(main())
        assert not escaped, f"exceptions escaped into the event loop: {escaped}"
        return result
    return _run
