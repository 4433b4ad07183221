"""Rotary position embedding, rotate-half (HF / GPT-NeoX) convention, in float64.

Channel i of a head (i < d/2) is paired with channel i + d/2 (not with i+1 as in GPT-J).
"""

from __future__ import annotations

import numpy as np

from ..rounding import st


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """inv_freq[i] = theta^(-2i/d), i = 0..d/2-1. Returns [d/2]."""
    i = np.arange(0, head_dim, 2, dtype=np.float64)
    return 1.0 / (theta ** (i / head_dim))


def cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Angles a[t, i] = positions[t] * inv_freq[i], duplicated to the full head: [a, a].

    positions: [T] (integers); returns (cos, sin), each [T, d].
    """
    a = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq(head_dim, theta)[None, :]
    a = np.concatenate([a, a], axis=-1)
    return np.cos(a), np.sin(a)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] -> [-x2, x1] over the last axis (x1, x2 its two halves)."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate every head of every row by its position.

        y[t, h, :] = x[t, h, :] * cos[t] + rotate_half(x[t, h, :]) * sin[t]

    x: [T, heads, d]; positions: [T]; returns [T, heads, d].
    """
    cos, sin = cos_sin(positions, x.shape[-1], theta)
    return st(x * cos[:, None, :] + rotate_half(x) * sin[:, None, :])
