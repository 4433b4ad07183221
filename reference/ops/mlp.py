"""SwiGLU MLP in float64."""

from __future__ import annotations

import numpy as np

from ..rounding import linear, st
from ..xp import ns


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x * sigmoid(x), sigmoid(x) = 1 / (1 + exp(-x)) = (1 + tanh(x/2)) / 2.

    The tanh form is the same function and cannot overflow for large negative x.
    """
    return x * 0.5 * (1.0 + ns(x).tanh(0.5 * x))


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """down( silu(x Wg^T) * (x Wu^T) ).

    x: [T, H]; w_gate, w_up: [I, H]; w_down: [H, I] (weights [out, in]); returns [T, H].
    """
    return linear(st(st(silu(linear(x, w_gate))) * linear(x, w_up)), w_down)
