"""The traffic generator's vectorised float32 math (`testbed.model.f32math`) and the bursts it computes,
against numpy's own functions and the numpy expression the kernel replaced."""
from __future__ import annotations

import numpy as np

from testbed.model.f32math import cos_2pi_row, exp_row, log_row
from testbed.model.traffic import BURST_SIGMA, PROTECTED_ACTIVE, _bursts_kernel

F = np.float32


def test_log_exp_cos_agree_with_numpy_on_the_ranges_the_generator_uses():
    rng = np.random.default_rng(0)
    u = rng.random(50_000, dtype=F)
    x = np.concatenate([u + F(2 ** -24), np.array([1.0, 2 ** -24, 0.5, 0.75, 1e-30, 3e38], dtype=F)])
    out, scratch = np.empty_like(x), np.empty_like(x)
    log_row(x, out, scratch)
    ref = np.log(x.astype(np.float64))
    assert np.max(np.abs(out - ref) / np.maximum(np.abs(ref), 1.0)) < 5e-7
    assert out[-6] == 0.0  # ln 1 is exactly 0: an idle slot's draw stays 0 bytes
    z = (rng.random(50_000, dtype=F) * F(40) - F(20)).astype(F)
    out, scratch = np.empty_like(z), np.empty_like(z)
    exp_row(z, out, scratch)
    assert np.max(np.abs(out / np.exp(z.astype(np.float64)) - 1)) < 5e-7
    w = np.concatenate([u, np.array([0.0, 0.25, 0.5, 0.75, -0.3, 7.1], dtype=F)])
    out = np.empty_like(w)
    cos_2pi_row(w, out)
    assert np.max(np.abs(out - np.cos(2 * np.pi * w.astype(np.float64)))) < 5e-7


def _bursts_numpy(u, p_act, mp, mb):
    """The numpy expression of the bursts (what `SyntheticTrace._generate` ran before the kernel), per direction
    (P, L, T, S, C)."""
    S, _, P, C, T = u.shape
    out = []
    for d in range(2):
        a = np.empty((P, 2, T, S, C))
        x = u[:, d].copy()
        idle = x >= F(PROTECTED_ACTIVE)
        x = np.log(np.maximum((F(PROTECTED_ACTIVE) - x) * F(1 / PROTECTED_ACTIVE), idle))
        a[:, 0] = (x * -mp[d][..., None]).transpose(1, 3, 0, 2)
        p32 = p_act[..., None]
        x = u[:, 2 + d].copy()
        idle = x >= p32
        x = np.sqrt(np.log(np.maximum((p32 - x) / p32, idle)) * F(-2.0))
        x = np.exp(x * np.cos(u[:, 4 + d] * F(2 * np.pi)) * F(BURST_SIGMA) - F(BURST_SIGMA ** 2 / 2)) * ~idle
        a[:, 1] = (x * mb[d][..., None]).transpose(1, 3, 0, 2)
        out.append(a)
    return out


def test_bursts_kernel_matches_the_numpy_expression_and_keeps_idle_slots_empty():
    rng = np.random.default_rng(4)
    S, P, C, T = 5, 3, 4, 70      # T not a multiple of the kernel's row of slots
    u = rng.random((S, 6, P, C, T), dtype=F)
    p_act = rng.uniform(0.05, 0.9, (S, P, C)).astype(F)
    mp, mb = rng.uniform(10, 5e4, (2, S, P, C)), rng.uniform(10, 5e4, (2, S, P, C))
    got = np.empty((P, 2, T, S, C)), np.empty((P, 2, T, S, C))
    _bursts_kernel(u, p_act, mp, mb, *got)
    for g, ref in zip(got, _bursts_numpy(u, p_act, mp, mb), strict=True):
        np.testing.assert_array_equal(g > 0, ref > 0)
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6 * ref.mean())
