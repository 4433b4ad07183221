"""GLM-5.3's manifold-constrained hyper-connections (mHC) on the device (torch, CPU or CUDA); the math, shapes and
storage points are in ``reference.ops.mhc`` (name for name; docs/FAMILIES_MOE.md section 4.3 "mHC").

Streams x [N, S, H] in the run dtype. The norm, the ``fn`` projection and the weights pre / post / comb (Sinkhorn
included) are float32 and never stored in the run dtype; the collapse, the expand and the head's mean are summed in
float32 and rounded once to x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

T = torch.Tensor


@dataclass
class MhcWeights:
    """pre [N, S], post [N, S], comb [N, S, S] (comb[n, i, j]: stream i's share in new stream j), float32."""

    pre: T
    post: T
    comb: T


def sinkhorn(logits: T, iters: int, eps: float) -> T:
    """logits [..., S, S] -> softmax over rows + eps, a column pass, then iters-1 (row, column) passes; float32."""
    c = torch.softmax(logits.float(), dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def mhc_weights(x: T, fn: T, base: T, scale: T, iters: int, eps: float, norm_eps: float) -> MhcWeights:
    """x [N, S, H], fn [(2+S)S, S*H], base [(2+S)S], scale [3] -> MhcWeights, all float32."""
    n, s, h = x.shape
    flat = x.float().reshape(n, s * h)
    r = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    proj = F.linear(r, fn.float())
    base, scale = base.float(), scale.float()
    pre = torch.sigmoid(proj[:, :s] * scale[0] + base[:s]) + eps
    post = 2.0 * torch.sigmoid(proj[:, s:2 * s] * scale[1] + base[s:2 * s])
    comb = sinkhorn((proj[:, 2 * s:] * scale[2] + base[2 * s:]).view(n, s, s), iters, eps)
    return MhcWeights(pre, post, comb)


def mhc_collapse(x: T, pre: T) -> T:
    """sum_s pre[n, s] x[n, s]: x [N, S, H], pre [N, S] -> [N, H] in x's dtype."""
    return (pre.float()[..., None] * x.float()).sum(-2).to(x.dtype)


def mhc_expand(block_out: T, x: T, post: T, comb: T) -> T:
    """post[n, j] block_out[n] + sum_i comb[n, i, j] x[n, i]: [N, H], [N, S, H] -> [N, S, H] in x's dtype."""
    mixed = torch.einsum("nij,nih->njh", comb.float(), x.float())
    return (post.float()[..., None] * block_out.float()[..., None, :] + mixed).to(x.dtype)


def mhc_head(x: T) -> T:
    """The unweighted mean of the streams: x [N, S, H] -> [N, H] in x's dtype."""
    return x.float().mean(-2).to(x.dtype)


def hyper_head(x: T, fn: T, base: T, scale: T, eps: float, norm_eps: float) -> T:
    """DeepSeek V4's trained head collapse (``reference.ops.mhc.hyper_head``): x [N, S, H], fn [S, S*H], base [S],
    scale [1] -> [N, H] in x's dtype; the weights sigmoid((fn . rms(x)) scale + base) + eps in float32."""
    n, s, h = x.shape
    flat = x.float().reshape(n, s * h)
    r = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    pre = torch.sigmoid(F.linear(r, fn.float()) * scale.float().reshape(-1)[0] + base.float()) + eps
    return mhc_collapse(x, pre)
