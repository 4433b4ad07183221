"""Fused grouped dynamic depthwise conv (Triton): one launch per conv sublayer side.

Input is the delta projection's output; the kernel builds each row's per-channel kernels and convolves:

    program (row m, channel tile):  i = m mod block
        acc[c] = sum_{t < T, t <= i} (base[side, t, c] + delta[m, side*T*G + t*G + c // g]) * y[m - t, c]
        out[m, c] = round(res[m, c] + acc[c])          (float32 arithmetic, one rounding to y's dtype)

Same signature and rule as ``kernels.ops.dynamic_conv.dynamic_conv`` (the torch path); rows arrive as
whole blocks, so the causal window never crosses a block. Forward only (no autograd).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(y_ptr, d_ptr, base_ptr, res_ptr, out_ptr, H, DW, side_off, block, g,
                 T: tl.constexpr, HAS_RES: tl.constexpr, BH: tl.constexpr):
    m = tl.program_id(0)
    c = tl.program_id(1) * BH + tl.arange(0, BH)
    cm = c < H
    i = tl.zeros([BH], dtype=tl.int32) + m % block          # the row's index inside its block
    gs = DW // 2 // T                                           # G
    acc = tl.zeros([BH], dtype=tl.float32)
    for tap in tl.static_range(T):
        ok = cm & (i >= tap)
        yv = tl.load(y_ptr + (m - tap).to(tl.int64) * H + c, mask=ok, other=0.0).to(tl.float32)
        bv = tl.load(base_ptr + tap * H + c, mask=cm, other=0.0).to(tl.float32)
        dv = tl.load(d_ptr + m.to(tl.int64) * DW + side_off + tap * gs + c // g, mask=cm, other=0.0).to(tl.float32)
        acc += (bv + dv) * yv
    if HAS_RES:
        acc = tl.load(res_ptr + m.to(tl.int64) * H + c, mask=cm, other=0.0).to(tl.float32) + acc
    tl.store(out_ptr + m.to(tl.int64) * H + c, acc.to(out_ptr.dtype.element_ty), mask=cm)


def dynamic_conv(y: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, side: int, block: int,
                 res: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., R, H], delta [..., R, 2*T*G], base [2, T, H], side 0|1 -> (res +) Conv^side(y) [..., R, H]."""
    *lead, r, h = y.shape
    t = base.shape[1]
    dw = delta.shape[-1]
    groups = dw // (2 * t)
    if r % block or h % groups or dw != 2 * t * groups:
        raise ValueError(f"rows {r} / block {block}, hidden {h} / groups {groups}, delta {dw}: "
                         "expected R a multiple of block, G dividing H, delta 2*T*G wide")
    y2, d2 = y.reshape(-1, h).contiguous(), delta.reshape(-1, dw).contiguous()
    out = torch.empty_like(y2)
    res2 = res.reshape(-1, h).contiguous() if res is not None else y2
    bh = min(1024, triton.next_power_of_2(h))
    grid = (y2.shape[0], triton.cdiv(h, bh))
    _conv_kernel[grid](y2, d2, base[side].contiguous(), res2, out, h, dw, side * t * groups, block, h // groups,
                       T=t, HAS_RES=res is not None, BH=bh)
    return out.view(*lead, r, h)
