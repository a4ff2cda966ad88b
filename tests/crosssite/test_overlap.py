"""Overlapped cross-site rounds, in-process and fast: a real Trainer of the tiny preset, torchft's
Manager replaced by a quorum of one (collectives are the identity) so the exchange runs on its own
thread exactly as in production, without a Lighthouse.

What must hold: training never stops for the transfer window; the merge is the new global weights
plus what the site trained since its snapshot; every applied step's tokens enter exactly one round;
a failed exchange merges nothing; a joiner that healed restarts from the healed weights."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from agent.config import TrainConfig, tiny_cpu
from agent.crosssite.agent import CrossSiteAgent
from agent.crosssite.rounds import LocalWork, flatten
from agent.crosssite.site import TINY
from agent.crosssite.tier import CrossSiteTier, TierConfig
from agent.enforcer import LeaseTerms
from agent.model import GPTConfig
from agent.monitors import cpu_facts
from agent.trainer import Trainer
from schemas.proto.weaver.v1 import lease_pb2
from tests.agent.broker import record_releases, wait_for
from tests.crosssite.test_tier_host import SoloManager

pytestmark = [pytest.mark.agent]


def _solo(monkeypatch, manager=None):
    monkeypatch.setattr(CrossSiteTier, "_start_manager",
                        lambda self: setattr(self, "manager", manager or SoloManager()))


def _trainer() -> Trainer:
    return Trainer(TrainConfig(model=GPTConfig(**TINY), seed=3))


def _train(trainer: Trainer, n: int = 1) -> LocalWork:
    tokens = 0
    for _ in range(n):
        tokens += trainer.micro_batch(4).tokens
        trainer.optimizer_step()
    return LocalWork(tokens, n, trainer.last_loss)


def _flat(trainer: Trainer) -> torch.Tensor:
    return flatten(trainer.model.parameters())


def _wait_landed(tier: CrossSiteTier):
    assert wait_for(lambda: tier._inflight.done.is_set(), 10)
    return tier.poll()


def test_the_merge_keeps_what_the_site_trained_after_its_snapshot(monkeypatch):
    _solo(monkeypatch)
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000))
    work = _train(trainer, 2)
    snap = _flat(trainer)
    tier.begin(work)
    _train(trainer, 1)                              # trained while the round is in flight
    progress = _flat(trainer) - snap
    rec = _wait_landed(tier)
    assert rec.committed and rec.tokens == work.tokens and rec.steps == 2
    assert not torch.equal(tier.global_flat, snap)  # the outer step moved the global weights
    torch.testing.assert_close(_flat(trainer), tier.global_flat + progress)
    assert tier.ledger.committed_total == work.tokens


def test_a_failed_exchange_merges_nothing_and_is_raised_on_the_loop_thread(monkeypatch):
    class Broken(SoloManager):
        def allreduce(self, t, reduce_op):
            raise RuntimeError("peer gone")
    _solo(monkeypatch, Broken())
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000))
    tier.begin(_train(trainer))
    _train(trainer)
    local = _flat(trainer)
    assert wait_for(lambda: tier._inflight.done.is_set(), 10)
    with pytest.raises(RuntimeError, match="peer gone"):
        tier.poll()
    torch.testing.assert_close(_flat(trainer), local)
    assert not tier.in_flight and tier.ledger.committed_total == 0


def test_a_joiner_that_healed_restarts_from_the_healed_weights_and_contributes_nothing(monkeypatch):
    healthy = torch.full_like(_flat(_trainer()), 0.01)

    class Healing(SoloManager):
        def __init__(self):
            super().__init__()
            self.tier = None

        def start_quorum(self):
            opt = self.tier.outer.heal_state()
            self.tier._load_state_dict({"global": healthy, "outer": opt,
                                        "ledger": {"committed_rounds": 4, "committed_total": 1000}})
    mgr = Healing()
    _solo(monkeypatch, mgr)
    trainer = _trainer()
    tier = mgr.tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000))
    tier.begin(_train(trainer, 2))
    _train(trainer)
    rec = _wait_landed(tier)
    assert rec.healed and rec.tokens == 0
    assert tier.ledger.committed_total == 1000                 # the healed ledger, nothing of ours added
    torch.testing.assert_close(_flat(trainer), tier.global_flat)


def _agent(tmp_path, monkeypatch, round_ms=600) -> CrossSiteAgent:
    _solo(monkeypatch)
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"),
                  train=replace(cfg.train, eval_every=0, checkpoint_every=0))
    agent = CrossSiteAgent(cfg, device=cpu_facts(1))
    record_releases(agent)
    agent.client.poll = lambda timeout=0.0: (time.sleep(min(timeout, 0.005)), [])[1]
    agent.client.send_usage = lambda *a, **k: True
    agent.client.send_transfer_plan = lambda *a, **k: True
    agent.client.send_round_report = lambda *a, **k: True
    agent.cross_site = lease_pb2.CrossSiteConfig(lighthouse_addr="http://127.0.0.1:1", round_ms=round_ms,
                                                 round_epoch_ms=int(time.time() * 1000))
    agent.enforcer.on_lease(LeaseTerms("L1", 1, 0.1, 60.0, 1.0, agent.clock()))
    return agent


def test_the_lease_loop_trains_through_the_transfer_windows(tmp_path, monkeypatch):
    agent = _agent(tmp_path, monkeypatch)
    agent.enforcer.on_revoke(agent.clock(), "", "test", agent.clock())   # no training before the tier is on
    assert wait_for(lambda: (agent._iteration(), agent.tier is not None)[1], 30)
    assert agent.stepped_tokens == 0
    agent.enforcer.on_lease(LeaseTerms("L2", 1, 0.1, 60.0, 1.0, agent.clock(), 0, 2))
    windows = []
    agent.client.send_transfer_plan = lambda rnd, nbytes, deadline_ms, workers: windows.append(deadline_ms) or True
    end = agent.clock() + 3.0
    while agent.clock() < end or agent.tier.in_flight:    # and let the last round land
        agent._iteration()
    assert len(agent.rounds) >= 2, agent.rounds
    # every window of the schedule (its last 15 % before the round's boundary) saw micro-batches
    fraction = agent.tier.config.transfer_window_fraction
    to_agent = agent.clock() - time.time()
    launches = [t0 for t0, _, kind in agent.work_log if kind == "micro-batch"]
    for deadline_ms in windows[:-1]:
        close = deadline_ms / 1000 + to_agent
        open_ = close - fraction * agent.tier.config.round_s
        assert any(open_ <= t < close for t in launches), (open_, close)
    # exactly once: the rounds' tokens are the applied steps' tokens up to the last snapshot
    assert sum(r.tokens for r in agent.rounds) == agent._mark[0] > 0
    assert all(r.committed for r in agent.rounds)
    agent._close_tier()


def test_a_revocation_while_a_round_is_in_flight_is_released_at_once(tmp_path, monkeypatch):
    from agent.lease_client import LeaseRevoked
    agent = _agent(tmp_path, monkeypatch, round_ms=400)
    sent = record_releases(agent)
    agent._held = agent.enforcer.lease
    # 30 s: the wait covers the tier's start (model copies, the solo manager), slower late in a full CI run
    assert wait_for(lambda: (agent._iteration(), agent.tier is not None and agent.tier.in_flight)[1], 30)
    events = [[LeaseRevoked(agent.clock(), "", "stale-kpm")]]
    agent.client.poll = lambda timeout=0.0: events.pop(0) if events else []
    agent._iteration()
    assert [(lid, reason) for lid, reason, *_ in sent] == [("L1", "revoked")]
    assert agent.enforcer.lease is None
    agent._close_tier()


def test_a_site_with_non_finite_weights_sits_the_round_out_and_the_global_model_stays_finite(monkeypatch):
    """Issue 26 item 3: before, one NaN round's contribution went into the sum (the global model NaN, every site
    out of the tier); now the site contributes nothing, counted, and the round commits on what is left."""
    _solo(monkeypatch)
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000))
    before = tier.global_flat.clone()
    work = _train(trainer, 1)
    with torch.no_grad():
        next(trainer.model.parameters()).view(-1)[0] = float("nan")
    tier.begin(work)
    rec = _wait_landed(tier)
    assert rec.dropped_own and tier.dropped_contributions == 1 and rec.tokens == 0
    assert torch.isfinite(tier.global_flat).all()
    torch.testing.assert_close(tier.global_flat, before)       # nothing was contributed, nothing moved


@pytest.mark.parametrize("scale", [float("inf"), 1e6])
def test_a_row_inflated_in_the_all_reduce_is_dropped_and_moves_nothing(monkeypatch, scale):
    """A peer that adds far more than any site could have trained (here to the only row there is): the row is
    not one honest site's, so it is dropped and counted, and the global model and the ledger do not move."""
    class Inflating(SoloManager):
        def allreduce(self, t, reduce_op):
            if t.numel() > 64:
                t.mul_(scale)
            return super().allreduce(t, reduce_op)
    _solo(monkeypatch, Inflating())
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000, max_delta_norm=50.0))
    before = tier.global_flat.clone()
    tier.begin(_train(trainer, 1))
    rec = _wait_landed(tier)
    assert rec.dropped_peers == 1 and tier.dropped_peer_rows == 1, rec
    torch.testing.assert_close(tier.global_flat, before)
    assert tier.ledger.committed_total == 0


