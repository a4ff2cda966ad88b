"""Bounded per-site aggregates: error-feedback compression and wire sizes. The local reduction of a
two-worker site over gloo runs live in tests/crosssite/test_churn.py."""
from __future__ import annotations

import pytest
import torch
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
