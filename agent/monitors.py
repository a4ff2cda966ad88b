"""What the agent runs on, and what it really used.

- `detect_device(kind)`: DeviceFacts for the lease broker (SMs + green-context granularity on CUDA,
  cores on CPU). Never needs a GPU or a driver.
- `NvmlSampler`: device utilisation, memory, clocks, throttle reasons and per-process samples through
  NVML (`pynvml` from nvidia-ml-py) when it is importable and a driver answers; otherwise `available`
  is False and `sample()` returns None. NVML resolves ~1/6-1 s, so it is a cross-check, never the meter.
- The meters themselves (CUDA events x partition SMs on GPU, process CPU time on CPU) live next to the
  work they time, in `Trainer.micro_batch`; this module only turns them into SM/core-ms.
"""
from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass

GREEN_CONTEXT_GRANULARITY = 8   # SMs per green-context partition step (Aerial docs; facts §5.1)


@dataclass(frozen=True)
class DeviceFacts:
    kind: str               # "cuda" | "cpu"
    name: str
    sm_count: int           # SMs on a GPU; cores on a CPU
    granularity: int        # partition step: 8 SMs with green contexts, 1 core on CPU
    green_contexts: bool
    # CPU stand-in: the cores the whole site GPU stands for when that is less than sm_count (a host shared
    # by several agents gives each a share of a core); 0 = sm_count
    cores: float = 0.0

    @property
    def core_share(self) -> float:
        """The share of its `sm_count` threads' time the device stands for (1 unless fractional cores)."""
        return self.cores / self.sm_count if self.kind == "cpu" and 0 < self.cores < self.sm_count else 1.0

    def to_proto(self):
        from schemas.proto.weaver.v1 import lease_pb2
        return lease_pb2.DeviceFacts(kind=self.kind, name=self.name, sm_count=self.sm_count,
                                     granularity=self.granularity, green_contexts=self.green_contexts,
                                     cores=self.cores if self.core_share < 1.0 else 0.0)


def cpu_facts(cores: float = 0) -> DeviceFacts:
    """`cores` may be fractional (0.5: the site GPU stands for half a core, run on one thread)."""
    if cores < 0 or not math.isfinite(cores):
        raise ValueError(f"cores must be >= 0, got {cores}")
    if not cores:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = max(1, math.ceil(cores - 1e-9))
    return DeviceFacts("cpu", platform.machine() or "cpu", n, 1, False, cores=float(cores) if cores < n else 0.0)


def green_contexts_supported() -> bool:
    from agent.partition import green_supported
    return green_supported()


def detect_device(kind: str = "auto", cores: float = 0) -> DeviceFacts:
    """kind: auto | cpu | cuda. `cuda` without a usable GPU is an error; `auto` falls back to CPU."""
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {kind!r}")
    if kind in ("auto", "cuda"):
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            green = green_contexts_supported()
            return DeviceFacts("cuda", p.name, p.multi_processor_count,
                               GREEN_CONTEXT_GRANULARITY if green else 1, green)
        if kind == "cuda":
            raise RuntimeError("device=cuda requested but torch.cuda.is_available() is False")
    return cpu_facts(cores)


@dataclass(frozen=True)
class NvmlSample:
    gpu_util_pct: float
    mem_util_pct: float
    mem_used_bytes: int
    sm_clock_mhz: int
    throttle_reasons: int
    process_sm_util_pct: float | None   # this process, None when NVML gives no sample


class NvmlSampler:
    """Optional NVML reader; constructing it never fails."""

    def __init__(self, index: int = 0):
        self.available = False
        self.error = ""
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.available = True
        except Exception as exc:   # ImportError, NVMLError_LibraryNotFound, no device...
            self.error = f"{type(exc).__name__}: {exc}"

    def sample(self) -> NvmlSample | None:
        if not self.available:
            return None
        n, h = self._nvml, self._handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        clock = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        own = None
        try:
            for s in n.nvmlDeviceGetProcessUtilization(h, 0):
                if s.pid == os.getpid():
                    own = float(s.smUtil)
        except n.NVMLError:
            pass   # no samples yet, or not supported on this part
        return NvmlSample(float(util.gpu), float(util.memory), int(mem.used), int(clock), int(reasons), own)


def used_units_ms(device: DeviceFacts, busy_s: float, cpu_s: float, units: int) -> float:
    """SM·ms (GPU: event-timed busy time x SMs of the partition) or core·ms (CPU: process CPU time)."""
    if device.kind == "cuda":
        return busy_s * 1e3 * units
    return cpu_s * 1e3
