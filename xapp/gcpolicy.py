"""When the xApp's cyclic garbage collector may walk the loop's state.

A full (generation-2) collection walks every tracked object that is not frozen. The loop's histories
(`xapp.policy.SiteHistory`: up to 600 periods of observations and decisions a site) grow after start-up, so
at 1,000 sites a full collection stalled one indication for 18 ms in `weaver bench xapp` after only 22
periods, and it grows with the histories. Those objects form no cycles (deques of frozen dataclasses):
reference counting frees them, frozen or not. The collector is only needed for cycles, and the loop makes
few.

So, after start-up (`settle`: collect, then freeze), every `refreeze_ticks` ticks the loop collects the two
young generations (their size is bounded by the thresholds, so it is cheap) and freezes what survived: a
full collection then finds almost nothing to walk. A cycle that became garbage after it was frozen is not
reclaimed until `reclaim_ticks` ticks, when the policy unfreezes everything and runs one full collection,
at a tick boundary rather than in the middle of an indication. With the defaults (100 ms ticks) that is
one stall every 10 minutes instead of one every few seconds.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass


@dataclass
class GcPolicy:
    refreeze_ticks: int = 10        # ticks between young collections + freeze (1 s at 100 ms)
    reclaim_ticks: int = 6000       # ticks between full collections of everything (10 min at 100 ms)
    ticks: int = 0
    full_collections: int = 0       # the ones this policy ran

    def __post_init__(self) -> None:
        if self.refreeze_ticks < 1 or self.reclaim_ticks < self.refreeze_ticks:
            raise ValueError("refreeze_ticks must be >= 1 and reclaim_ticks >= refreeze_ticks")

    def settle(self) -> None:
        """After start-up: the codec tables and config are long-lived; move them out of the collector's way."""
        gc.collect()
        gc.freeze()

    def after_tick(self) -> None:
        self.ticks += 1
        if self.ticks % self.reclaim_ticks == 0:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_collections += 1
        elif self.ticks % self.refreeze_ticks == 0:
            gc.collect(1)
            gc.freeze()
