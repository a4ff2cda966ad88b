"""Grant policies in virtual time: each period an observation goes in, a decision comes out."""
from __future__ import annotations

import numpy as np
import pytest

from xapp.policy import (
    POLICIES,
    WARMUP_PERIODS,
    OraclePolicy,
    PolicyError,
    QuotaCost,
    ReactivePolicy,
    SiteHistory,
    SiteObservation,
    StaticPolicy,
    WeaverPolicy,
    envelope_grid,
    make_policy,
    warmup_margin,
)

PERIOD = 0.1


def obs(t, dmax=40.0, dmean=20.0, nondef=None, offered_mean=None, fresh=True, be_delay=0.0, **kw):
    return SiteObservation(site_id=0, now=t * PERIOD, gpu_sms=132, granularity=8, period_s=PERIOD,
                           demand_mean=dmean, demand_max=dmax, fresh=fresh,
                           nondeferrable_max=nondef, offered_mean=offered_mean if offered_mean is not None else dmean,
                           offered_max=dmax, be_delay_ms=be_delay, n_cells=kw.pop("n_cells", 4), **kw)


def drive(policy, observations):
    h = SiteHistory()
    out = []
    for o in observations:
        d = policy.decide(o, h)
        h.record(o, d)
        out.append(d)
    return out


def test_reactive_grants_last_free_minus_margin_and_revokes_without_fresh_data():
    p = ReactivePolicy(margin_sms=16)
    d = drive(p, [obs(0, dmax=41.0)])[0]
    assert d.grant_sms == 72 and d.envelope_sms is None  # floor8(132 - 41 - 16) = 72
    assert drive(p, [obs(1, fresh=False)])[0].grant_sms == 0
    assert drive(p, [obs(1, dmax=None)])[0].grant_sms == 0
    assert drive(p, [obs(0, dmax=200.0)])[0].grant_sms == 0  # never negative


def test_static_reservation_is_the_target_quantile_of_the_calibration_trace():
    rng = np.random.default_rng(0)
    demand = rng.uniform(0, 50, 100_000)
    demand[:3] = 120.0  # three slots need 120: with target 1e-5 (one slot allowed) they must be covered
    assert StaticPolicy.reservation_for(demand, 8, 1e-5) == 120
    assert StaticPolicy.reservation_for(demand, 8, 1e-4) == 56  # ten allowed: the uniform tail (<= 50 -> 56)
    d = drive(StaticPolicy(reserve_sms=50), [obs(0), obs(1, dmax=130.0)])
    assert [x.grant_sms for x in d] == [72, 72]  # 132 - 56 = 76 -> 72; never reacts


def test_oracle_grants_above_the_known_next_peak_and_needs_it():
    assert drive(OraclePolicy(), [obs(0, oracle_next_max=50.5)])[0].grant_sms == 80
    with pytest.raises(PolicyError):
        drive(OraclePolicy(), [obs(0)])


def test_weaver_envelope_covers_the_nondeferrable_tail_and_drains_best_effort():
    p = WeaverPolicy(guard_sms=8, hold_periods=5)
    # Non-deferrable peaks around 30, mean offered 20: E is set by the tail, not by the 90-SM peaks
    # that best-effort bursts would cause (those get deferred).
    seq = [obs(t, dmax=90.0, dmean=20.0, nondef=30.0 + (t % 3)) for t in range(2100)]
    d = drive(p, seq)[-1]
    # tail 32 -> E on the grant's grid (132 - 12 steps = 36): the grant is 132 - 36 - 8 = 88 exactly
    assert d.envelope_sms == 36 and d.grant_sms == 88
    assert d.sized_for_sms == 36
    # A surge of mean offered demand lifts E for drainage: 0.99-quantile(60) / 0.75 = 80 -> 84 (132 - 6 steps).
    surge = drive(p, seq + [obs(2100 + t, dmax=90.0, dmean=60.0, nondef=31.0) for t in range(10)])[-1]
    assert surge.envelope_sms == 84


def test_weaver_adds_a_step_while_its_history_is_too_short_to_resolve_the_target():
    d = drive(WeaverPolicy(), [obs(0, nondef=30.0, dmean=10.0)])[0]
    assert d.envelope_sms == 44  # 30 + one step = 38, onto the grid 132 - k * 8


def test_weaver_envelope_grid_wastes_no_sms_of_the_grant():
    # 132 SMs in 8-SM steps: an E on multiples of 8 from 0 left 4 SMs neither RAN nor training had.
    for nondef in np.arange(10.0, 100.0, 0.7):
        d = drive(WeaverPolicy(), [obs(t, nondef=float(nondef), dmean=10.0) for t in range(3)])[-1]
        assert d.envelope_sms >= nondef + 8 and d.grant_sms == 132 - d.envelope_sms - 8
        assert d.envelope_sms - (nondef + 8) < 8          # the smallest such E
    assert envelope_grid(131.0, 132, 8) == 132 and envelope_grid(0.0, 132, 8) == 4
    assert envelope_grid(40.0, 48, 8) == 40               # a GPU of whole steps: the same as before


