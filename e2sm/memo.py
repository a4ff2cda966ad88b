"""`setup_memo`: the E2 setup and subscription codecs, memoised by value.

Setup-time messages repeat across a region's nodes: nodes of one configuration advertise the same RAN function
description and definition bytes, and the xApp asks every node of one KPM version for the same event trigger and
action definition. Each costs milliseconds in asn1tools (the KPM description with every measurement of five
report styles: about 7 ms to encode and as long to decode), so a thousand nodes' setup cost tens of seconds
of CPU, where one message's work suffices. The indication and control codecs are not memoised: their
values change with every message.

A memoised call returns the very object an earlier equal call returned. That is safe because the codecs
return immutable values (bytes, frozen dataclasses of tuples). Arguments that do not hash are passed through
uncached. A call that raises is not remembered: bad bytes are refused every time, with the same error. The
memo is bounded (least recently used), so a peer sending endless distinct definitions costs it nothing.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

MEMO_SIZE = 128   # distinct values remembered per codec: far more node configurations than a region runs

F = TypeVar("F", bound=Callable)


def setup_memo(fn: F) -> F:
    cached = functools.lru_cache(maxsize=MEMO_SIZE)(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:          # an unhashable argument (a bytearray, a value with a list in it)
            return fn(*args, **kwargs)
        return cached(*args, **kwargs)

    call.cache_info = cached.cache_info      # type: ignore[attr-defined]
    call.cache_clear = cached.cache_clear    # type: ignore[attr-defined]
    call.uncached = fn                        # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
