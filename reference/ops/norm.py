"""RMSNorm and LayerNorm in float64."""

from __future__ import annotations

import numpy as np

from ..rounding import st
from ..xp import common


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Root-mean-square norm over the last axis, then a per-channel scale.

        y[..., i] = x[..., i] / sqrt(mean_j x[..., j]^2 + eps) * w[i]

    x: [..., n]; w: [n]; returns [..., n]. Used with n = hidden size (layer norms, final norm)
    and n = head_dim (Qwen3's per-head q_norm / k_norm).
    """
    xp, x, w = common(x, w)
    ms = xp.mean(x * x, axis=-1, keepdims=True)
    return st(x / xp.sqrt(ms + eps) * w)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * w + b over the last axis."""
    xp, x, w, b = common(x, w, b)
    c = x - xp.mean(x, axis=-1, keepdims=True)
    return st(c / xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True) + eps) * w + b)
