"""RMSNorm on the device.

    rms_norm(x, w)[..., c] = x[..., c] / sqrt(mean_c(x^2) + eps) * w[c]      x: [..., H], w: [H]

The statistics are taken in float32 whatever the storage dtype; the result returns in x's dtype.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)
