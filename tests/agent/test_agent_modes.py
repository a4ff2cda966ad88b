"""Execution-mode switching with scripted lease sequences, in virtual time."""
from __future__ import annotations

from agent.config import ModeConfig
from agent.modes import CPU, GPU, ModeController

CFG = ModeConfig(mode="cpu_preferred", margin=0.2, min_leases=5, window_s=60, demote_after_s=300,
                 cooldown_s=120, overrun_guard_ms=10, quiet_s=600)


def feed(ctl, start, end, share, gpu_full=None, cpu=1000.0, every=1.0, overrun_ms=0.0):
    """One lease per second with `share`; throughput samples for the device in use."""
    t, switches = start, []
    while t < end:
        ctl.observe_lease(t, share)
        if ctl.device == CPU:
            ctl.observe_throughput(t, CPU, cpu)
        elif gpu_full is not None:
            ctl.observe_throughput(t, GPU, gpu_full * share, share)
            ctl.observe_overrun(t, overrun_ms)
        if (sw := ctl.evaluate(t)) is not None:
            switches.append(sw)
        t += every
    return switches


def test_promotes_when_leases_are_large_enough_and_demotes_when_they_shrink():
    ctl = ModeController(CFG, now=0.0)
    ctl.remembered[GPU] = 10_000.0                       # measured earlier at full device
    sw = feed(ctl, 0, 200, share=0.5)                     # 5000 tok/s predicted vs 1000 on CPU
    assert [s.to_mode for s in sw] == ["gpu_preferred"] and sw[0].at >= CFG.cooldown_s
    assert "promote" in sw[0].reason and sw[0].device == GPU
    sw = feed(ctl, 200, 500, share=0.08, gpu_full=10_000.0)   # 800 tok/s leased vs 1000 CPU
    assert [s.to_mode for s in sw] == ["cpu_preferred"] and "demote" in sw[0].reason
    assert sw[0].at - ctl.switches[0].at >= CFG.cooldown_s     # cool-down held the demotion back


def test_hysteresis_band_holds_the_mode():
    ctl = ModeController(CFG, now=0.0)
    ctl.remembered[GPU] = 10_000.0
    # 0.11 x 10000 = 1100 tok/s: not enough to promote (needs 1200) ...
    assert feed(ctl, 0, 400, share=0.11) == []
    ctl2 = ModeController(ModeConfig(**{**CFG.__dict__, "mode": "gpu_preferred"}), now=0.0)
    # ... and not low enough to demote a GPU-mode agent either (needs <= 833)
    ctl2.remembered[CPU] = 1000.0
    assert feed(ctl2, 0, 400, share=0.11, gpu_full=10_000.0) == []


def test_thin_data_means_no_decision():
    ctl = ModeController(CFG, now=0.0)
    ctl.remembered[GPU] = 10_000.0
    assert feed(ctl, 0, 400, share=0.5, every=20.0) == []       # <= 4 leases per 60 s window < 5


def test_cost_demotion_when_leases_stay_at_zero():
    ctl = ModeController(ModeConfig(**{**CFG.__dict__, "mode": "gpu_preferred"}), now=0.0)
    sw = feed(ctl, 0, 400, share=0.0)
    assert [s.to_mode for s in sw] == ["cpu_preferred"] and sw[0].reason.startswith("cost")
    assert sw[0].at == CFG.demote_after_s


def test_safety_demotion_is_immediate_and_blocks_promotion_for_the_quiet_window():
    ctl = ModeController(ModeConfig(**{**CFG.__dict__, "mode": "gpu_preferred"}), now=0.0)
    sw = feed(ctl, 0, 60, share=0.5, gpu_full=10_000.0, overrun_ms=25.0, every=0.5)
    assert len(sw) == 1 and sw[0].reason.startswith("safety") and sw[0].at < CFG.cooldown_s
    sw = feed(ctl, 60, 600, share=0.9)                           # big leases, but quiet window
    assert sw == []
    sw = feed(ctl, 600, 700, share=0.9)
    assert [s.to_mode for s in sw] == ["gpu_preferred"]


def test_pinned_modes_never_switch_and_unusable_device_means_cpu():
    for mode in ("cpu", "gpu"):
        ctl = ModeController(ModeConfig(**{**CFG.__dict__, "mode": mode}), now=0.0)
        assert feed(ctl, 0, 1000, share=0.0) == [] and feed(ctl, 1000, 2000, share=1.0) == []
    ctl = ModeController(ModeConfig(**{**CFG.__dict__, "mode": "gpu_preferred"}), leased_device_usable=False)
    assert ctl.mode == "cpu_preferred" and feed(ctl, 0, 500, share=1.0) == []
