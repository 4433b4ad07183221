"""qwen4exp's gated low-rank hyper-connections (HC), in float64 (docs/FAMILIES_MOE.md section 4.5 "Modeling":
``GatedResidual``, the final ``hyper_connection_mixer``; section 6 "Math": the MTP head's ``nextn.hc_head``).

S residual streams of width H live side by side in one row x [T, S*H] (stream s = columns s*H .. (s+1)*H-1); the
embedding enters as S copies (``repeat_streams``). There are no block norms: each sublayer (attention or GDN, then
the MoE) is wrapped in a gated residual with weights norm_w [S*H], down [R, S*H], up [S*H, R], inject [S, S*H]
(R = hc_lowrank):

    xn        = grouped_norm(x)       per stream s: x_s / sqrt(mean_c x_s[c]^2 + eps) * (1 + w_s)   [T, S*H]
    mix       = sigmoid( up( silu( down(xn) / S ) ) )                                             [T, S*H]
    block_in  = mean_s ( mix_s * xn_s )                                  (MIX: what the block reads) [T, H]
    inject    = 2 sigmoid( inject_w(xn) / S )                          (INJECT: one gain a stream)   [T, S]
    x'_s      = x_s + inject_s * block(block_in)                                                 [T, S*H]

The final collapse before the head is the same gated residual without inject (``inject=None``): its block_in goes
to the head directly, with no final norm. Mix acts on the block's input and is per element; inject acts on the
block's output and is one scalar per stream: swapping the two roles is a defect the op tests plant.

Storage points (``st``, as ``kernels.ops.gated_hc`` stores them): xn, down(xn), silu(./S), up(.), the sigmoid mix,
block_in, inject_w(xn), the inject gains, and x'. Norm statistics and the elementwise chains between them are
float32 on the device, exact here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .mlp import silu
from .moe import sigmoid


@dataclass
class HcIn:
    """What a gated residual hands on: block_in [T, H] and the inject gains [T, S] (None for the mixer)."""

    block_in: np.ndarray
    inject: np.ndarray | None


def grouped_norm(x: np.ndarray, w: np.ndarray, group: int, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm over each group of ``group`` columns: x [..., S*group], w [S*group] -> [..., S*group].

        y[..., s, c] = x[..., s, c] / sqrt(mean_c' x[..., s, c']^2 + eps) * (1 + w[s*group + c])
    """
    xp, x, w = common(x, w)
    g = x.reshape(x.shape[:-1] + (-1, group))
    y = g / xp.sqrt(xp.mean(g * g, axis=-1, keepdims=True) + eps)
    return st(y.reshape(x.shape) * (1.0 + w))


def gated_residual(x: np.ndarray, norm_w: np.ndarray, down: np.ndarray, up: np.ndarray,
                   inject: np.ndarray | None, streams: int, eps: float) -> HcIn:
    """x [T, S*H] -> HcIn(block_in [T, H], inject [T, S] or None); weights as in the module docstring."""
    xp, x, norm_w, down, up, inject = common(x, norm_w, down, up, inject)
    t, sh = x.shape
    h = sh // streams
    xn = grouped_norm(x, norm_w, h, eps)
    a = st(silu(linear(xn, down) / streams))
    mix = st(sigmoid(linear(a, up)))
    block_in = st(xp.mean((mix * xn).reshape(t, streams, h), axis=1))
    if inject is None:
        return HcIn(block_in, None)
    return HcIn(block_in, st(2.0 * sigmoid(linear(xn, inject) / streams)))


def hc_inject(x: np.ndarray, block_out: np.ndarray, inject: np.ndarray) -> np.ndarray:
    """x'[t, s*H + c] = x[t, s*H + c] + inject[t, s] * block_out[t, c]:  x [T, S*H], block_out [T, H], inject [T, S]."""
    _, x, block_out, inject = common(x, block_out, inject)
    add = inject[:, :, None] * block_out[:, None, :]
    return st(x + add.reshape(x.shape))


def repeat_streams(e: np.ndarray, streams: int) -> np.ndarray:
    """The embedding into S identical streams: e [T, H] -> [T, S*H]."""
    xp, e = common(e)
    return xp.concatenate([e] * streams, axis=-1)
