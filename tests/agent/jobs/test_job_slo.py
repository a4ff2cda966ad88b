"""User SLOs in the mode controller, in virtual time: a breach causes the documented switch and the
switch names the SLO; a device remembered to breach it is not switched to; safety still comes first."""
from __future__ import annotations

import threading
import time
from dataclasses import replace

from agent.config import LeaseClientConfig, ModeConfig, tiny_cpu
from agent.job import JobSpec, SLOs
from agent.modes import CPU, GPU, MIN_OVERRUN_SAMPLES, ModeController
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from tests.agent.broker import ScriptedBroker, wait_for

CFG = ModeConfig(mode="cpu_preferred", margin=0.2, min_leases=5, window_s=60, demote_after_s=300,
                 cooldown_s=120, overrun_guard_ms=10, quiet_s=600)


def run(ctl, start, end, *, tput=None, step_every=None, share=0.0, rounds_s=None, every=1.0):
    """Feed one second at a time: tokens/s on the device in use (tput: device -> tok/s), an optimizer step
    every `step_every[device]` s, leases of `share`, cross-site rounds of `rounds_s` s; collect switches."""
    t, out, last_step = start, [], start
    while t < end:
        dev = ctl.device
        if share:
            ctl.observe_lease(t, share)
        if tput and dev in tput:
            ctl.observe_throughput(t, dev, tput[dev], share or 1.0)
        if step_every and step_every.get(dev) and t - last_step >= step_every[dev]:
            ctl.observe_step(t)
            last_step = t
        if rounds_s and dev in rounds_s:
            ctl.observe_round(t, rounds_s[dev])
        if (sw := ctl.evaluate(t)) is not None:
            out.append(sw)
            last_step = t
        t += every
    return out


def test_min_tokens_per_s_breach_on_the_cpu_promotes_and_names_the_slo():
    tput = {CPU: 300.0, GPU: 2000.0}
    # no leases: thin data for the throughput rule (and before the 300 s cost rule), so without the SLO
    # nothing switches
    assert run(ModeController(CFG), 0, 290, tput=tput) == []
    ctl = ModeController(CFG, slos=SLOs(min_tokens_per_s=1000))
    sw = run(ctl, 0, 290, tput=tput)
    assert [s.to_mode for s in sw] == ["gpu_preferred"] and sw[0].slo == "min_tokens_per_s"
    assert sw[0].at == CFG.cooldown_s                               # the first evaluation past the cool-down
    assert sw[0].reason.startswith("slo min_tokens_per_s: 300 tok/s on cpu breaches >= 1000; promote")
    assert ctl.slo_breach == ""                                     # met on the leased device: it stays


def test_max_step_s_breach_in_a_lease_drought_demotes_before_the_cost_rule_and_really_moves_to_the_cpu():
    ctl = ModeController(replace(CFG, mode="gpu_preferred"), slos=SLOs(max_step_s=5))
    sw = run(ctl, 0, 200, step_every={GPU: 1.0}, share=0.5)          # steps every second under leases: met
    assert sw == []
    sw = run(ctl, 200, 400, step_every={CPU: 1.0})                  # the leases stop: no step on the leased device
    assert [s.to_mode for s in sw] == ["cpu_preferred"] and sw[0].slo == "max_step_s" and sw[0].device == CPU
    assert 205 <= sw[0].at <= 210 < 200 + CFG.demote_after_s        # long before the 300 s cost demotion
    assert "breaches <= 5; demote (cpu: unknown)" in sw[0].reason


def test_a_device_remembered_to_breach_is_not_switched_back_to_until_the_memory_expires():
    ctl = ModeController(replace(CFG, mode="gpu_preferred"), slos=SLOs(max_step_s=5))
    run(ctl, 0, 130, step_every={GPU: 1.0}, share=0.5)
    sw = run(ctl, 130, 160, step_every={CPU: 1.0})                  # drought: SLO demotion
    assert [s.slo for s in sw] == ["max_step_s"]
    ctl.remembered[GPU] = 1e6                                       # the leased device would be much faster
    # leases are back and the throughput rule would promote, but the GPU breached the step SLO
    sw = run(ctl, 160, 700, tput={CPU: 1000.0}, step_every={CPU: 1.0}, share=0.5)
    assert sw == []
    sw = run(ctl, 700, 900, tput={CPU: 1000.0}, step_every={CPU: 1.0, GPU: 1.0}, share=0.5)   # 10 windows on: forgotten
    assert [s.to_mode for s in sw] == ["gpu_preferred"] and sw[0].slo == "" and "promote" in sw[0].reason


