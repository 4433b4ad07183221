"""Rotary position embedding, rotate-half (NEOX / HF) convention.

    inv_freq[i] = theta^(-2i/d)              i = 0..d/2-1      (default RoPE)
    angle[p, i] = p * inv_freq[i];   cos/sin tables [P, d] repeat the d/2 angles twice, times attention_factor
    rope(x)[p]  = x[p] * cos[p] + rotate_half(x[p]) * sin[p],   rotate_half(x) = [-x2 ; x1]

Scaled RoPE (``RopeScaling``): the same formulas as ``reference/ops/rope.py`` (name for name), here in torch
float64 on the host before the tables are cast:
    linear  inv_freq / factor
    yarn    inv_freq (1 - ramp) + inv_freq / factor * ramp,  ramp[i] = clip((i - lo) / (hi - lo), 0, 1),
            lo, hi = floor / ceil of d ln(L0 / (2 pi beta)) / (2 ln theta) at beta_fast, beta_slow, clipped to
            [0, d - 1]; attention_factor = given, or m(f, mscale) / m(f, mscale_all_dim), or m(f, 1),
            m(s, k) = 0.1 k ln s + 1 (1 when s <= 1)
"""

from __future__ import annotations

import math

import torch

from bloomery_gates.spec import RopeScaling


def attention_factor(scaling: RopeScaling | None) -> float:
    """The cos/sin multiplier (1 for default and linear RoPE)."""
    if scaling is None or scaling.kind != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)

    def m(s: float, k: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return m(scaling.factor, scaling.mscale) / m(scaling.factor, scaling.mscale_all_dim)
    return m(scaling.factor)


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """[d/2] float64 on the host."""
    base = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is None:
        return base
    if scaling.kind == "linear":
        return base / scaling.factor
    d, big = head_dim, scaling.original_max_position
    lo = d * math.log(big / (scaling.beta_fast * 2 * math.pi)) / (2 * math.log(theta))
    hi = d * math.log(big / (scaling.beta_slow * 2 * math.pi)) / (2 * math.log(theta))
    if scaling.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0.0, 1.0)
    return base * (1.0 - ramp) + base / scaling.factor * ramp


def rope_tables(head_dim: int, theta: float, length: int, device: torch.device | str,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [length, head_dim] in float32 (computed in float64, times the attention factor)."""
    f = inv_freq(head_dim, theta, scaling).to(device)
    angle = torch.arange(length, dtype=torch.float64, device=device)[:, None] * f[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    m = attention_factor(scaling)
    return (angle.cos() * m).float(), (angle.sin() * m).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., R, d] with cos/sin [R, d] (already indexed at the rows' positions)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., R, d], cos/sin [R, r]: rotate channels [0, r), pass the rest (the hybrids' partial rotary; the
    reference's ``reference.ops.rope.partial_rope``)."""
    r = cos.shape[-1]
    return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
