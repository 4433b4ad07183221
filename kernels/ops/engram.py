"""DeepSeek V4.1's engram site on the device (torch, CPU or CUDA); the math and storage points are in
``reference.ops.engram`` (name for name; docs/V41.md 7). The projection in the run dtype; the norms, the gate and
the add in float32, x' rounded once to x's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

T = torch.Tensor


def engram(x: T, emb: T, wkv: T, k_gain: T, q_gain: T, eps: float) -> T:
    """x [N, S, H], emb [N, n_cols key_len], wkv [(S+1) H, n_cols key_len], k_gain / q_gain [S, H] -> x'."""
    n, s, h = x.shape
    kv = F.linear(emb.to(x.dtype), wkv).float()
    key, v = kv[:, :s * h].view(n, s, h), kv[:, s * h:]

    def rms(a: T) -> T:
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)

    z = (rms(key) * k_gain.float() * rms(x.float()) * q_gain.float()).sum(-1) / h ** 0.5
    gate = torch.sigmoid(torch.sign(z) * torch.sqrt(torch.clamp(z.abs(), min=1e-6)))
    return (x.float() + gate[:, :, None] * v[:, None, :]).to(x.dtype)
