"""The warm-up micro-batch is training work, so it runs inside a lease like any other: the first launch
of the first lease (planned by the enforcer, accounted as leased work, kept out of the step-time fit),
never before a lease exists, on the site agent and on the cross-site agent. Every micro-batch, forward
pass and optimizer step the real trainer runs is recorded with the enforcer's lease state at that moment."""
from __future__ import annotations

import gc
import threading
import time
from dataclasses import replace

import pytest

from agent.config import LeaseClientConfig, tiny_cpu
from agent.crosssite.agent import CrossSiteAgent
from agent.enforcer import LeaseTerms
from agent.lease_client import LeaseGranted
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from tests.agent.broker import ScriptedBroker, wait_for


def lease_witness(agent: SiteAgent) -> list[tuple[str, int, bool]]:
    """(kind, samples, lease held) for every micro-batch, forward pass and optimizer step of the agent's
    trainer, the lease state read from its enforcer when the work starts (on the loop's own thread)."""
    seen: list[tuple[str, int, bool]] = []
    t = agent.trainer

    def held() -> bool:
        return agent.enforcer.lease is not None and agent.enforcer.window is not None

    micro_batch = t.micro_batch

    def recording(size, fraction=1.0):
        seen.append(("micro-batch", size, held()))
        return micro_batch(size, fraction)
    t.micro_batch = recording
    t.model.register_forward_pre_hook(lambda m, args: seen.append(("forward", len(args[0]), held())))
    t.optimizer.register_step_pre_hook(lambda o, a, k: seen.append(("step", 0, held())))
    return seen


def config(tmp_path, mode="gpu", **lease):
    cfg = tiny_cpu()
    return replace(cfg, modes=replace(cfg.modes, mode=mode), checkpoint_dir=str(tmp_path / "ckpt"),
                   train=replace(cfg.train, eval_every=0), **lease)


@pytest.mark.parametrize("agent_cls", [SiteAgent, CrossSiteAgent], ids=["site", "crosssite"])
def test_no_training_work_runs_before_the_first_lease_the_warm_up_included(tmp_path, agent_cls):
    broker = ScriptedBroker(heartbeat_ms=100)
    broker.start()
    cfg = config(tmp_path, lease=LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0",
                                                   heartbeat_ms=100, backoff_initial_s=0.05, backoff_max_s=0.2))
    agent = agent_cls(cfg, device=cpu_facts(1))
    seen = lease_witness(agent)
    thread = threading.Thread(target=agent.run, kwargs={"max_seconds": 60}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: agent.client.connected, 10)
        time.sleep(0.3)                        # connected, no lease yet: the loop only idles
        assert seen == []
        broker.lease(sm_count=1, period_ms=50, valid_for_ms=2_000, duty=0.5, lease_id="first")
        assert wait_for(lambda: sum(k == "micro-batch" for k, _, _ in seen) >= 4 and agent.window_reports, 10)
    finally:
        agent.stop()
        thread.join(20)
        broker.stop()
    assert not thread.is_alive()
    assert [x for x in seen if not x[2]] == []                     # nothing ran without a lease
    assert seen[:2] == [("micro-batch", 1, True), ("forward", 1, True)]   # the warm-up came first, leased
    start, end, kind = agent.work_log[0]
    assert kind == "warm-up" and agent.window_reports[0].lease_id == "first"
    assert agent.window_reports[0].start <= start


def test_the_warm_up_is_the_first_launch_accounted_as_leased_work_outside_the_fit(tmp_path):
    agent = SiteAgent(config(tmp_path), device=cpu_facts(1))
    seen = lease_witness(agent)
    agent._leased_iteration()                  # no lease: idles
    assert seen == [] and not agent.work_log
    agent._handle([LeaseGranted(LeaseTerms("L", 1, 0.5, 10.0, 1.0, agent.clock(), 1, 1))])
    frozen = gc.get_freeze_count()
    agent._leased_iteration()
    t, w = agent.trainer, agent.enforcer.window
    assert seen == [("micro-batch", 1, True), ("forward", 1, True)]
    assert [k for _, _, k in agent.work_log] == ["warm-up"]
    assert t.samples_seen == t.tokens_seen == t.pending_samples == 0       # thrown away, data not consumed
    assert w.busy_s > 0 and w.cpu_s > 0 and w.micro_batches == 0          # leased work, but no micro-batch
    assert len(agent.enforcer.fit.points) == 0                             # nor a point of the fit
    assert gc.get_freeze_count() > frozen                                  # gc.freeze() after it
    agent._leased_iteration()                  # the next launch trains
    assert [k for _, _, k in agent.work_log] == ["warm-up", "micro-batch"] and t.samples_seen > 0
    assert len(agent.enforcer.fit.points) == 1


def test_in_a_fallback_mode_the_warm_up_is_the_first_fallback_iteration(tmp_path):
    agent = SiteAgent(config(tmp_path, mode="cpu"), device=cpu_facts(1))
    seen = lease_witness(agent)
    agent._fallback_iteration()                # the fallback cores need no lease: the first one warms up
    assert seen == [("micro-batch", 1, False), ("forward", 1, False)]
    assert agent.trainer.samples_seen == agent.trainer.pending_samples == 0
    agent._fallback_iteration()
    assert seen[2][0] == "micro-batch" and seen[2][1] > 1 and agent.trainer.samples_seen == seen[2][1]
    assert not agent.work_log and agent.enforcer.window is None              # no lease was touched
