"""The circuit schedule's rules on random announcement sets: no two transfers (or a reconfiguration and
a transfer) overlap on one circuit, nothing starts before its earliest start, an idle circuit is set up
just in time, deadlines are flagged truthfully; and the packet baseline's processor sharing."""
from __future__ import annotations

import random

import pytest

from testbed.federated.transport import CircuitConfig, CircuitSwitch, Flow, Transfer, always_on, packet_flows


def announcements(seed: int, n: int, sites: int) -> list[Transfer]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t0 = rng.uniform(0, 2.0)
        out.append(Transfer(key=(f"site-{i % sites}", i), site=f"site-{i % sites}",
                            nbytes=rng.randint(1_000, 3_000_000), earliest_s=t0, deadline_s=t0 + rng.uniform(1e-3, 0.1)))
    return out


@pytest.mark.parametrize("fallback", [True, False])
@pytest.mark.parametrize("seed,circuits,reconfig_s", [(0, 1, 1e-3), (1, 2, 25e-3), (2, 3, 10e-6), (3, 2, 0.0),
                                                      (4, 1, 0.2)])
def test_schedule_never_overlaps_and_never_starts_early(seed, circuits, reconfig_s, fallback):
    cfg = CircuitConfig(n_circuits=circuits, gbps=10.0, reconfig_s=reconfig_s, packet_fallback=fallback)
    sw = CircuitSwitch(cfg)
    tr = announcements(seed, 120, sites=3)
    # in three batches, as a controller reading the announcements round after round would
    by_t = sorted(tr, key=lambda t: t.earliest_s)
    placed = [p for k in range(3) for p in sw.schedule(by_t[k * 40:(k + 1) * 40])]
    books = sw.finish()
    t_by_key = {t.key: t for t in tr}
    assert sorted(p.key for p in placed) == sorted(t_by_key)
    for p in placed:
        t = t_by_key[p.key]
        assert p.start_s >= t.earliest_s
        if p.fallback:  # left to packet transport: no circuit time at all
            assert fallback and p.circuit == -1 and not p.on_time
            continue
        assert p.end_s - p.start_s == pytest.approx(t.nbytes * 8 / 10e9)
        assert p.on_time == (p.arrive_s <= t.deadline_s + 1e-12)
        assert p.on_time or not fallback  # with the fallback on, a booked circuit always delivers in time
    n_booked = sum(1 for p in placed if not p.fallback)
    assert sum(1 for iv in sw.intervals if iv[3] == "transfer") == n_booked
    if reconfig_s == 0.2:
        assert any(p.fallback for p in placed) == fallback and any(not p.on_time for p in placed)
    for c in range(circuits):
        ivs = sorted((s, e) for cc, s, e, _ in sw.intervals if cc == c)
        for (s0, e0), (s1, e1) in zip(ivs, ivs[1:], strict=False):
            assert s1 >= e0 - 1e-12, f"circuit {c}: [{s0}, {e0}] overlaps [{s1}, {e1}]"
    # a booking is held from up to release and carries at most that long
    assert all(b.release_s >= b.up_s and b.busy_s <= b.release_s - b.up_s + 1e-12 for b in books)
    assert sum(b.busy_s for b in books) == pytest.approx(sum(p.end_s - p.start_s for p in placed if not p.fallback))


def test_idle_circuit_is_set_up_just_in_time_and_released_after():
    cfg = CircuitConfig(n_circuits=1, gbps=10.0, reconfig_s=5e-3)
    sw = CircuitSwitch(cfg)
    a = Transfer(("site-0", 0), "site-0", 1_250_000, earliest_s=1.0, deadline_s=1.1)   # 1 ms on the wire
    b = Transfer(("site-1", 0), "site-1", 1_250_000, earliest_s=1.0, deadline_s=1.1)
    pa, pb = sw.schedule([a, b])
    assert pa.start_s == 1.0 and pa.end_s == pytest.approx(1.001)
    assert pb.start_s == pytest.approx(1.001 + 5e-3)  # reconfigured towards site-1 after a finished
    books = sw.finish()
    assert [bk.site for bk in books] == ["site-0", "site-1"]
    assert [bk.setup_s for bk in books] == pytest.approx([5e-3, 5e-3])
    assert sum(bk.release_s - bk.up_s for bk in books) == pytest.approx(2e-3)  # held only while carrying
    assert sw.intervals[0][::3] == (0, "setup") and sw.intervals[0][1:3] == pytest.approx((1.0 - 5e-3, 1.0))


def test_always_on_circuit_per_site_is_fifo_from_the_earliest_start():
    cfg = CircuitConfig(gbps=1.0)
    tr = announcements(5, 30, sites=3)
    placed = always_on(tr, cfg)
    by_key = {t.key: t for t in tr}
    for site in ("site-0", "site-1", "site-2"):
        ps = sorted((p for p in placed if p.key[0] == site), key=lambda p: p.start_s)
        assert all(p.start_s >= by_key[p.key].earliest_s for p in ps)
        assert all(b.start_s >= a.end_s - 1e-12 for a, b in zip(ps, ps[1:], strict=False))


def test_packet_flows_share_the_backhaul():
    rate = 1e9 / 8
    alone = packet_flows([Flow(("a",), "s", 125_000, 0.0)], gbps=1.0, propagation_s=0.01)
    assert alone[("a",)] == pytest.approx(125_000 / rate + 0.01)
    two = packet_flows([Flow(("a",), "s", 125_000, 0.0), Flow(("b",), "s", 125_000, 0.0),
                        Flow(("c",), "t", 125_000, 0.0)], gbps=1.0, propagation_s=0.0)
    assert two[("a",)] == pytest.approx(2e-3) and two[("b",)] == pytest.approx(2e-3)
    assert two[("c",)] == pytest.approx(1e-3)   # another site's backhaul is its own
    late = packet_flows([Flow(("a",), "s", 250_000, 0.0), Flow(("b",), "s", 125_000, 1e-3)], gbps=1.0,
                        propagation_s=0.0)
    assert late[("a",)] == pytest.approx(3e-3) and late[("b",)] == pytest.approx(3e-3)
