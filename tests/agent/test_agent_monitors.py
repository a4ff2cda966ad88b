"""NVML is optional: absent here, so the sampler says so; with a stand-in `pynvml` that answers like
the real bindings (same call names and return shapes), samples flow into /metrics."""
from __future__ import annotations

import os
import sys
import types
from dataclasses import replace

from agent.config import tiny_cpu
from agent.metrics import render
from agent.monitors import DeviceFacts, NvmlSampler, cpu_facts, used_units_ms


def fake_pynvml(own_pid: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM = 1
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37, memory=12)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=5 << 30, total=141 << 30)
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1755 if kind == m.NVML_CLOCK_SM else 0
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4
    m.nvmlDeviceGetProcessUtilization = lambda h, since: [types.SimpleNamespace(pid=1, smUtil=50),
                                                          types.SimpleNamespace(pid=own_pid, smUtil=21)]
    return m


def test_nvml_absent_is_reported_not_raised():
    s = NvmlSampler()
    assert not s.available and s.error and s.sample() is None


def test_nvml_samples_reach_the_metrics(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(os.getpid()))
    s = NvmlSampler()
    sample = s.sample()
    assert s.available and sample.gpu_util_pct == 37.0 and sample.process_sm_util_pct == 21.0
    assert sample.sm_clock_mhz == 1755 and sample.throttle_reasons == 4 and sample.mem_used_bytes == 5 << 30
    from agent.site_agent import SiteAgent
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(1))
    text = render(agent, s)
    assert 'weaver_agent_nvml_available{site="site-0"} 1.0' in text
    assert 'weaver_agent_gpu_util_percent{site="site-0"} 37.0' in text
    assert 'weaver_agent_process_sm_util_percent{site="site-0"} 21.0' in text


def test_usage_units_follow_the_device():
    gpu = DeviceFacts("cuda", "H200", 132, 8, True)
    assert used_units_ms(gpu, busy_s=0.010, cpu_s=0.5, units=64) == 640.0     # SM-ms: event time x partition
    assert used_units_ms(cpu_facts(2), busy_s=0.010, cpu_s=0.012, units=2) == 12.0   # core-ms: CPU time
