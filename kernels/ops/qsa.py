"""qwen4exp's QSA block mask on the device (torch, CPU or CUDA); the math and storage points are in
``reference.ops.qsa`` (name for name; docs/FAMILIES_MOE.md section 4.5 "QSA"). Selection machinery shared with
``kernels.ops.dsa``; scores and the choice in float32 (``topk_stable``: ties to the lower block).

The rope tables cos, sin [L, rd] are the model's (``rope.rope_tables`` of the rotary width, rows = positions
0..L-1): queries read rows pos, block b reads row b r.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .dsa import Selection, candidates, choose_pools, tail_tokens, token_mask
from .gated_hc import grouped_norm
from .rope import partial_rope

T = torch.Tensor


@dataclass
class QsaWeights:
    """One QSA indexer's weights (``reference.ops.qsa``)."""

    qk: T
    q_norm: T
    k_norm: T


def block_keys(kraw: T, k_norm: T, r: int, eps: float, cos: T, sin: T) -> T:
    """kraw [L, di] -> [L // r, di]: block means (float32, stored), the zero-centred norm, rope at b r."""
    n, di = kraw.shape[0] // r, kraw.shape[-1]
    mean = kraw[:n * r].unflatten(0, (n, r)).float().mean(1).to(kraw.dtype)
    starts = torch.arange(n, device=kraw.device) * r
    return partial_rope(grouped_norm(mean, k_norm, di, eps), cos[starts], sin[starts])


def qsa_select(x_k: T, x_q: T, pos: T, w: QsaWeights, heads: int, r: int, budget: int, eps: float, cos: T,
               sin: T) -> Selection:
    """x_k [L, H], x_q [T, H], pos [T], rope tables [L, rd] -> Selection (``reference.ops.qsa``)."""
    di = w.q_norm.shape[0]
    q = grouped_norm(F.linear(x_q, w.qk[:heads * di]).unflatten(-1, (heads, di)), w.q_norm, di, eps)
    q = partial_rope(q.transpose(0, 1), cos[pos], sin[pos]).transpose(0, 1)             # [T, ni, di]
    keys = block_keys(F.linear(x_k, w.qk[heads * di:]), w.k_norm, r, eps, cos, sin)
    scores = torch.relu(torch.einsum("thd,bd->thb", q.float(), keys.float())).sum(1) / di ** 0.5
    cand = candidates(pos, keys.shape[0], r)
    blocks = choose_pools(scores, cand, budget // r)
    tail = tail_tokens(pos, r)
    return Selection(scores.masked_fill(~cand, float("-inf")), blocks, tail, token_mask(blocks, tail, x_k.shape[0], r))
