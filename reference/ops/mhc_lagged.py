"""DeepSeek V4.1's lagged hyper-connection mixes (HcMix::Lagged) and the LastMix collapse, in float64 (docs/V41.md
section 4; the seed engine's ``crates/gpu-deepseek41/src/hc.rs`` ``ds41_hc_post`` and ``chain/glue.rs``, ik's
``build_hc_pre`` with ``pre_in`` / ``pre_out``).

The residual is S streams x [T, S, H], as V4's mHC (``reference.ops.mhc``: ``mhc_weights``, ``mhc_collapse``,
``mhc_expand`` are reused unchanged). Sublayers k = 0 .. 2L-1 (attention, FFN, attention, ...). Each computes its
mixes from its own input streams, but folds its input with the PREVIOUS sublayer's ``pre`` (the lag):

    (pre_k, post_k, comb_k) = mhc_weights(x_k; fn_k, base_k, scale_k)         [T, S], [T, S], [T, S, S]
    a_k      = sum_s lag_k[s] x_k[s]            lag_0 = e_0 (``lag_init``), lag_k = pre_{k-1}        [T, H]
    y_k      = sublayer_k(a_k)                  (the sublayer applies its own input norm)           [T, H]
    x_{k+1}  = post_k y_k + comb_k^T x_k        (``mhc_expand``)                                     [T, S, H]
    returns (x_{k+1}, pre_k): pre_k is the lag of sublayer k+1

and before the head the streams collapse with the last FFN's mix, which no sublayer consumed (``last_mix``):
head_in = sum_s pre_{2L-1}[s] x_{2L}[s] [T, H] (no trained head, no ``output_hc_*`` tensors).

A layer's state is (x, lag). Between layers it travels as one tap ``pack_lag`` [T, S+1, H]: the S streams, then a
row holding lag in its first S channels and zeros after (H >= S); the tap is stored in the run dtype, so the lag
is rounded there at every layer boundary (``st``), as ``kernels.ops.mhc_lagged`` stores it.

Storage points (``st``): the fold a_k (``mhc_collapse``), x_{k+1} (``mhc_expand``), the packed lag row, the
LastMix collapse. The mixes themselves are float32 on the device and never stored inside a layer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rounding import st
from ..xp import common
from .mhc import mhc_collapse, mhc_expand, mhc_weights


def lag_init(x: np.ndarray) -> np.ndarray:
    """The first sublayer's lag: one-hot on stream 0, [T, S] for streams x [T, S, H]."""
    xp, x = common(x)
    lag = xp.zeros(x.shape[:2], dtype=x.dtype)
    lag[:, 0] = 1.0
    return lag


def pack_lag(x: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """The layer-boundary tap: streams x [T, S, H] and lag [T, S] -> [T, S+1, H] (module docstring), stored."""
    xp, x, lag = common(x, lag)
    t, s, h = x.shape
    if h < s:
        raise ValueError(f"a lag row of {s} mixes does not fit a stream of width {h}")
    row = xp.zeros((t, 1, h), dtype=x.dtype)
    row[:, 0, :s] = lag
    return xp.concatenate([x, st(row)], axis=1)


def unpack_lag(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[T, S+1, H] -> (streams [T, S, H], lag [T, S])."""
    s = state.shape[1] - 1
    return state[:, :s], state[:, s, :s]


def lagged_sublayer(x: np.ndarray, lag: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray,
                    iters: int, eps: float, norm_eps: float,
                    sublayer: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One lagged sublayer (module docstring): streams x [T, S, H], its lag [T, S], its mixes' fn [(2+S)S, S*H],
    base [(2+S)S], scale [3]; ``sublayer`` maps the fold [T, H] to its output [T, H] -> (x' [T, S, H], pre [T, S])."""
    w = mhc_weights(x, fn, base, scale, iters, eps, norm_eps)
    y = sublayer(mhc_collapse(x, lag))
    return mhc_expand(y, x, w.post, w.comb), w.pre


def last_mix(x: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """The LastMix collapse before the output norm: sum_s lag[s] x[s], x [T, S, H], lag [T, S] -> [T, H]."""
    return mhc_collapse(x, lag)
