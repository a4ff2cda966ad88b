"""RanModel end to end: compute-aware envelope, conservation, determinism, traces, controls."""
from __future__ import annotations

import numpy as np
import pytest

from testbed import scenarios
from testbed.model import (
    CellConfig,
    CsvTrace,
    ModelConfigError,
    RanModel,
    Scenario,
    SiteConfig,
    SyntheticTrace,
    TraceFormatError,
    VirtualClock,
    archetype_shape,
    tdd_layout,
)
from testbed.model.traffic import diurnal_level


def busy_scenario(n_sites=2, load=0.5, tdd="DDDSU") -> Scenario:
    sites = tuple(SiteConfig(site_id=i, archetype=a, cells=(CellConfig(load=load),) * 4, tdd=tdd)
                  for i, a in zip(range(n_sites), ("residential", "business", "transport"), strict=False))
    return Scenario(name="t", description="test", sites=sites, start_hour=20.0)


def run(model, n):
    return [model.step_period() for _ in range(n)]


@pytest.mark.parametrize("tdd", ["DDDSU", "DDDSUUDDDD", "DDDDDDDSUU"])
def test_envelope_holds_in_every_slot_where_the_protected_slice_fits_and_nothing_is_lost(tdd):
    sc = busy_scenario(tdd=tdd)
    capped, free = RanModel(sc, seed=11), RanModel(sc, seed=11)
    uncapped = run(free, 60)
    E = 8 * np.ceil(np.mean([r.offered_mean for r in uncapped], axis=0) * 1.3 / 8)
    for s, e in enumerate(E):
        capped.set_envelope(s, float(e))
    reps = run(capped, 60)
    demand = np.concatenate([r.demand for r in reps])
    offered = np.concatenate([r.offered for r in reps])
    assert np.any(offered > E + 1e-6), "envelope never bound: the test would prove nothing"
    nondef = np.concatenate([r.nondeferrable for r in reps])
    Eb = np.broadcast_to(E, demand.shape)
    fits = nondef <= Eb
    assert np.all(demand[fits] <= Eb[fits] + 1e-6)
    # Where the protected slice alone does not fit, only it (and fixed costs) ran: nothing deferrable added.
    np.testing.assert_allclose(demand[~fits], nondef[~fits])
    assert max(r.added_delay_max_ms.max() for r in reps) > 0  # it reports the delay it added
    # Lift the envelope: deferred work drains and served bytes equal the uncapped run's.
    for s in range(sc.n_sites):
        capped.set_envelope(s, None)
    run(capped, 40)
    run(free, 40)
    assert capped.backlog_dl[0].total == 0 and capped.backlog_ul[0].total == 0
    np.testing.assert_allclose(capped.served_bytes, free.served_bytes, rtol=1e-9)
    np.testing.assert_allclose(capped.offered_bytes, free.offered_bytes)


def test_envelope_never_defers_the_protected_slice():
    sc = busy_scenario(n_sites=1, load=0.8)
    capped, free = RanModel(sc, seed=2), RanModel(sc, seed=2)
    capped.set_envelope(0, 0.0)  # nothing best-effort fits: only the protected slice and fixed costs run
    for a, b in zip(run(capped, 20), run(free, 20), strict=True):
        np.testing.assert_allclose(a.slice_bytes_dl[..., 0], b.slice_bytes_dl[..., 0])
        np.testing.assert_allclose(a.slice_bytes_ul[..., 0], b.slice_bytes_ul[..., 0])
        assert a.slice_bytes_dl[..., 1].sum() < 1e-3 and a.slice_bytes_ul[..., 1].sum() < 1e-3
        np.testing.assert_allclose(a.demand, a.nondeferrable, atol=1e-6)


def test_two_runs_with_one_seed_give_identical_arrays():
    sc = busy_scenario()
    a, b = RanModel(sc, seed=5), RanModel(sc, seed=5)
    for m in (a, b):
        m.set_envelope(0, 40.0)
        m.set_training_sms(1, 64)
    for ra, rb in zip(run(a, 15), run(b, 15), strict=True):
        for f in ("demand", "offered", "slice_bytes_dl", "slice_prb_used_ul", "misses", "slice_queue_bytes"):
            np.testing.assert_array_equal(getattr(ra, f), getattr(rb, f))
    c = RanModel(sc, seed=6)
    assert not np.array_equal(run(c, 1)[0].demand, RanModel(sc, seed=5).step_period().demand)


