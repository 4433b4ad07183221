"""SwiGLU MLP:  mlp(x) = (silu(x Wg^T) * (x Wu^T)) Wd^T      x [..., H], Wg/Wu [I, H], Wd [H, I]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
