"""qwen4exp's gated low-rank hyper-connections on the device (torch, CPU or CUDA); the math, shapes and the
storage points are in ``reference.ops.gated_hc`` (name for name; docs/FAMILIES_MOE.md section 4.5 "Modeling",
section 6 "Math" for the MTP head's ``hc_head``).

Streams x [N, S*H] (S streams of width H, stream s at columns s*H .. (s+1)*H-1). Statistics and every elementwise
chain run in float32; each stored output (the normed streams, the two projections, the mix, the block input, the
inject weights, the new streams) is rounded once to x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

T = torch.Tensor


@dataclass
class HcIn:
    """What a gated residual hands on: the block input [N, H] and the inject weights [N, S] (None for a mixer)."""

    block_in: T
    inject: T | None


def grouped_norm(x: T, w: T, group: int, eps: float) -> T:
    """Zero-centred RMSNorm over each group of ``group`` columns: x [..., S*H], w [S*H] -> x's dtype."""
    x32 = x.float().unflatten(-1, (-1, group))
    y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    return (y * (1.0 + w.float())).to(x.dtype)


def gated_residual(x: T, norm_w: T, down: T, up: T, inject: T | None, streams: int, eps: float) -> HcIn:
    """x [N, S*H]; norm_w [S*H]; down [R, S*H]; up [S*H, R]; inject [S, S*H] or None (the final mixer) -> HcIn."""
    h = x.shape[-1] // streams
    xn = grouped_norm(x, norm_w, h, eps)
    d = F.linear(xn, down)
    a = F.silu(d.float() / streams).to(x.dtype)
    mix = torch.sigmoid(F.linear(a, up).float()).to(x.dtype)
    block_in = (mix.float() * xn.float()).unflatten(-1, (streams, h)).mean(-2).to(x.dtype)
    if inject is None:
        return HcIn(block_in, None)
    inj = (2.0 * torch.sigmoid(F.linear(xn, inject).float() / streams)).to(x.dtype)
    return HcIn(block_in, inj)


def hc_inject(x: T, block_out: T, inject: T) -> T:
    """New streams x [N, S*H] + block_out [N, H] scaled per stream by inject [N, S] -> [N, S*H] in x's dtype."""
    add = inject.float()[..., :, None] * block_out.float()[..., None, :]
    return (x.float() + add.flatten(-2)).to(x.dtype)


def repeat_streams(e: T, streams: int) -> T:
    """The embedding into S identical streams: e [N, H] -> [N, S*H]."""
    return e.repeat(*([1] * (e.dim() - 1)), streams)
