"""Short causal depthwise convolution (the Gated DeltaNet's conv1d), in float64.

With K taps and a tail of the K-1 inputs that came before the first row (zeros at the start of a
sequence), over the concatenation xx = [tail ; x] ([K-1+T, C]):

    y[t, c] = sum_{j=0}^{K-1} w[c, j] * xx[t + j, c]          (w[c, K-1] multiplies the current row)

This is PyTorch's ``conv1d(x^T, w[:, None, :], padding=K-1, groups=C)[..., :T]`` (HF's weight is
[C, 1, K]). After row t the tail is xx[t+1 : t+K]; after the whole block it is the last K-1 rows of xx.
"""

from __future__ import annotations

import numpy as np

from ..rounding import st
from ..xp import common


def causal_conv(x: np.ndarray, w: np.ndarray, tail: np.ndarray | None = None) -> np.ndarray:
    """x [T, C], w [C, K], tail [K-1, C] or None (zeros) -> y [T, C]."""
    xp, x, w, tail = common(x, w, tail)
    t, c = x.shape
    k = w.shape[-1]
    if w.shape != (c, k):
        raise ValueError(f"conv weight {w.shape}, expected [{c}, K]")
    if tail is None:
        tail = xp.zeros((k - 1, c))
    xx = xp.concatenate([tail, x], axis=0)
    return st(sum(w[:, j] * xx[j:j + t] for j in range(k)))


def conv_tail(x: np.ndarray, k: int, tail: np.ndarray | None = None) -> np.ndarray:
    """The K-1 inputs a next block's conv reads before its first row: the last K-1 rows of [tail ; x]."""
    xp, x, tail = common(x, tail)
    if tail is None:
        tail = xp.zeros((k - 1, x.shape[1]))
    return xp.concatenate([tail, x], axis=0)[len(x):]