def test_when_neither_device_meets_the_slo_it_stays_and_says_so():
    ctl = ModeController(CFG, slos=SLOs(min_tokens_per_s=5000))
    sw = run(ctl, 0, 600, tput={CPU: 300.0, GPU: 2000.0}, share=0.5)
    # tried the leased device once (unknown there), found it short too, and stays: the CPU is remembered
    # at 300 tok/s, so neither the SLO nor the throughput rule (2000 tok/s there) moves it back
    assert [(s.to_mode, s.slo) for s in sw] == [("gpu_preferred", "min_tokens_per_s")]
    assert ctl.mode == "gpu_preferred"
    assert ctl.slo_breach == "slo min_tokens_per_s: 2000 tok/s on gpu breaches >= 5000; cpu cannot do better"


def test_round_deadline_breach_demotes_and_safety_comes_first():
    ctl = ModeController(replace(CFG, mode="gpu_preferred"), slos=SLOs(round_deadline_s=10))
    sw = run(ctl, 0, 200, rounds_s={GPU: 12.0, CPU: 6.0})
    assert [(s.to_mode, s.slo) for s in sw] == [("cpu_preferred", "round_deadline_s")]
    assert "12 s/round on gpu breaches <= 10" in sw[0].reason
    # after a safety demotion the quiet time holds, whatever an SLO wants
    ctl = ModeController(replace(CFG, mode="gpu_preferred"), slos=SLOs(min_tokens_per_s=1000))
    for _ in range(MIN_OVERRUN_SAMPLES):
        ctl.observe_overrun(1.0, 20.0)                              # p99 20 ms > guard 10 ms
    assert ctl.evaluate(1.0).reason.startswith("safety")
    assert run(ctl, 2, 500, tput={CPU: 300.0}) == []                # quiet_s = 600
    assert "cannot do better" in ctl.slo_breach


def test_the_agent_switches_on_its_jobs_slo_and_reports_which(tmp_path, monkeypatch):
    """Live wiring: the job's SLO reaches the controller, optimizer steps feed it, the switch is applied
    (training moves to the fallback cores) and reported with the SLO's name."""
    from agent import site_agent
    monkeypatch.setattr(site_agent, "MODE_EVERY_S", 0.1)
    broker = ScriptedBroker(heartbeat_ms=100)
    broker.start()
    cfg = tiny_cpu()
    cfg = replace(cfg, job=JobSpec("", {}, SLOs(max_step_s=0.5)), checkpoint_dir=str(tmp_path / "ckpt"),
                  inspect_addr="127.0.0.1:0",
                  modes=ModeConfig(mode="gpu_preferred", window_s=2.0, cooldown_s=0.3, demote_after_s=600),
                  lease=LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0", heartbeat_ms=100,
                                          backoff_initial_s=0.05, backoff_max_s=0.2))
    agent = SiteAgent(cfg, device=cpu_facts(1))
    agent.modes = ModeController(cfg.modes, now=time.monotonic(), slos=agent.modes.slos)
    assert agent.modes.slos == SLOs(max_step_s=0.5)
    t = threading.Thread(target=agent.run, kwargs={"max_seconds": 30}, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: agent.client.connected, 10)
        broker.renew_every_period(sm_count=0, period_ms=50, valid_for_ms=150, duty=0.0)   # empty leases
        assert wait_for(lambda: agent.modes.mode == "cpu_preferred", 15)
        # the controller switches inside evaluate(); the loop thread applies it (mode_reason) just after
        assert wait_for(lambda: agent.mode_reason.startswith("slo max_step_s"), 5), agent.mode_reason
        assert agent.modes.switches[0].slo == "max_step_s"
        steps = agent.trainer.step
        assert wait_for(lambda: agent.trainer.step > steps + 2, 10)                    # on the fallback core
        assert agent.trainer.device.type == "cpu"
        assert wait_for(lambda: any(u.mode_reason.startswith("slo max_step_s") for u in broker.usage()), 10)
    finally:
        agent.stop()
        t.join(20)
        broker.stop()
