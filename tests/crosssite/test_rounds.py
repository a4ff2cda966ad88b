"""The round policy's arithmetic (no processes): token weighting, FedNova, zero-token sites, the outer
Nesterov step, exactly-once accounting, and the config seams fed by the lease stream."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.crosssite.rounds import (
    LocalWork,
    OuterOptimizer,
    RoundPolicy,
    RoundStats,
    TokenLedger,
    combine,
    flatten,
    outer_gradient,
    stats_tensor,
    unflatten_into,
    use_fednova,
)
from agent.crosssite.tier import CrossSiteTier, TierConfig
from schemas.proto.weaver.v1 import lease_pb2

pytestmark = pytest.mark.agent

works = st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 50)), min_size=1, max_size=5)


def _sites(raw, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    global_flat = torch.randn(dim, generator=g)
    sites = []
    for tokens, steps in raw:
        work = LocalWork(tokens, steps if tokens else 0)
        sites.append((global_flat - torch.randn(dim, generator=g) * 0.1, work))
    return global_flat, sites


@settings(max_examples=60, deadline=None)
@given(works)
def test_token_weighted_mean_of_pseudo_gradients(raw):
    global_flat, sites = _sites(raw)
    g, stats, fednova = combine(global_flat, sites, RoundPolicy(fednova_cv=math.inf))
    total = sum(w.tokens for _, w in sites)
    assert stats.tokens == total and stats.sites == len(sites)
    if total == 0:
        assert g is None   # nobody worked: no outer step, nothing to wait for
        return
    expect = sum(w.tokens * (global_flat - loc) for loc, w in sites) / total
    assert not fednova
    torch.testing.assert_close(g, expect)


@settings(max_examples=40, deadline=None)
@given(works, st.integers(0, 3))
def test_zero_token_sites_contribute_nothing(raw, idle):
    global_flat, sites = _sites(raw)
    with_idle = sites + [(torch.randn(6) * 100, LocalWork(0, 0)) for _ in range(idle)]
    a, sa, _ = combine(global_flat, sites, RoundPolicy())
    b, sb, _ = combine(global_flat, with_idle, RoundPolicy())
    assert sb.sites == sa.sites + idle and sb.contributors == sa.contributors
    if a is None:
        assert b is None
    else:
        torch.testing.assert_close(a, b)


def test_fednova_normalises_by_steps_when_they_differ_widely():
    global_flat = torch.zeros(3)
    fast = (global_flat - torch.tensor([10.0, 0, 0]), LocalWork(tokens=1000, steps=100))   # 0.1 per step
    slow = (global_flat - torch.tensor([0.0, 2.0, 0]), LocalWork(tokens=100, steps=2))      # 1.0 per step
    g, stats, fednova = combine(global_flat, [fast, slow], RoundPolicy(fednova_cv=0.5))
    assert fednova and stats.steps_cv > 0.5
    # FedNova: tau_eff * sum(p_i * delta_i / tau_i), p_i = tokens share
    p_fast, p_slow = 1000 / 1100, 100 / 1100
    tau_eff = p_fast * 100 + p_slow * 2
    expect = tau_eff * (p_fast * torch.tensor([0.1, 0, 0]) + p_slow * torch.tensor([0, 1.0, 0]))
    torch.testing.assert_close(g, expect)
    g_plain, _, off = combine(global_flat, [fast, slow], RoundPolicy(fednova_cv=math.inf))
    assert not off and not torch.allclose(g, g_plain)


def test_equal_steps_never_switch_to_fednova():
    stats = RoundStats.from_tensor(stats_tensor(LocalWork(512, 8)) + stats_tensor(LocalWork(4096, 8)))
    assert stats.steps_cv == pytest.approx(0.0)


def test_outer_step_is_torch_nesterov_sgd_and_its_state_heals():
    policy = RoundPolicy(outer_lr=0.7, outer_momentum=0.9)
    a = torch.ones(4)
    ref = torch.nn.Parameter(torch.ones(4))
    ref_opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    outer = OuterOptimizer(a, policy)
    for k in range(3):
        grad = torch.full((4,), 0.1 * (k + 1))
        outer.step(grad.clone())
        ref.grad = grad
        ref_opt.step()
    torch.testing.assert_close(a, ref.detach())
    # A joiner loading the state continues exactly like the original.
    b = a.clone()
    healed = OuterOptimizer(b, policy)
    healed.load_state_dict(outer.state_dict())
    outer.step(torch.full((4,), 0.5))
    healed.step(torch.full((4,), 0.5))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError):
        outer.step(torch.tensor([float("nan")] * 4))


def test_ledger_counts_committed_rounds_once():
    led = TokenLedger()
    led.settle(own_tokens=100, round_tokens=300, committed=True)
    led.settle(own_tokens=50, round_tokens=999, committed=False)
    led.settle(own_tokens=10, round_tokens=20, committed=True)
    assert (led.committed_rounds, led.committed_total, led.committed_own, led.discarded_own) == (2, 320, 110, 50)
    joiner = TokenLedger(committed_own=7)
    joiner.load_state_dict(led.state_dict())
    assert joiner.committed_total == 320 and joiner.committed_own == 7


def test_flatten_roundtrip_respects_tied_weights():
    from agent.model import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    params = list(m.parameters())
    flat = flatten(params)
    assert flat.numel() == m.num_params()   # the tied embedding counts once
    unflatten_into(flat * 2, params)
    torch.testing.assert_close(flatten(params), flat * 2)
    with pytest.raises(ValueError):
        unflatten_into(torch.zeros(flat.numel() + 1), params)


@pytest.mark.parametrize("bad", [
    dict(tokens=-1, steps=1), dict(tokens=5, steps=0), dict(tokens=0, steps=3)])
def test_local_work_rejects_inconsistent_counts(bad):
    with pytest.raises(ValueError):
        LocalWork(**bad)


@pytest.mark.parametrize("bad", [dict(outer_lr=0), dict(outer_lr=float("inf")), dict(outer_momentum=1.0),
                                 dict(fednova_cv=-1)])
def test_round_policy_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        RoundPolicy(**bad)


def test_tier_config_from_the_lease_stream():
    msg = lease_pb2.CrossSiteConfig(lighthouse_addr="http://10.0.0.1:29510", round_ms=2000,
                                    round_epoch_ms=1_700_000_000_000, heartbeat_timeout_ms=800)
    c = TierConfig.from_proto(msg, "du-7")
    assert (c.lighthouse_addr, c.site_id, c.round_ms, c.round_epoch_ms, c.heartbeat_timeout_ms) == (
        "http://10.0.0.1:29510", "du-7", 2000, 1_700_000_000_000, 800)
    assert TierConfig.from_proto(lease_pb2.CrossSiteConfig(), "du-7") is None   # tier disabled
    with pytest.raises(ValueError, match="lighthouse_addr"):
        TierConfig.from_proto(lease_pb2.CrossSiteConfig(lighthouse_addr="10.0.0.1:29510"), "du-7")
    with pytest.raises(ValueError, match="round_ms"):
        TierConfig.from_proto(lease_pb2.CrossSiteConfig(lighthouse_addr="http://h:1", round_ms=5), "du-7")


@pytest.mark.parametrize("bad", [dict(site_id=""), dict(compression="int4"), dict(heartbeat_timeout_ms=0),
                                 dict(transfer_window_fraction=1.0), dict(min_work_fraction=0.9)])
def test_tier_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        TierConfig(**{"lighthouse_addr": "http://127.0.0.1:1", "site_id": "s", **bad})


def test_round_clock_boundaries_and_deadlines():
    c = TierConfig(lighthouse_addr="http://127.0.0.1:1", site_id="s", round_ms=1000, round_epoch_ms=10_000,
                   transfer_window_fraction=0.2, min_work_fraction=0.3)
    assert c.boundary(3) == 13.0
    assert c.next_round(13.005) == 3 and c.next_round(13.5) == 4
    assert c.work_deadline(13.01) == (3, 13.8)
    assert c.work_deadline(13.6) == (4, 14.8)   # too little left: the work goes to the next round


def test_tier_state_dict_carries_global_weights_outer_state_and_ledger():
    """What a joiner receives when it heals: the global weights, never the peer's local ones."""
    model = torch.nn.Linear(3, 2)
    cfg = TierConfig(lighthouse_addr="http://127.0.0.1:1", site_id="s")
    tier = CrossSiteTier.__new__(CrossSiteTier)    # no Manager: only the state-dict half
    tier.config, tier.params = cfg, list(model.parameters())
    tier.global_flat = flatten(tier.params).clone()
    tier.outer, tier.ledger, tier._healed = OuterOptimizer(tier.global_flat, cfg.policy), TokenLedger(), False
    tier.outer.step(torch.ones_like(tier.global_flat))
    tier.ledger.settle(10, 30, True)
    with torch.no_grad():
        model.weight.add_(5.0)    # local training in progress
    state = {k: v for k, v in tier._state_dict().items()}
    other = torch.nn.Linear(3, 2)
    t2 = CrossSiteTier.__new__(CrossSiteTier)
    t2.config, t2.params = cfg, list(other.parameters())
    t2.global_flat = flatten(t2.params).clone()
    t2.outer, t2.ledger, t2._healed = OuterOptimizer(t2.global_flat, cfg.policy), TokenLedger(), False
    t2._load_state_dict(state)
    assert t2._healed and t2.ledger.committed_total == 30
    torch.testing.assert_close(t2.global_flat, tier.global_flat)
    assert not torch.allclose(t2.global_flat, flatten(tier.params))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=0, max_size=8))
