"""The testbed's RAN + GPU model: vectorised numpy over (sites, cells, slices) at slot resolution.

Public API (docs/contracts.md, "testbed model"): configuration dataclasses, `RanModel`, `PeriodReport`,
the PHY cost model, the trace sources and the virtual clock.
"""
from .clock import RealTimeClock, VirtualClock
from .config import (
    ARCHETYPES,
    BEST_EFFORT,
    PROTECTED,
    SLOT_S,
    TDD_PATTERNS,
    CellConfig,
    ModelConfigError,
    Scenario,
    SiteConfig,
    SliceConfig,
)
from .phy import PhyCost, bytes_per_prb, spectral_efficiency
from .ran import PeriodReport, RanModel, compile_kernels, tdd_layout
from .traffic import Arrivals, CsvTrace, SyntheticTrace, TraceFormatError, TraceSource, archetype_shape

__all__ = [
    "ARCHETYPES", "BEST_EFFORT", "PROTECTED", "SLOT_S", "TDD_PATTERNS", "Arrivals", "CellConfig", "CsvTrace",
    "ModelConfigError", "PeriodReport", "PhyCost", "RanModel", "RealTimeClock", "Scenario", "SiteConfig",
    "SliceConfig", "SyntheticTrace", "TraceFormatError", "TraceSource", "VirtualClock", "archetype_shape",
    "bytes_per_prb", "compile_kernels", "spectral_efficiency", "tdd_layout",
]
