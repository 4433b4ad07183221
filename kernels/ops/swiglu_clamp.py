"""GLM-5.3's clamped SwiGLU on the device (torch, CPU or CUDA); the math and the storage points are in
``reference.ops.swiglu_clamp`` (name for name; docs/FAMILIES_MOE.md section 4.3 "Experts").

    y = ( silu(min(x Wg^T, L)) * clip(x Wu^T, -L, L) ) Wd^T

Routed experts gather-based as ``kernels.ops.moe.routed_experts`` (a row's numbers depend only on that row at a
given row count), with the clamp inside each expert; the weighted sum in float32, stored once in x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .moe import GATHER_BUDGET, Routing

T = torch.Tensor


def clamp_act(g: T, u: T, limit: float) -> T:
    """silu(g.clamp(max=L)) * u.clamp(-L, L), each op stored in g's dtype: [..., I] -> [..., I]."""
    return F.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)


def swiglu_clamped(x: T, wg: T, wu: T, wd: T, limit: float) -> T:
    """x [..., H], Wg / Wu [I, H], Wd [H, I] -> [..., H] in x's dtype."""
    return F.linear(clamp_act(F.linear(x, wg), F.linear(x, wu), limit), wd)


def routed_experts_clamped(x: T, routing: Routing, gate_up: T, down: T, limit: float,
                           budget: int = GATHER_BUDGET) -> T:
    """x [N, H], gate_up [E, 2I, H], down [E, H, I] -> [N, H] in x's dtype (see the module docstring)."""
    n, k = routing.ids.shape
    i = down.shape[-1]
    flat_ids = routing.ids.reshape(-1)
    rows = torch.arange(n, device=x.device).repeat_interleave(k)
    chunk = max(1, budget // ((gate_up[0].numel() + down[0].numel()) * gate_up.element_size()))
    ys = []
    for s in range(0, n * k, chunk):
        e, xr = flat_ids[s:s + chunk], x[rows[s:s + chunk]]
        gu = torch.bmm(gate_up[e], xr[:, :, None])[..., 0]                    # [P, 2I]
        ys.append(torch.bmm(down[e], clamp_act(gu[:, :i], gu[:, i:], limit)[:, :, None])[..., 0])
    y = torch.cat(ys).view(n, k, -1).float()
    return (routing.weights.float()[..., None] * y).sum(1).to(x.dtype)
