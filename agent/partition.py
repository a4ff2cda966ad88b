"""SM partitions for leased work on CUDA: a green context of at most the lease's SMs, or nothing.

`GreenContextPool(device_sms, granularity)` creates a green context per size on first use (sizes are
multiples of the granularity: 8 SMs with green contexts, Aerial's step) and caches it, so switching
between lease sizes costs a dict lookup and a stream switch (microseconds) rather than a context
creation. `acquire(sm_count)` gives the partition a lease may run in: the whole device for a lease
that covers it, else the largest green context no bigger than the lease whose creation has not
failed, else 0. Leased work on a GPU never falls back to the whole device for a smaller lease (a
40-SM lease on 132 SMs at duty 1.0 would take them all): with no partition the agent refuses the
lease, and `scope()` raises `PartitionUnavailable` rather than run outside one.

Fault injection: with WEAVER_FAULT_GREEN_CONTEXT_FAIL=1 in the environment, every green-context
creation fails (all sizes), as on a driver without them; tests and the testbed use it to exercise the
refusal path. The pool takes its `create` callable as an argument, so tests can inject a fake.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

log = logging.getLogger("weaver.agent.partition")

FAULT_ENV = "WEAVER_FAULT_GREEN_CONTEXT_FAIL"


class PartitionUnavailable(RuntimeError):
    """Leased work was asked to run where no partition of at most the lease's size exists."""


def green_supported() -> bool:
    try:
        import torch
        from torch.cuda import green_contexts
        built = getattr(green_contexts, "SUPPORTED", hasattr(torch._C, "_CUDAGreenContext"))
        return bool(built) and torch.cuda.is_available()
    except Exception:   # no CUDA build, no driver: simply unsupported
        return False


def create_green_context(num_sms: int, device_id: int = 0):
    if os.environ.get(FAULT_ENV) == "1":
        raise RuntimeError(f"{FAULT_ENV}=1: green-context creation fails (fault injection)")
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
    def __init__(self, device_sms: int, granularity: int = 8, device_id: int = 0, enabled: bool | None = None,
                 create: Callable[[int, int], object] = create_green_context):
        self.device_sms = device_sms
        self.granularity = max(1, granularity)
        self.device_id = device_id
        self.enabled = green_supported() if enabled is None else enabled
        self.create = create          # (num_sms, device_id) -> green context; raises when it cannot
        self._contexts: dict[int, object] = {}
        self._streams: dict[int, object] = {}
        self.failed: dict[int, str] = {}

    def size_for(self, sm_count: int) -> int:
        """SMs of the partition for a lease of `sm_count`: the whole device when the lease covers it,
        else the largest multiple of the granularity within the lease whose creation has not failed
        (0: none)."""
        if sm_count >= self.device_sms:
            return self.device_sms
        size = (sm_count // self.granularity) * self.granularity
        while size > 0 and size in self.failed:
            size -= self.granularity
        return size

    def acquire(self, sm_count: int) -> int:
        """The partition leased work of `sm_count` SMs may run in, its green context created (and
        cached) if needed: `device_sms` for a lease covering the device, a green context's size
        (<= the lease), or 0 when none can be had (unsupported, or every size that fits failed)."""
        if sm_count >= self.device_sms:
            return self.device_sms
        if not self.enabled:
            return 0
        while (size := self.size_for(sm_count)) > 0:
            if size in self._contexts:
                return size
            try:
                ctx = self.create(size, self.device_id)
                self._streams[size] = ctx.Stream() if hasattr(ctx, "Stream") else None
                self._contexts[size] = ctx
                return size
            except Exception as exc:   # e.g. driver too old for this size: try the next smaller one
                self.failed[size] = f"{type(exc).__name__}: {exc}"
                log.warning("green context of %d SMs unavailable: %s", size, exc)
        return 0

    @contextlib.contextmanager
    def scope(self, sm_count: int):
        """Run the enclosed work in the partition for a lease of `sm_count`; yields its SMs."""
        size = self.acquire(sm_count)
        if size == 0:
            raise PartitionUnavailable(f"no partition of at most {sm_count} of {self.device_sms} SMs")
        if size >= self.device_sms:
            yield size
            return
        with green_scope(self._contexts[size], self._streams[size]):
            yield size
