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
        built = getattr(green_contexts, "SUPPORTED", hasattr(torch._C, "_CUDAGreenContext"))
        return bool(built) and torch.cuda.is_available()
    except Exception:   # no CUDA build, no driver: simply unsupported
        return False


def create_green_context(num_sms: int, device_id: int = 0):
    from torch.cuda.green_contexts import GreenContext
    return GreenContext.create(num_sms=num_sms, device_id=device_id)


@contextlib.contextmanager
def green_scope(ctx, stream=None):
    """Run the enclosed work in green context `ctx`: on its stream where torch offers one (2.12+),
    else by making it the current context (torch 2.10/2.11 expose only set_context/pop_context)."""
    import torch
    if stream is None and hasattr(ctx, "Stream"):
        stream = ctx.Stream()
    if stream is not None:
        with torch.cuda.stream(stream):
            yield
        return
    ctx.set_context()
    try:
        yield
    finally:
        ctx.pop_context()


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

    def context(self, sm_count: int):
        """The green context for a lease, or None (default stream, duty cycle only)."""
        if not self.enabled:
            return None
        size = self.size_for(sm_count)
        if size <= 0 or size >= self.device_sms or size in self.failed:
            return None
        if size not in self._contexts:
            try:
                ctx = create_green_context(size, self.device_id)
                self._contexts[size] = ctx
                self._streams[size] = ctx.Stream() if hasattr(ctx, "Stream") else None
            except Exception as exc:   # e.g. driver too old for this size: fall back to the duty cycle
                self.failed[size] = f"{type(exc).__name__}: {exc}"
                log.warning("green context of %d SMs unavailable: %s", size, exc)
                return None
        return self._contexts[size]

    @contextlib.contextmanager
    def scope(self, sm_count: int):
        ctx = self.context(sm_count)
        if ctx is None:
            yield self.device_sms
            return
        size = self.size_for(sm_count)
        with green_scope(ctx, self._streams[size]):
            yield size
