"""Rotary position embedding, rotate-half (HF / GPT-NeoX) convention, in float64.

Channel i of a head (i < d/2) is paired with channel i + d/2 (not with i+1 as in GPT-J).

Scaled RoPE (``RopeScaling``, transformers' ``modeling_rope_utils``), d = head_dim, base = theta:

    default  f[i] = base^(-2i/d)                                   i = 0..d/2-1          [d/2]
    linear   f[i] = base^(-2i/d) / factor                          attention factor 1
    yarn     corr(n)  = d ln(L0 / (2 pi n)) / (2 ln base)          L0 = original_max_position
             lo, hi   = corr(beta_fast), corr(beta_slow)           floor / ceil when truncate
             lo, hi   = max(lo, 0), min(hi, d - 1);  hi += 0.001 if lo == hi
             ramp[i]  = clip((i - lo) / (hi - lo), 0, 1)
             f[i]     = base^(-2i/d) (1 - ramp[i]) + base^(-2i/d) / factor * ramp[i]
             (the fast, low-i channels keep their frequency; the slow ones are interpolated)
             attention factor a = attention_factor if given, else m(factor, mscale) / m(factor, mscale_all_dim)
             when both are given, else m(factor, 1);  m(s, k) = 1 if s <= 1 else 0.1 k ln(s) + 1
    cos/sin tables are multiplied by a, so q . k picks up a^2 (HF: ``cos * attention_scaling``).
"""

from __future__ import annotations

import math

import numpy as np

from bloomery_gates.spec import RopeScaling

from ..rounding import st
from ..xp import common, ns


def _mscale(scale: float, k: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0


def attention_factor(scaling: RopeScaling | None) -> float:
    """The cos/sin multiplier a (1 for default and linear RoPE)."""
    if scaling is None or scaling.kind != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return _mscale(scaling.factor, scaling.mscale) / _mscale(scaling.factor, scaling.mscale_all_dim)
    return _mscale(scaling.factor)


def yarn_ramp(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """ramp [d/2] in [0, 1]: 0 keeps a channel's frequency (extrapolation), 1 divides it by factor."""
    d = head_dim

    def corr(n: float) -> float:
        return d * math.log(scaling.original_max_position / (n * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = corr(scaling.beta_fast), corr(scaling.beta_slow)
    if scaling.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    return np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """f[i] of the module docstring, i = 0..d/2-1. Returns [d/2]."""
    i = np.arange(0, head_dim, 2, dtype=np.float64)
    f = 1.0 / (theta ** (i / head_dim))
    if scaling is None:
        return f
    if scaling.kind == "linear":
        return f / scaling.factor
    ramp = yarn_ramp(head_dim, theta, scaling)
    return f * (1.0 - ramp) + (f / scaling.factor) * ramp


def cos_sin(positions: np.ndarray, head_dim: int, theta: float,
            scaling: RopeScaling | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Angles a[t, i] = positions[t] * inv_freq[i], duplicated to the full head: [a, a]; both tables times
    the attention factor.

    positions: [T] (integers); returns (cos, sin), each [T, d].
    """
    xp = ns(positions)
    a = xp.asarray(positions, dtype=np.float64)[:, None] * xp.asarray(inv_freq(head_dim, theta, scaling))[None, :]
    a = xp.concatenate([a, a], axis=-1)
    m = attention_factor(scaling)
    return xp.cos(a) * m, xp.sin(a) * m


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] -> [-x2, x1] over the last axis (x1, x2 its two halves)."""
    h = x.shape[-1] // 2
    return ns(x).concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """Rotate every head of every row by its position.

        y[t, h, :] = x[t, h, :] * cos[t] + rotate_half(x[t, h, :]) * sin[t]

    x: [T, heads, d]; positions: [T]; returns [T, heads, d].
    """
    _, x, positions = common(x, positions)
    cos, sin = cos_sin(positions, x.shape[-1], theta, scaling)
    return st(x * cos[:, None, :] + rotate_half(x) * sin[:, None, :])


def partial_rope(x: np.ndarray, positions: np.ndarray, rotary_dim: int, theta: float) -> np.ndarray:
    """x [T, heads, d]: rotate channels [0, rotary_dim) by position (rotate-half), pass the rest (the hybrids'
    partial rotary; the kernel's ``kernels.ops.rope.partial_rope``)."""
    rot = apply_rope(x[..., :rotary_dim], positions, theta)
    return ns(rot).concatenate([rot, x[..., rotary_dim:]], axis=-1)