def test_a_step_that_would_take_the_global_model_beyond_its_bound_is_undone(monkeypatch):
    _solo(monkeypatch)
    trainer = _trainer()
    norm = float(flatten(trainer.model.parameters()).norm())
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000,
                                                   max_weight_norm=norm * 1.000001))
    before = tier.global_flat.clone()
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(1.5)                       # a legitimate-looking delta whose step points outwards
    tier.begin(LocalWork(100, 1, 1.0))
    rec = _wait_landed(tier)
    assert not rec.committed and "bound" in rec.refused
    torch.testing.assert_close(tier.global_flat, before)
    assert not tier.outer.heal_state()["has_momentum"]          # the step's momentum went with it


def test_an_undone_step_leaves_the_outer_momentum_as_it_was(monkeypatch):
    _solo(monkeypatch)
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000))
    tier.begin(_train(trainer, 1))
    assert _wait_landed(tier).committed                           # a momentum buffer now exists
    momentum, weights = tier.outer.heal_state(copy=True)["momentum"], tier.global_flat.clone()
    tier.config = replace(tier.config, max_weight_norm=float(weights.norm()) * 1.000001)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.copy_(p * 1.5)
    tier.begin(LocalWork(100, 1, 1.0))
    rec = _wait_landed(tier)
    assert not rec.committed and "bound" in rec.refused
    torch.testing.assert_close(tier.global_flat, weights)
    torch.testing.assert_close(tier.outer.heal_state()["momentum"], momentum)