def test_misses_count_slots_over_what_the_lease_leaves_the_ran():
    sc = busy_scenario(n_sites=1)
    m = RanModel(sc, seed=1)
    m.set_training_sms(0, 120)
    r = m.step_period()
    assert r.misses[0] == int((r.demand[:, 0] > 132 - 120).sum()) > 0
    with pytest.raises(ModelConfigError):
        m.set_training_sms(0, 500)


def test_rc_quota_caps_best_effort_in_the_next_period_and_bad_quotas_change_nothing():
    sc = busy_scenario(n_sites=1, load=0.6)
    m = RanModel(sc, seed=3)
    run(m, 3)
    before = m.quota.copy()
    for bad in [dict(min_ratio=50, max_ratio=20, dedicated_ratio=0), dict(min_ratio=0, max_ratio=101, dedicated_ratio=0)]:
        with pytest.raises(ModelConfigError):
            m.set_slice_quota(0, 0, 1, 2, **bad)
    with pytest.raises(ModelConfigError):
        m.set_slice_quota(0, 0, 9, 9, 0, 10, 0)  # no such slice
    np.testing.assert_array_equal(m.quota, before)
    m.set_slice_quota(0, 1, 1, 2, 0, 10, 0)
    r = m.step_period()
    assert r.slice_prb_used_dl[0, 1, 1] <= 0.1 * 273 + 1e-6
    assert r.slice_prb_used_dl[0, 0, 1] > 0.1 * 273  # an uncapped cell of the same site uses more


def test_trace_generator_is_seeded_and_sites_are_independent():
    sc = busy_scenario(n_sites=3)
    a, b = SyntheticTrace(sc, 9).arrivals(0, 200), SyntheticTrace(sc, 9).arrivals(0, 200)
    np.testing.assert_array_equal(a.dl, b.dl)
    np.testing.assert_array_equal(a.bpp_ul, b.bpp_ul)
    assert not np.array_equal(a.dl, SyntheticTrace(sc, 10).arrivals(0, 200).dl)
    # Adding a site does not change the traces of the others (one spawned generator per site).
    two = SyntheticTrace(busy_scenario(n_sites=2), 9).arrivals(0, 200)
    np.testing.assert_array_equal(two.dl, a.dl[:, :, :2])


def test_archetype_shapes_peak_where_the_facts_say():
    h = np.arange(0, 24, 0.25)
    peak = {k: h[np.argmax(archetype_shape(k, h))] for k in ("residential", "business", "transport", "entertainment")}
    assert 19 <= peak["residential"] <= 23
    assert 9 <= peak["business"] <= 17
    assert 7 <= peak["transport"] <= 9 or 17 <= peak["transport"] <= 19
    assert 18 <= peak["entertainment"] <= 24
    business = archetype_shape("business", h)
    assert business[(h >= 2) & (h <= 5)].max() < 0.3 < business[(h >= 10) & (h <= 11)].min()
    transport = archetype_shape("transport", h)
    assert transport[h == 13.0][0] < 0.7 * transport[h == 8.0][0]  # free at midday
    for k in ("residential", "business", "transport", "entertainment", "mixed"):
        s = archetype_shape(k, h)
        assert s.min() >= -1e-9 and s.max() <= 1 + 1e-9


def test_complementary_sites_sum_to_a_flatter_load():
    h = np.arange(0, 24, 0.1)
    loads = np.array([diurnal_level(k, h) for k in ("residential", "business", "transport", "entertainment")])

    def cv(x):
        return x.std() / x.mean()

    assert cv(loads.sum(0)) < min(cv(x) for x in loads)


def test_load_follows_the_archetype_over_the_day():
    sc = Scenario(name="d", description="d", sites=(SiteConfig(site_id=0, archetype="business"),),
                  start_hour=3.0, day_speedup=3600 * 6 / 0.1)  # each 100 ms period moves the day 6 h
    m = RanModel(sc, seed=1)
    night, work = m.step_period(), m.step_period()  # 03 h, 09 h
    assert work.level[0] > night.level[0]
    assert work.slice_bytes_dl.sum() > night.slice_bytes_dl.sum()


