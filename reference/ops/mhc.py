"""GLM-5.3's manifold-constrained hyper-connections (mHC), in float64 (docs/FAMILIES_MOE.md section 4.3 "mHC";
section 8.1 "residual": mHC Sinkhorn x4, mean head; the NextN layer of section 4.3 has none and is fed
``norm(mhc_head(streams))``).

S residual streams (hc_mult, 4) of width H, x [T, S, H]; the embedding enters as S copies. Each sublayer has its
weights fn [(2+S)S, S*H], base [(2+S)S], scale [3] (the converter keeps them F32) and computes, per row:

    r            = flat(x) / sqrt(mean(flat(x)^2) + eps_norm)          unweighted RMS over all S*H     [S*H]
    [p | q | c]  = fn r                                                split S, S, S*S
    pre          = sigmoid(p scale_0 + base_pre) + eps                                                 [S]
    post         = 2 sigmoid(q scale_1 + base_post)                                                    [S]
    comb         = sinkhorn(c scale_2 + base_comb as [S, S], iters, eps)                               [S, S]
    block_in     = sum_s pre_s x_s                                     (collapse)                      [H]
    x'_j         = post_j block(norm(block_in)) + sum_i comb[i, j] x_i (expand: post y + comb^T x)     [S, H]

    sinkhorn(L):  C = softmax_row(L) + eps;  C = C / (colsum(C) + eps);
                  then iters-1 times:  C = C / (rowsum(C) + eps);  C = C / (colsum(C) + eps)

so ``iters`` (hc_sinkhorn_iters, 20) counts the first column pass with the softmax as one round; C ends with
columns summing to 1 (up to eps) and rows close to 1: a doubly stochastic mix that keeps the residual's size.
Before the head the streams collapse by an unweighted mean (``mhc_head``; GLM), or by DeepSeek V4's trained
``hyper_head`` (sum_s pre_s x_s with pre = sigmoid((fn . rms(x)) scale + base) + eps), then the final RMSNorm.

Storage points (``st``, as ``kernels.ops.mhc`` stores them): block_in, x', the head's mean. The norm r, the
projection and pre / post / comb are float32 on the device and never stored in the run dtype (as the router
logits of ``moe``), so they carry no ``st`` here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import st
from ..xp import common
from .moe import sigmoid


@dataclass
class MhcWeights:
    """pre [T, S], post [T, S], comb [T, S, S] (comb[t, i, j]: stream i's share in new stream j)."""

    pre: np.ndarray
    post: np.ndarray
    comb: np.ndarray


def sinkhorn(logits: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """logits [..., S, S] -> the Sinkhorn-normalised softmax (module docstring), [..., S, S]."""
    xp, logits = common(logits)
    e = xp.exp(logits - logits.max(axis=-1, keepdims=True))
    c = e / e.sum(axis=-1, keepdims=True) + eps
    c = c / (c.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + eps)
        c = c / (c.sum(axis=-2, keepdims=True) + eps)
    return c


def mhc_weights(x: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, iters: int, eps: float,
                norm_eps: float) -> MhcWeights:
    """x [T, S, H], fn [(2+S)S, S*H], base [(2+S)S], scale [3] -> MhcWeights (module docstring)."""
    xp, x, fn, base, scale = common(x, fn, base, scale)
    t, s, h = x.shape
    flat = x.reshape(t, s * h)
    r = flat / xp.sqrt(xp.mean(flat * flat, axis=-1, keepdims=True) + norm_eps)
    proj = r @ fn.T
    pre = sigmoid(proj[:, :s] * scale[0] + base[:s]) + eps
    post = 2.0 * sigmoid(proj[:, s:2 * s] * scale[1] + base[s:2 * s])
    comb = sinkhorn((proj[:, 2 * s:] * scale[2] + base[2 * s:]).reshape(t, s, s), iters, eps)
    return MhcWeights(pre, post, comb)


def mhc_collapse(x: np.ndarray, pre: np.ndarray) -> np.ndarray:
    """block_in[t] = sum_s pre[t, s] x[t, s]: x [T, S, H], pre [T, S] -> [T, H]."""
    xp, x, pre = common(x, pre)
    return st(xp.sum(pre[:, :, None] * x, axis=1))


def mhc_expand(block_out: np.ndarray, x: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
    """x'[t, j] = post[t, j] block_out[t] + sum_i comb[t, i, j] x[t, i]: block_out [T, H], x [T, S, H] -> [T, S, H]."""
    xp, block_out, x, post, comb = common(block_out, x, post, comb)
    return st(post[:, :, None] * block_out[:, None, :] + xp.einsum("tij,tih->tjh", comb, x))


def mhc_head(x: np.ndarray) -> np.ndarray:
    """The collapse before the head (and the NextN layer's input): the unweighted mean, x [T, S, H] -> [T, H]."""
    xp, x = common(x)
    return st(xp.mean(x, axis=1))


def hyper_head(x: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, eps: float,
               norm_eps: float) -> np.ndarray:
    """DeepSeek V4's trained collapse before the head (HF ``DeepseekV4HyperHead``; FAMILIES_MOE.md 4.4 "mHC"), in
    place of ``mhc_head``'s mean: x [T, S, H], fn [S, S*H], base [S], scale [1] -> [T, H]:

        r      = flat(x) / sqrt(mean(flat(x)^2) + norm_eps)              unweighted RMS over all S*H      [S*H]
        pre    = sigmoid((fn r) scale + base) + eps                                                       [S]
        out    = sum_s pre_s x_s                                          stored once (``st``)           [H]

    The weights are float32 on the device and never stored in the run dtype (as ``mhc_weights``)."""
    xp, x, fn, base, scale = common(x, fn, base, scale)
    t, s, h = x.shape
    flat = x.reshape(t, s * h)
    r = flat / xp.sqrt(xp.mean(flat * flat, axis=-1, keepdims=True) + norm_eps)
    pre = sigmoid((r @ fn.T) * scale.reshape(-1)[0] + base) + eps
    return mhc_collapse(x, pre)
