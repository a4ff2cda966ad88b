"""SM partitions for leased work on CUDA: green contexts sized to the lease, else the whole device.

`GreenContextPool(device_sms, granularity)` creates a green context per size on first use (sizes are
multiples of the granularity: 8 SMs with green contexts, Aerial's step) and caches it, so switching
between lease sizes costs a dict lookup and a stream switch (microseconds) rather than a context
creation. `scope(sm_count)` runs the enclosed work on the stream of the largest partition that fits
in the lease; on CPU, or where torch/driver have no green contexts, it is a no-op and the enforcer's
duty cycle is the only limit.
"""
from __future__ import annotations

import contextlib
import logging

log = logging.getLogger("weaver.agent.partition")


def green_supported() -> bool:
    try:
        import torch
        from torch.cuda import green_contexts
        return bool(green_contexts.SUPPORTED) and torch.cuda.is_available()
    except Exception:   # no CUDA build, no driver: simply unsupported
        return False


class GreenContextPool:
    def __init__(self, device_sms: int, granularity: int = 8, device_id: int = 0, enabled: bool | None = None):
        self.device_sms = device_sms
        self.granularity = max(1, granularity)
        self.device_id = device_id
        self.enabled = green_supported() if enabled is None else enabled
        self._contexts: dict[int, object] = {}
        self._streams: dict[int, object] = {}
        self.failed: dict[int, str] = {}

    def size_for(self, sm_count: int) -> int:
        """SMs of the partition for a lease of `sm_count`: rounded down to the granularity (the whole
        device when the lease covers it)."""
        if sm_count >= self.device_sms:
            return self.device_sms
        return (sm_count // self.granularity) * self.granularity

    def stream(self, sm_count: int):
        """The green-context stream for a lease, or None (use the default stream, duty cycle only)."""
        if not self.enabled:
            return None
        size = self.size_for(sm_count)
        if size <= 0 or size >= self.device_sms or size in self.failed:
            return None
        if size not in self._streams:
            from torch.cuda.green_contexts import GreenContext
            try:
                ctx = GreenContext.create(num_sms=size, device_id=self.device_id)
                self._contexts[size], self._streams[size] = ctx, ctx.Stream()
            except Exception as exc:   # e.g. driver too old for this size: fall back to the duty cycle
                self.failed[size] = f"{type(exc).__name__}: {exc}"
                log.warning("green context of %d SMs unavailable: %s", size, exc)
                return None
        return self._streams[size]

    @contextlib.contextmanager
    def scope(self, sm_count: int):
        s = self.stream(sm_count)
        if s is None:
            yield self.device_sms
            return
        import torch
        with torch.cuda.stream(s):
            yield self.size_for(sm_count)
