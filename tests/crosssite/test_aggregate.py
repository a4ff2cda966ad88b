"""Bounded per-site aggregates: error-feedback compression, wire sizes, and a real two-worker site
reducing over gloo before its leader sends one vector."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.crosssite.aggregate import ErrorFeedback, SiteReducer, decompress, quantize_int8, wire_bytes

pytestmark = pytest.mark.agent


def test_wire_bytes_are_bounded_by_the_model_not_the_workers():
    assert wire_bytes(1000, "none") == 4000
    assert wire_bytes(1000, "bf16") == 2000
    assert wire_bytes(1000, "int8") == 1004
    with pytest.raises(ValueError, match="compression"):
        wire_bytes(10, "fp8")
    with pytest.raises(ValueError, match="compression"):
        ErrorFeedback("int4")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=64))
def test_int8_quantisation_error_is_at_most_half_a_step(values):
    x = torch.tensor(values, dtype=torch.float32)
    q = quantize_int8(x)
    assert q.values.dtype == torch.int8
    assert (q.dequantize() - x).abs().max() <= q.scale / 2 + 1e-4 * max(1.0, float(x.abs().max()))


@pytest.mark.parametrize("compression", ["bf16", "int8"])
def test_error_feedback_loses_nothing_over_rounds(compression):
    """Sum of what was sent + the residual still owed == sum of the true vectors (EF invariant)."""
    g = torch.Generator().manual_seed(0)
    ef = ErrorFeedback(compression)
    sent = torch.zeros(256)
    true = torch.zeros(256)
    for _ in range(20):
        x = torch.randn(256, generator=g) * 1e-3
        true += x
        sent += decompress(ef.compress(x))
    torch.testing.assert_close(sent + ef.residual, true, atol=1e-5, rtol=1e-4)


def test_rollback_forgets_an_uncommitted_rounds_residual():
    ef = ErrorFeedback("int8")
    ef.compress(torch.tensor([1.0, 0.3]))
    before = ef.residual.clone()
    ef.compress(torch.tensor([0.2, 0.7]))
    ef.rollback()
    torch.testing.assert_close(ef.residual, before)


def test_single_worker_site_needs_no_group():
    r = SiteReducer()
    torch.testing.assert_close(r.reduce_payload(torch.ones(3)), torch.ones(3))
    with pytest.raises(ValueError):
        SiteReducer(rank=0, world_size=2)
    with pytest.raises(ValueError):
        SiteReducer(rank=2, world_size=2, group=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for compression in ("none", "int8"):
            red = SiteReducer(rank=rank, world_size=2, group=dist.group.WORLD, compression=compression)
            payload = torch.arange(8, dtype=torch.float32) * (rank + 1) / 7   # worker 1 sends twice worker 0
            stats = red.reduce_stats(torch.tensor([10.0 * (rank + 1), 1.0], dtype=torch.float64))
            summed = red.reduce_payload(payload)
            flag = red.broadcast(torch.tensor([rank + 5.0]))
            if rank == 0:
                out.put((compression, summed.tolist(), stats.tolist(), flag.tolist()))
            else:
                out.put(("worker", flag.tolist()))
    finally:
        dist.destroy_process_group()


def test_two_workers_reduce_on_the_site_leader():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=90) for _ in range(4)]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    expect = (torch.arange(8, dtype=torch.float32) * 3 / 7).tolist()
    for compression, tol in (("none", 1e-6), ("int8", 0.02)):
        leader = next(g for g in got if g[0] == compression)
        assert all(abs(a - b) <= tol for a, b in zip(leader[1], expect, strict=True)), leader
        assert leader[2] == [30.0, 2.0]
        assert leader[3] == [5.0]
    assert [g[1] for g in got if g[0] == "worker"] == [[5.0], [5.0]]   # the leader's value reached the worker
