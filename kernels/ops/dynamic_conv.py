"""Grouped dynamic depthwise conv on the device, plain torch path (DRAFTERS.md section 3).

Rows come in blocks of ``block`` consecutive rows (R = n_blocks * block). With T taps, G = H / g groups:

    delta   = x W_kp^T                         [..., R, 2*T*G]  viewed [..., R, 2, T, G]  (x: the sublayer input)
    k_i     = base[side, t, c] + delta_i[side, t, c // g]
    out_i[c] = res_i[c] + sum_{t=0}^{T-1} [i mod block >= t] k_i[t, c] * y_{i-t}[c]

Causal inside each block, zero before its first row: never across blocks. The arithmetic is float32
(kernel, products, the tap sum, the optional residual add) and the result is rounded once to y's dtype,
exactly as the fused Triton kernel (``kernels.triton.dynamic_conv``) does it. Differentiable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_delta(x: torch.Tensor, w_kp: torch.Tensor) -> torch.Tensor:
    """x [..., R, H], w_kp [2*T*G, H] -> delta [..., R, 2*T*G] (both sides, in x's dtype)."""
    return F.linear(x, w_kp)


def dynamic_conv(y: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, side: int, block: int,
                 res: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., R, H], delta [..., R, 2*T*G], base [2, T, H], side 0|1 -> (res +) Conv^side(y) [..., R, H]."""
    *lead, r, h = y.shape
    t = base.shape[1]
    groups = delta.shape[-1] // (2 * t)
    if r % block or h % groups or delta.shape[-1] != 2 * t * groups:
        raise ValueError(f"rows {r} / block {block}, hidden {h} / groups {groups}, delta {delta.shape[-1]}: "
                         "expected R a multiple of block, G dividing H, delta 2*T*G wide")
    nb = r // block
    yb = y.float().reshape(*lead, nb, block, h)
    d = delta.float().reshape(*lead, nb, block, 2, t, groups)[..., side, :, :]          # [..., nb, block, T, G]
    k = base[side].float() + d.repeat_interleave(h // groups, dim=-1)                   # [..., nb, block, T, H]
    acc = k[..., 0, :] * yb
    for tap in range(1, t):
        shifted = F.pad(yb, (0, 0, tap, 0))[..., :block, :]                              # row i <- y[i - tap]
        acc = acc + k[..., tap, :] * shifted
    acc = acc.reshape(*lead, r, h)
    if res is not None:
        acc = res.float() + acc
    return acc.to(y.dtype)
