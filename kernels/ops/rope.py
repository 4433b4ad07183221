"""Rotary position embedding, rotate-half (NEOX / HF) convention.

    inv_freq[i] = theta^(-2i/d)              i = 0..d/2-1
    angle[p, i] = p * inv_freq[i];   cos/sin tables [P, d] repeat the d/2 angles twice
    rope(x)[p]  = x[p] * cos[p] + rotate_half(x[p]) * sin[p],   rotate_half(x) = [-x2 ; x1]
"""

from __future__ import annotations

import torch


def rope_tables(head_dim: int, theta: float, length: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [length, head_dim] in float32."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angle = torch.arange(length, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos().float(), angle.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., R, d] with cos/sin [R, d] (already indexed at the rows' positions)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)
