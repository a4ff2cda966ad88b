"""float32 log, exp and cos(2 pi u) over contiguous rows, in loops the compiler vectorises.

The traffic generator's bursts need about two transcendental functions per cell and slot. numba compiles
`np.log` of a scalar to a scalar libm call (no SVML on these hosts), four times slower than numpy's SIMD
loops; these Cephes-style polynomials (single precision, within 3e-7 of libm on the ranges used here)
compile to branch-free vector code instead. Each function reads one row and writes another of the same
length; `scratch` is a float32 row the caller owns (the exponent bits pass through it).
"""
from __future__ import annotations

import numpy as np

from testbed.model.jit import njit

_F = np.float32
_ONE, _HALF = _F(1.0), _F(0.5)
_SQRT_HALF = _F(0.707106781186547524)
_LN2_HI, _LN2_LO = _F(0.693359375), _F(-2.12194440e-4)
_LOG2E = _F(1.44269504088896341)
_L0, _L1, _L2, _L3, _L4 = _F(7.0376836292e-2), _F(-1.1514610310e-1), _F(1.1676998740e-1), _F(-1.2420140846e-1), \
    _F(1.4249322787e-1)
_L5, _L6, _L7, _L8 = _F(-1.6668057665e-1), _F(2.0000714765e-1), _F(-2.4999993993e-1), _F(3.3333331174e-1)
_E0, _E1, _E2, _E3, _E4, _E5 = _F(1.9875691500e-4), _F(1.3981999507e-3), _F(8.3334519073e-3), \
    _F(4.1665795894e-2), _F(1.6666665459e-1), _F(5.0000001201e-1)
_QUARTER, _TWO_PI = _F(0.25), _F(2 * np.pi)
# sin x = x (1 - x^2/3! + x^4/5! - ...), to x^13: below 1e-8 on |x| <= pi / 2
_S1, _S2, _S3, _S4, _S5, _S6 = (_F((-1) ** k / np.prod(np.arange(2, 2 * k + 2))) for k in range(1, 7))


@njit(cache=True, nogil=True)
def log_row(x, out, scratch):
    """out = ln(x) for finite x > 0 (float32 rows)."""
    bits = x.view(np.int32)
    mant = scratch.view(np.int32)
    for t in range(x.shape[0]):
        mant[t] = (bits[t] & 0x807FFFFF) | 0x3F000000  # the mantissa as a float in [0.5, 1)
    for t in range(x.shape[0]):
        e = _F(((bits[t] >> 23) & 0xFF) - 126)
        m = scratch[t]
        small = m < _SQRT_HALF
        e = e - _ONE if small else e
        m = (m + m - _ONE) if small else (m - _ONE)
        z = m * m
        y = ((((((((_L0 * m + _L1) * m + _L2) * m + _L3) * m + _L4) * m + _L5) * m + _L6) * m + _L7) * m + _L8) * m * z
        out[t] = m + (y + _LN2_LO * e - _HALF * z) + _LN2_HI * e


@njit(cache=True, nogil=True)
def exp_row(x, out, scratch):
    """out = e^x for |x| < 80 (float32 rows)."""
    scale = scratch.view(np.int32)
    for t in range(x.shape[0]):
        n = np.floor(_LOG2E * x[t] + _HALF)
        r = x[t] - n * _LN2_HI - n * _LN2_LO
        out[t] = ((((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5) * (r * r) + r) + _ONE
        scale[t] = (np.int32(n) + 127) << 23  # 2^n as float32 bits
    for t in range(x.shape[0]):
        out[t] *= scratch[t]


@njit(cache=True, nogil=True)
def cos_2pi_row(u, out):
    """out = cos(2 pi u) for any finite u (float32 rows): cos(2 pi |w|) = sin(2 pi (1/4 - |w|)), w = u - round(u)."""
    for t in range(u.shape[0]):
        w = u[t] - np.floor(u[t] + _HALF)
        x = _TWO_PI * (_QUARTER - np.abs(w))
        z = x * x
        out[t] = x * (_ONE + z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6))))))
