"""DeepSeek V4.1's lagged hyper-connection mixes and the LastMix collapse on the device (torch, CPU or CUDA); the
math, shapes and storage points are in ``reference.ops.mhc_lagged`` (name for name; docs/V41.md section 4).

Streams x [N, S, H] in the run dtype; the mixes (``kernels.ops.mhc.mhc_weights``) and the lag [N, S] are float32
inside a layer; the fold, the expand and the LastMix collapse are summed in float32 and rounded once to x's dtype;
the layer-boundary tap ``pack_lag`` [N, S+1, H] stores the lag in x's dtype.

    (pre_k, post_k, comb_k) = mhc_weights(x_k)
    x_{k+1} = post_k sublayer_k(sum_s lag_k[s] x_k[s]) + comb_k^T x_k,    lag_0 = e_0, lag_{k+1} = pre_k
    head_in = sum_s lag_{2L}[s] x_{2L}[s]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .mhc import mhc_collapse, mhc_expand, mhc_weights

T = torch.Tensor


def lag_init(x: T) -> T:
    """The first sublayer's lag: one-hot on stream 0, [N, S] float32 for streams x [N, S, H]."""
    lag = torch.zeros(x.shape[:2], dtype=torch.float32, device=x.device)
    lag[:, 0] = 1.0
    return lag


def pack_lag(x: T, lag: T) -> T:
    """Streams x [N, S, H] and lag [N, S] -> the tap [N, S+1, H] in x's dtype (the lag row zero past S)."""
    n, s, h = x.shape
    if h < s:
        raise ValueError(f"a lag row of {s} mixes does not fit a stream of width {h}")
    row = x.new_zeros(n, 1, h)
    row[:, 0, :s] = lag.to(x.dtype)
    return torch.cat([x, row], dim=1)


def unpack_lag(state: T) -> tuple[T, T]:
    """[N, S+1, H] -> (streams [N, S, H] in the run dtype, lag [N, S] float32)."""
    s = state.shape[1] - 1
    return state[:, :s], state[:, s, :s].float()


def lagged_sublayer(x: T, lag: T, fn: T, base: T, scale: T, iters: int, eps: float, norm_eps: float,
                    sublayer: Callable[[T], T]) -> tuple[T, T]:
    """One lagged sublayer: x [N, S, H], lag [N, S]; ``sublayer`` maps the fold [N, H] to [N, H] -> (x', pre)."""
    w = mhc_weights(x, fn, base, scale, iters, eps, norm_eps)
    y = sublayer(mhc_collapse(x, lag))
    return mhc_expand(y, x, w.post, w.comb), w.pre


def last_mix(x: T, lag: T) -> T:
    """The LastMix collapse: sum_s lag[s] x[s], x [N, S, H], lag [N, S] -> [N, H] in x's dtype."""
    return mhc_collapse(x, lag)