def test_weaver_warmup_margin_follows_the_spread_of_the_window():
    # 0.1 s periods of 200 slots: 1e5 slots (500 periods) resolve 1e-5; until then a margin.
    steady = np.full(40, 20.0) + np.tile([0.0, 0.3], 20)
    erratic = np.full(40, 20.0) + np.tile([0.0, 9.0], 20)
    slots = 40 * 200
    assert warmup_margin(steady[:5], 5 * 200, 1e-5, 8) == 8.0      # too few periods to tell a spread
    assert 0 < warmup_margin(steady, slots, 1e-5, 8) < 1.0          # beta ln(1/(1e-5 * 8000)) ~ 0.3
    assert warmup_margin(erratic, slots, 1e-5, 8) == 8.0            # capped at the old whole step
    assert warmup_margin(erratic, 100_000, 1e-5, 8) == 0.0          # the window resolves the target
    # The policy: a steady non-deferrable load stops paying the whole step once its spread is known,
    # and E comes down at once (no hold: the first E was a placeholder), then holds as usual.
    seq = [obs(t, nondef=float(steady[t]), dmean=10.0) for t in range(40)]
    env = [x.envelope_sms for x in drive(WeaverPolicy(hold_periods=50), seq)]
    assert env[1:WARMUP_PERIODS - 1] == [36] * (WARMUP_PERIODS - 2)   # 20.3 + a step: 132 - 12 steps
    assert env[WARMUP_PERIODS - 1:] == [28] * (40 - WARMUP_PERIODS + 1)  # 20.3 + 0.5: 132 - 13 steps


def test_weaver_rises_at_once_and_falls_one_step_after_hold_periods():
    p = WeaverPolicy(hold_periods=10, window_periods=5, target=1e-3)  # 5 periods resolve 1e-3
    high = [obs(t, nondef=60.0, dmean=10.0) for t in range(2000)]
    low = [obs(2000 + t, nondef=20.0, dmean=10.0) for t in range(40)]
    d = drive(p, high + low)
    env = [x.envelope_sms for x in d]
    assert env[1999] == 60          # 60 on the grid 132 - k * 8
    after = env[2000:]
    # The 5-period window still holds the high tail for a few periods; then calm periods are counted.
    assert after[:15].count(60) >= 10
    assert all(b - a in (0, -8) for a, b in zip(after, after[1:], strict=False))  # one step at a time
    assert after[-1] < 60
    jump = drive(p, high[:2000] + [obs(3000, nondef=100.0, dmean=10.0)])[-1]
    assert jump.envelope_sms == 100  # rises at once


def test_weaver_raises_the_envelope_when_best_effort_delay_passes_half_its_budget():
    p = WeaverPolicy(hold_periods=10)
    base = [obs(t, nondef=30.0, dmean=10.0) for t in range(2000)]
    slow = obs(2000, nondef=30.0, dmean=10.0, be_delay=20.0, be_delay_budget_ms=30.0)
    d = drive(p, base + [slow])
    assert d[-1].envelope_sms == d[-2].envelope_sms + 8


def test_weaver_keeps_e_while_the_deferred_backlog_still_grows():
    # heavy-small-gpu, seed 2, from period 464: a surge (offered mean 18 -> 23 SMs) left a backlog that
    # kept growing while the offered peak, and so the sized E, fell back: lowering E deferred more.
    p = WeaverPolicy(hold_periods=10)
    calm = [obs(t, dmax=38.0, dmean=18.0, nondef=17.0) for t in range(2000)]
    surge = [obs(2000, dmax=60.0, dmean=22.0, nondef=20.0, be_delay=20.0, be_deferred_bytes=5e6)]
    # Offered load falls back, but the deferred bytes still grow with the delay past a quarter budget.
    growing = [obs(2001 + t, dmax=38.0, dmean=18.0, nondef=17.0, be_delay=10.0, be_deferred_bytes=5e6 + 1e5 * (t + 1))
               for t in range(30)]
    d = drive(p, calm + surge + growing)
    high = d[2000].envelope_sms
    assert high > d[1999].envelope_sms and all(x.envelope_sms == high for x in d[2000:])
    assert "backlog growing" in d[-1].reason
    # The same delay with a shrinking backlog is draining: the usual hysteresis steps E down.
    shrinking = [obs(2001 + t, dmax=38.0, dmean=18.0, nondef=17.0, be_delay=10.0, be_deferred_bytes=5e6 - 1e5 * (t + 1))
                 for t in range(30)]
    assert drive(p, calm + surge + shrinking)[-1].envelope_sms < high


def test_weaver_quota_caps_keep_the_site_under_e_even_when_all_cells_fill_them():
    cost = QuotaCost(dl_sms_per_prb=0.02, ul_sms_per_prb=0.03, cell_prbs=273)
    p = WeaverPolicy(mode="quota", cost=cost)
    d = drive(p, [obs(t, nondef=30.0, dmean=20.0, be_prb_per_cell=(20.0,) * 4) for t in range(2000)])[-1]
    assert d.envelope_sms is None and len(d.caps) == 4
    k = d.caps[0].be_max_ratio / 100 * 273
    assert 30.0 + 4 * k * 0.05 <= d.sized_for_sms + 1e-9
    assert d.grant_sms == (132 - d.sized_for_sms - 8) // 8 * 8
    # Heavy best-effort load that the caps could not drain: E grows until it can.
    heavy = drive(p, [obs(t, nondef=30.0, dmean=20.0, be_prb_per_cell=(200.0,) * 4) for t in range(2000)])[-1]
    assert heavy.sized_for_sms > d.sized_for_sms
    assert heavy.caps[0].be_max_ratio >= d.caps[0].be_max_ratio


def test_registry_and_bad_configuration():
    assert set(POLICIES) == {"static", "reactive", "weaver", "oracle"}
    assert make_policy("weaver", guard_sms=16).guard_sms == 16
    for bad in [lambda: make_policy("greedy"), lambda: make_policy("static"),
                lambda: WeaverPolicy(mode="both"), lambda: WeaverPolicy(mode="quota"),
                lambda: WeaverPolicy(guard_sms=-8), lambda: WeaverPolicy(target=0)]:
        with pytest.raises(PolicyError):
            bad()


def test_weaver_revokes_without_fresh_information():
    d = drive(WeaverPolicy(), [obs(0, nondef=30.0), obs(1, fresh=False)])
    assert d[0].grant_sms > 0 and d[1].grant_sms == 0