class _WithPeer(SoloManager):
    """A quorum of two: this site (rank 0) and a peer whose gathered rows the test writes (rank 1), as the SUM
    all-reduce of the slotted rows hands them to every site."""

    def __init__(self, peer_stats, peer_payload):
        super().__init__()
        self.peer_stats, self.peer_payload = peer_stats, peer_payload

    def num_participants(self):
        return 2

    def allreduce(self, t, reduce_op):
        if t.dim() == 2 and t.shape[0] == 2:          # a gathered tensor: the peer's slot
            t[1] += (self.peer_stats if t.shape[1] == 6 else self.peer_payload(t.shape[1])).to(t.dtype)
        return super().allreduce(t, reduce_op)


def _peer_stats(tokens: int, steps: int = 1) -> torch.Tensor:
    from agent.crosssite.rounds import stats_tensor
    return stats_tensor(LocalWork(tokens, steps, 1.0))


@pytest.mark.parametrize("what, stats, payload", [
    ("non-finite", _peer_stats(128), lambda n: torch.full((n,), float("nan"))),
    ("beyond the bound", _peer_stats(128), lambda n: torch.full((n,), 1e6)),
    ("step moments no steps give", torch.tensor([128., 128., 1., 4., 1., 1.], dtype=torch.float64),
     lambda n: torch.zeros(n)),
    ("tokens with no contributor", torch.tensor([5., 5., 1., 1., 0., 1.], dtype=torch.float64),
     lambda n: torch.zeros(n)),
])
def test_an_insiders_bad_row_is_dropped_and_counted_and_the_others_round_commits(monkeypatch, what, stats, payload):
    """Issue 26 item 3, against an admitted site: before, contributions were summed in one all-reduce, so one
    insider's huge or NaN delta made every site refuse the round (or, within the sum's bound, moved the model).
    Now each site's rows are gathered and checked before anything is summed: the bad row is left out, counted,
    and the honest site's round commits with its own delta only."""
    _solo(monkeypatch, _WithPeer(stats, payload))
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000, max_delta_norm=50.0))
    before = tier.global_flat.clone()
    work = _train(trainer, 1)
    local = _flat(trainer)
    tier.begin(work)
    rec = _wait_landed(tier)
    assert rec.committed and rec.dropped_peers == 1 and tier.dropped_peer_rows == 1, (what, rec)
    assert torch.isfinite(tier.global_flat).all()
    assert not torch.equal(tier.global_flat, before)                    # the honest site's work went in
    assert float((tier.global_flat - before).norm()) <= float((local - before).norm()) * 1.5 + 1e-6
    assert tier.ledger.committed_total == work.tokens                   # the dropped peer's tokens did not count


def test_an_honest_peers_row_is_summed(monkeypatch):
    """The control: a peer row that can be an honest site's enters the round (nothing dropped)."""
    _solo(monkeypatch, _WithPeer(_peer_stats(128), lambda n: torch.full((n,), 1e-4) * 128))
    trainer = _trainer()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000, max_delta_norm=50.0))
    work = _train(trainer, 1)
    tier.begin(work)
    rec = _wait_landed(tier)
    assert rec.committed and rec.dropped_peers == 0
    assert tier.ledger.committed_total == work.tokens + 128
