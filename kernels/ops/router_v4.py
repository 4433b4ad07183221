"""DeepSeek V4's router on the device (torch, CPU or CUDA); the math is in ``reference.ops.router_v4`` (name for
name): sqrt(softplus(l)) scores, the bias for the choice only, top-k, always renormalised, times
``routed_scaling_factor``; hash layers take their ids from ``tid2eid[token_ids]``.

Everything works in float32 (the logits as ``kernels.ops.moe.router_logits`` makes them; torch's softplus, whose
linear branch above 20 is within float32 rounding of the exact value); the choice is ``topk_stable`` (ties to the
lower expert index), so the ids are exactly the host transcription's on the device's own float32 scores, and a hash
layer's ids are exactly the table's (an integer gather on the device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .moe import Routing, topk_stable

T = torch.Tensor


def sqrt_softplus(logits: T) -> T:
    """sqrt(softplus(l)) in float32: [..., E] -> [..., E]."""
    return F.softplus(logits.float()).sqrt()


def renormalised(s: T, ids: T, scale: float) -> T:
    """w = s[ids] / (sum s[ids] + 1e-20) * scale: s [N, E], ids [N, k] -> [N, k] float32."""
    w = s.gather(-1, ids)
    return w / (w.sum(-1, keepdim=True) + 1e-20) * scale


def sqrtsoftplus_topk(logits: T, bias: T, k: int, scale: float = 1.0) -> Routing:
    """A learned layer: choose on s + bias, weight with the unbiased s (``reference.ops.router_v4``)."""
    s = sqrt_softplus(logits)
    c = s + bias.float()
    ids = topk_stable(c, k)
    return Routing(ids, renormalised(s, ids, scale), c)


def hash_ids(tid2eid: T, token_ids: T) -> T:
    """ids = tid2eid[token_ids]: [V, k], [N] -> [N, k] int64 (tid2eid on the device)."""
    return tid2eid[token_ids.long()].long()


def hash_route(logits: T, tid2eid: T, token_ids: T, scale: float = 1.0) -> Routing:
    """A hash layer: ids from the table, weights from the unbiased s renormalised over them."""
    s = sqrt_softplus(logits)
    ids = hash_ids(tid2eid, token_ids)
    return Routing(ids, renormalised(s, ids, scale), s)
