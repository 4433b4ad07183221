"""GLM-5.3's MLA without RoPE on the device (torch, CPU or CUDA); the math and shapes are in ``reference.ops.mla``
(name for name; docs/FAMILIES_MOE.md section 4.3). The latent c [L, kl] is what a cache keeps; keys and values are
expanded from it per call (the absorbed form, kv_b split into k_b / v_b as GGUF stores it, is the same math).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import sink_attention
from .norm import rms_norm

T = torch.Tensor


@dataclass
class MlaWeights:
    """One MLA layer's weights (``reference.ops.mla``)."""

    q_a: T
    q_a_norm: T
    q_b: T
    kv_a: T
    kv_a_norm: T
    kv_b: T
    o: T


def q_resid(x: T, w: MlaWeights, eps: float) -> T:
    """rms(x q_a^T) q_a_norm: [T, H] -> [T, ql]."""
    return rms_norm(F.linear(x, w.q_a), w.q_a_norm, eps)


def latent(x: T, w: MlaWeights, eps: float) -> T:
    """rms(x kv_a^T) kv_a_norm: [L, H] -> [L, kl]."""
    return rms_norm(F.linear(x, w.kv_a), w.kv_a_norm, eps)


def mla_attention(qr: T, c: T, mask: T, w: MlaWeights, heads: int, dn: int) -> T:
    """q_resid [T, ql], latent [L, kl], mask bool [T, L] -> [T, H] in qr's dtype."""
    t, length = qr.shape[0], c.shape[0]
    q = F.linear(qr, w.q_b).view(1, t, heads, dn).transpose(1, 2)                     # [1, n, T, dn]
    kv = F.linear(c, w.kv_b).view(1, length, heads, -1).transpose(1, 2)                # [1, n, L, dn + dv]
    out = sink_attention(q, kv[..., :dn].contiguous(), kv[..., dn:].contiguous(), mask, None)
    return F.linear(out[0], w.o)
