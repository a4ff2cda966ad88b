"""The xApp's collector policy: a full collection finds the loop's long-lived state frozen (so it does not
walk it), and a cycle that became garbage while frozen is still reclaimed at the policy's full collection."""
from __future__ import annotations

import gc
import weakref
from collections import deque
from dataclasses import dataclass

import pytest

from xapp.gcpolicy import GcPolicy


@dataclass(frozen=True)
class Obs:
    site: str
    value: float


@pytest.fixture(autouse=True)
def _thaw():
    yield
    gc.unfreeze()


def _grow(histories: list[deque], period: int) -> None:
    for i, h in enumerate(histories):
        h.append(Obs(f"site-{i}", float(period)))


@pytest.mark.parametrize("refreeze", [True, False])
def test_the_loops_histories_are_frozen_after_a_refreeze(refreeze):
    policy = GcPolicy(refreeze_ticks=5, reclaim_ticks=1000) if refreeze else GcPolicy(refreeze_ticks=1000,
                                                                                      reclaim_ticks=1000)
    policy.settle()
    histories = [deque(maxlen=50) for _ in range(2000)]
    for period in range(20):                 # the state grows after start-up, as the loop's does
        _grow(histories, period)
        policy.after_tick()
    gc.collect(1)                            # what survives the young generations is what a full one walks
    ours = sum(1 for o in gc.get_objects(2) if type(o) in (Obs, deque))
    if refreeze:
        assert ours <= 2 * len(histories)    # at most the last few ticks' survivors, not 20 periods' worth
    else:
        assert ours >= 10 * len(histories)


def test_a_cycle_frozen_then_dropped_is_reclaimed_at_the_full_collection():
    class Node:
        pass

    policy = GcPolicy(refreeze_ticks=2, reclaim_ticks=10)
    policy.settle()
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    for _ in range(2):
        policy.after_tick()                  # the cycle survives a young collection and is frozen
    del a, b
    gc.collect()                             # an automatic full collection cannot reach a frozen cycle
    assert alive() is not None
    while policy.full_collections == 0:
        policy.after_tick()
    assert alive() is None and policy.ticks == 10


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        GcPolicy(refreeze_ticks=0)
    with pytest.raises(ValueError):
        GcPolicy(refreeze_ticks=10, reclaim_ticks=5)