def test_tdd_patterns_are_rotated_so_decode_windows_stay_inside():
    dl, u = tdd_layout("DDDSU")
    assert "".join("U" if x else ("S" if d < 1 and d > 0 else "D") for d, x in zip(dl, u, strict=True)) == "SUDDD"
    with pytest.raises(ModelConfigError):
        Scenario(name="x", description="x", sites=(SiteConfig(site_id=0),), period_slots=203)


def test_csv_trace_replays_and_refuses_bad_rows(tmp_path):
    sc = busy_scenario(n_sites=1)
    good = tmp_path / "t.csv"
    good.write_text("time_s,cell,bytes,dir\n0.0,0/1,50000,dl\n0.0005,1,1000,ul\n0.0012,0/0,7,dl\n")
    tr = CsvTrace(sc, good)
    arr = tr.arrivals(0, 10)
    assert arr.dl[:, 0, 0, 1].sum() == pytest.approx(50000)
    assert arr.ul[:, 1, 0, 1].sum() == pytest.approx(1000)
    assert arr.dl[:, 2, 0, 0].sum() == pytest.approx(7)
    m = RanModel(sc, seed=0, trace=CsvTrace(sc, good))
    m.step_period()
    m.step_period()
    assert m.served_bytes.sum() == pytest.approx(m.offered_bytes.sum() - (m.q_dl + m.q_ul).sum())
    prb = tmp_path / "p.csv"
    prb.write_text("time_s,cell,prb\n0,0,100\n")
    assert CsvTrace(sc, prb).arrivals(0, 5).dl[:, 0, 0, 0].sum() > 0
    for text in ["x,y\n1,2\n", "time_s,cell,bytes\n0,9/9,5\n", "time_s,cell,bytes\n-1,0,5\n",
                 "time_s,cell,bytes\nnan,0,5\n", "time_s,cell,bytes\n0,0,abc\n", "time_s,cell,bytes,dir\n0,0,5,xx\n",
                 "time_s,cell,bytes\n", "\x00\xff garbage"]:
        bad = tmp_path / "bad.csv"
        bad.write_bytes(text.encode("latin-1"))
        with pytest.raises(TraceFormatError):
            CsvTrace(sc, bad)


def test_named_scenarios_state_their_load_regime():
    gh = scenarios.scenario_stats(scenarios.get("gh200-multicell"), seed=3, n_periods=60)
    assert gh.cells_per_gpu == 8 and gh.gpu_sms == 132
    assert 0.15 <= gh.mean_prb_util <= 0.35
    heavy = scenarios.scenario_stats(scenarios.get("heavy-small-gpu"), seed=3, n_periods=60)
    assert heavy.ran_p999_share >= 0.8
    assert scenarios.get("slow-partition").reconfig_s == pytest.approx(0.3)
    assert scenarios.get("scale").n_sites == 128
    with pytest.raises(ModelConfigError):
        scenarios.get("nope")


def test_virtual_clock_only_moves_when_told():
    c = VirtualClock()
    assert c.now() == 0
    assert c.advance(200) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        c.advance(-1)


def test_csv_trace_is_sparse_and_repeats(tmp_path):
    sc = busy_scenario(n_sites=1)
    f = tmp_path / "long.csv"
    f.write_text("time_s,cell,bytes\n0,0,10\n3600,2,20\n")  # an hour apart: must not allocate the hour
    tr = CsvTrace(sc, f)
    assert tr.n_slots == 7_200_001
    first = tr.arrivals(0, 10)
    assert first.dl[:, 0, 0, 0].sum() == pytest.approx(10)
    wrap = tr.arrivals(7_200_000, 10)  # last slot of the trace, then it starts again
    assert wrap.dl[:, 0, 0, 2].sum() == pytest.approx(20) and wrap.dl[:, 1, 0, 0].sum() == pytest.approx(10)


