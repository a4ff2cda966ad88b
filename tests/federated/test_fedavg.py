"""The gNB aggregator's rules on real tensors: the aggregate is the sample-weighted FedAvg of exactly the
updates it admitted (late ones discounted), a late update is counted once, the wire size bound holds,
and the cloud's combination of site aggregates is the FedAvg of all their updates."""
from __future__ import annotations

import random

import pytest
import torch

from agent.federated import updates
from agent.federated.aggregate import Admission, AggregatorConfig, RoundAggregator, Update, combine

SHAPES = {"a.lora_A.weight": (4, 64), "a.lora_B.weight": (192, 4), "b.lora_A.weight": (4, 256)}


def delta(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g) for k, s in SHAPES.items()}


def fedavg(items: list[tuple[Update, float]]) -> dict[str, torch.Tensor]:
    """The reference: sum(w * delta) / sum(w), in float64."""
    total = sum(w for _, w in items)
    return {k: sum(u.delta[k].double() * w for u, w in items) / total for k in SHAPES}


def test_aggregate_is_fedavg_of_admitted_updates_late_ones_discounted():
    agg = RoundAggregator("site-0", AggregatorConfig(staleness_discount=0.5))
    r0 = [Update(f"ue{i}", 0, samples=10 + 7 * i, delta=delta(i)) for i in range(5)]
    for u in r0[:3]:
        assert agg.offer(u) is Admission.CURRENT
    a0 = agg.close()
    # ue3, ue4 of round 0 arrive after the close: they join round 1 at half weight, beside round 1's own
    r1 = [Update(f"ue{i}", 1, samples=5 + i, delta=delta(100 + i)) for i in range(3)]
    assert [agg.offer(u) for u in r0[3:]] == [Admission.LATE, Admission.LATE]
    for u in r1:
        assert agg.offer(u) is Admission.CURRENT
    a1 = agg.close()
    for a, items in ((a0, [(u, u.samples) for u in r0[:3]]),
                     (a1, [(u, u.samples * 0.5) for u in r0[3:]] + [(u, u.samples) for u in r1])):
        ref = fedavg(items)
        for k in SHAPES:
            torch.testing.assert_close(a.delta[k].double(), ref[k], rtol=1e-6, atol=1e-6)
        assert a.weight == pytest.approx(sum(w for _, w in items))
        assert updates.decode(a.wire).keys() == ref.keys()  # what the wire carries is what was checked
    assert a1.late == (("ue3", 0), ("ue4", 0)) and a0.round == 0 and a1.round == 1


def test_late_updates_counted_exactly_once():
    rng = random.Random(7)
    agg = RoundAggregator("site-0", AggregatorConfig(max_staleness=1))
    offered, aggregates, refused = set(), [], 0
    for r in range(8):
        # this round's updates, and stragglers of the previous two rounds, some offered twice
        batch = [(f"ue{i}", r) for i in range(6) if rng.random() < 0.7]
        batch += [(f"ue{i}", rr) for rr in (r - 1, r - 2) if rr >= 0 for i in range(6, 9) if rng.random() < 0.5]
        batch += rng.sample(batch, k=min(2, len(batch)))
        rng.shuffle(batch)
        for ue, rr in batch:
            res = agg.offer(Update(ue, rr, samples=3, delta=delta(hash((ue, rr)) % 1000)))
            if (ue, rr) in offered:
                assert res is Admission.DUPLICATE
            else:
                assert res is not Admission.DUPLICATE
                assert (res is Admission.STALE) == (r - rr > 1)
                refused += res is Admission.STALE
            offered.add((ue, rr))
        aggregates.append(agg.close())
    included = [k for a in aggregates if a is not None for k in a.included]
    assert len(included) == len(set(included))                    # nothing counted twice
    assert len(included) + refused == len(offered)                 # and nothing lost silently
    late = [k for a in aggregates if a is not None for k in a.late]
    assert late and all(a.round - rr == 1 for a in aggregates if a is not None for _, rr in a.late)


@pytest.mark.parametrize("bound", [1024, 2500, 5000, 8000])
def test_aggregate_size_bound_holds(bound):
    agg = RoundAggregator("site-0", AggregatorConfig(max_bytes=bound))
    dense = len(updates.encode(delta(0), updates.Compression("fp32")))
    for r in range(3):
        for i in range(4):
            agg.offer(Update(f"ue{i}", r, samples=1 + i, delta=delta(10 * r + i)))
        a = agg.close()
        assert a.nbytes <= bound < dense
        assert len(updates.encode(a.delta, updates.Compression("fp32"))) == dense  # decodes to full shapes


def test_error_feedback_carries_what_a_bounded_aggregate_left_out():
    agg = RoundAggregator("site-0", AggregatorConfig(max_bytes=6000))
    agg.offer(Update("ue0", 0, samples=1, delta=delta(1)))
    a0 = agg.close()
    agg.offer(Update("ue0", 1, samples=1, delta={k: torch.zeros(s) for k, s in SHAPES.items()}))
    a1 = agg.close()
    # over the two rounds the sites shipped more of the round-0 delta than round 0 alone could carry
    err0 = sum(float((delta(1)[k] - a0.delta[k]).norm()) for k in SHAPES)
    err01 = sum(float((delta(1)[k] - a0.delta[k] - a1.delta[k]).norm()) for k in SHAPES)
    assert err01 < err0


def test_cloud_combination_is_fedavg_of_every_site_update():
    sites = {s: RoundAggregator(s) for s in ("site-0", "site-1", "site-2")}
    every = []
    for j, (s, agg) in enumerate(sites.items()):
        for i in range(3 + j):
            u = Update(f"{s}-ue{i}", 0, samples=1 + 11 * i + j, delta=delta(50 * j + i))
            agg.offer(u)
            every.append((u, u.samples))
    out, total = combine([a.close() for a in sites.values()])
    ref = fedavg(every)
    for k in SHAPES:
        torch.testing.assert_close(out[k].double(), ref[k], rtol=1e-6, atol=1e-6)
    assert total == sum(w for _, w in every)


def test_refuses_updates_from_a_future_round_and_mismatched_tensors():
    agg = RoundAggregator("site-0")
    with pytest.raises(ValueError):
        agg.offer(Update("ue0", 1, samples=1, delta=delta(0)))
    agg.offer(Update("ue0", 0, samples=1, delta=delta(0)))
    with pytest.raises(ValueError):
        agg.offer(Update("ue1", 0, samples=1, delta={"other": torch.zeros(3)}))
    assert RoundAggregator("site-1").close() is None
