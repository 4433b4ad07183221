"""Grouped dynamic depthwise conv over the B rows of one block, in float64 (DRAFTERS.md section 3).

With x the sublayer INPUT rows [B, H] (the normed rows entering attention or the MLP), T taps, group
size g and G = H / g kernel groups:

    delta_i          = W_kp x_i  viewed [2, T, G]          side s = 0 (in) or 1 (out), tap t, group
    k^s_{i,t,c}      = base^s[t, c] + delta_i[s, t, c // g]
    Conv^s(y)_i[c]   = sum_{t=0}^{T-1} [i >= t] k^s_{i,t,c} * y_{i-t}[c]

Causal inside the block (row i reads rows i, i-1, ..., i-T+1 of the SAME block), zero before row 0:
never across blocks, never over context rows. Both sides of a sublayer use the delta of one input.
"""

from __future__ import annotations

import numpy as np

from ..rounding import linear
from ..xp import common


def conv_delta(x: np.ndarray, w_kp: np.ndarray, t: int) -> np.ndarray:
    """x [B, H], w_kp [2*T*G, H] -> delta [B, 2, T, G]."""
    d = linear(x, w_kp)
    return d.reshape(len(x), 2, t, -1)


def dynamic_conv(y: np.ndarray, delta: np.ndarray, base: np.ndarray, side: int) -> np.ndarray:
    """y [B, H] (one block), delta [B, 2, T, G], base [2, T, H], side 0|1 -> Conv^side(y) [B, H]."""
    xp, y, delta, base = common(y, delta, base)
    b, h = y.shape
    t, groups = delta.shape[2], delta.shape[3]
    if h % groups:
        raise ValueError(f"{groups} kernel groups do not divide hidden size {h}")
    k = base[side][None] + xp.repeat(delta[:, side], h // groups, axis=-1)   # [B, T, H]
    out = xp.zeros_like(y)
    for i in range(b):
        for tap in range(min(t, i + 1)):
            out[i] += k[i, tap] * y[i - tap]
    return out