def test_deferred_work_never_exceeds_a_cells_prbs_or_quota_when_it_catches_up(monkeypatch):
    from testbed.model import ran

    seen = []
    real = ran.stage_sites_kernel

    def checked(*args):
        ul_wpb, dl_wpb, be_ul, be_dl, head_ul, head_dl = args[8], args[9], args[17], args[18], args[19], args[20]
        lim_ul, lim_dl = ul_wpb * be_ul + ul_wpb * head_ul, dl_wpb * be_dl + dl_wpb * head_dl   # work units
        real(*args)
        seen.append(max(float((ul_wpb * be_ul - lim_ul).max()), float((dl_wpb * be_dl - lim_dl).max())))

    monkeypatch.setattr(ran, "stage_sites_kernel", checked)
    sc = busy_scenario(n_sites=1, load=0.45)
    capped, free = RanModel(sc, seed=4), RanModel(sc, seed=4)
    for m in (capped, free):
        for c in range(4):
            m.set_slice_quota(0, c, 1, 2, 0, 60, 0)  # best-effort at most 60 % of the PRBs
    capped.set_envelope(0, 28.0)
    for _ in range(40):
        capped.step_period()
        free.step_period()
    assert seen and max(seen) <= 1e-6
    capped.set_envelope(0, None)
    for _ in range(60):
        capped.step_period()
        free.step_period()
    np.testing.assert_allclose(capped.served_bytes, free.served_bytes, rtol=1e-9)


def test_generated_traffic_of_complementary_sites_sums_to_a_flatter_day():
    archetypes = ("residential", "business", "transport", "entertainment")
    sc = Scenario(name="day", description="d", sites=tuple(SiteConfig(site_id=i, archetype=a) for i, a in enumerate(archetypes)),
                  start_hour=0.0, day_speedup=3600 / 0.1)  # each 100 ms period is one hour of the day
    tr = SyntheticTrace(sc, seed=12)
    hourly = np.array([(lambda x: x.dl.sum(axis=(0, 1, 3)) + x.ul.sum(axis=(0, 1, 3)))(tr.arrivals(h * 200, 200))
                       for h in range(48)])  # (hours, sites) offered bytes

    def cv(x):
        return x.std() / x.mean()

    assert cv(hourly.sum(axis=1)) < min(cv(hourly[:, s]) for s in range(4))


def test_real_time_clock_maps_wall_time_to_slots():
    from testbed.model import RealTimeClock

    c = RealTimeClock(speed=1000.0)
    assert c.slot >= 0 and c.seconds_until_slot(10**9) > 0


def test_trace_level_is_each_sites_diurnal_curve_times_scale_and_markov_state():
    from testbed.model.traffic import MARKOV_LEVELS
    sc = scenarios.get("demo")
    trace = SyntheticTrace(sc, 5)
    for slot in (0, 7_777, 3_000_000):
        hour = sc.start_hour + slot * 0.0005 * sc.day_speedup / 3600
        want = np.array([site.scale * diurnal_level(site.archetype, hour + site.phase_h) for site in sc.sites])
        np.testing.assert_allclose(trace.level(slot), want * MARKOV_LEVELS[trace.markov], rtol=1e-12)


def test_a_period_is_simulated_under_the_tightest_envelope_in_force_during_it():
    """An envelope loosens once the training it gave way to has stopped; the period in which it loosened is
    charged with that training, so it runs under the tighter envelope (else the two would overlap in the
    model), and the looser one governs from the next period. A tighter envelope governs at once."""
    sc = busy_scenario(n_sites=1, load=0.8)
    peak = max(r.offered[:, 0].max() for r in run(RanModel(sc, seed=4), 4))
    E = float(np.ceil(0.5 * peak))           # an envelope that binds
    T = 132.0 - E - 8.0                      # and a lease that fills the rest but the guard
    loosened, held = RanModel(sc, seed=4), RanModel(sc, seed=4)
    for m in (loosened, held):
        m.set_envelope(0, E)
        run(m, 2)
        m.set_training_sms(0, T)
    loosened.set_envelope(0, None)           # after the release, within the period
    a, b = loosened.step_period(), held.step_period()
    np.testing.assert_array_equal(a.demand, b.demand)
    assert a.misses[0] == b.misses[0] == 0
    a2, b2 = loosened.step_period(), held.step_period()   # the same training, now beside the loosened envelope
    assert a2.demand.max() > E and a2.misses[0] > b2.misses[0] == 0
    tightened = RanModel(sc, seed=4)
    run(tightened, 2)
    tightened.set_envelope(0, E)
    r = tightened.step_period()
    fits = r.nondeferrable[:, 0] <= E
    assert np.all(r.demand[fits, 0] <= E + 1e-6)