def test_reduced_statistics_fuzz(values):
    """Invariant: any tensor gives RoundStats whose derived values are finite, or a ValueError."""
    try:
        stats = RoundStats.from_tensor(torch.tensor(values, dtype=torch.float64))
    except ValueError:
        return
    assert math.isfinite(stats.steps_cv) and math.isfinite(stats.tau_eff) and stats.tokens >= 0
    g = outer_gradient(torch.ones(3), stats, use_fednova(stats, RoundPolicy()))
    assert g is None or g.shape == (3,)


def test_lighthouse_timeouts_fit_the_round():
    from agent.crosssite.lighthouse import LighthouseConfig
    c = LighthouseConfig.for_rounds(800)
    assert c.heartbeat_timeout_ms < 800 < c.join_timeout_ms
    with pytest.raises(ValueError):
        LighthouseConfig.for_rounds(10)
    with pytest.raises(ValueError):
        LighthouseConfig(heartbeat_timeout_ms=0)


def test_a_gathered_row_of_any_honest_workers_passes_and_an_impossible_one_does_not():
    """Robust aggregation's row check (rounds.stats_row_ok / payload_row_ok) never drops an honest site, however
    many workers its row sums (a two-worker site's row once failed a one-site rule), and drops what no site sends."""
    import random

    from agent.crosssite.rounds import LocalWork, payload_row_ok, stats_row_ok, stats_tensor
    rng = random.Random(5)
    for _ in range(500):
        works = [LocalWork(t, rng.randint(1, 9), 1.0) if (t := rng.choice([0, rng.randint(1, 5000)])) else LocalWork(0, 0)
                 for _ in range(rng.randint(1, 6))]
        row = sum((stats_tensor(w) for w in works), torch.zeros(6, dtype=torch.float64))
        assert stats_row_ok(row) is True, works
        tokens = sum(w.tokens for w in works)
        payload = torch.full((10,), 0.01) * tokens
        assert payload_row_ok(payload, row, max_delta_norm=1.0)
        assert not payload_row_ok(payload * 1e3, row, max_delta_norm=1.0) or tokens == 0
    assert stats_row_ok(torch.zeros(6, dtype=torch.float64)) is None                     # an empty slot
    for bad in ([5, 5, 1, 1, 0, 1], [128, 128, 1, 4, 1, 1], [128, 1, 1, 1, 1, 1], [1, 1, 1, 1, 2, 1],
                [float("nan")] * 6, [-1, 0, 0, 0, 0, 1]):
        assert stats_row_ok(torch.tensor(bad, dtype=torch.float64)) is False, bad
    assert not payload_row_ok(torch.ones(4), torch.tensor([0, 0, 0, 0, 0, 1.], dtype=torch.float64), 1.0)
