"""Clocks: the slot number is the virtual time. `VirtualClock` jumps (benchmarks, tests);
`RealTimeClock` maps wall time to slots for live runs. Only shells read a real clock."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .config import SLOT_S


@dataclass
class VirtualClock:
    """Virtual time in slots; `now()` in seconds. Advanced only by `advance`."""

    slot: int = 0
    slot_s: float = SLOT_S

    def now(self) -> float:
        return self.slot * self.slot_s

    def advance(self, n_slots: int) -> float:
        if n_slots < 0:
            raise ValueError("time does not go backwards")
        self.slot += n_slots
        return self.now()


@dataclass
class RealTimeClock:
    """Slots elapsed since construction at `speed` x real time (1.0 = live)."""

    speed: float = 1.0
    slot_s: float = SLOT_S
    _t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    @property
    def slot(self) -> int:
        return int(self.now() / self.slot_s)

    def seconds_until_slot(self, slot: int) -> float:
        """Wall seconds until `slot` starts (<= 0 when it has)."""
        return (slot * self.slot_s - self.now()) / self.speed
