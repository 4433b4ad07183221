"""GLM-5.3's DSA indexer with k-pool compression on the device (torch, CPU or CUDA); the math, the tail rule and the
storage points are in ``reference.ops.dsa`` (name for name; docs/FAMILIES_MOE.md section 4.3).

Keys x_k [L, H] (positions 0..L-1), queries x_q [T, H] at positions pos [T]. The pool softmax, the scores and the
choice are float32; the choice is ``topk_stable`` (value descending, ties to the lower pool), so the host
transcription ``reference.ops.dsa.choose_pools`` run on these float32 scores reproduces it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .moe import topk_stable

T = torch.Tensor


@dataclass
class IndexerWeights:
    """One full indexer's weights (``reference.ops.dsa``)."""

    wq_b: T
    wk: T
    k_norm_w: T
    k_norm_b: T
    weights_proj: T
    gate: T
    ape: T


@dataclass
class Selection:
    """scores [T, P] float32 (-inf: not a candidate), pools [T, topk/p] int64 (-1: none), tail [T, p-1] int64 (-1:
    none; [T, 0] without the rule), mask [T, L] bool."""

    scores: T
    pools: T
    tail: T
    mask: T


def pooled_keys(k: T, c: T, ape: T, p: int) -> T:
    """k, c [L, di], ape [p, di] -> the L // p complete pools' keys [P, di] (softmax over each pool's tokens per
    channel in float32; the weighted sum float32, stored once in k's dtype)."""
    n = k.shape[0] // p
    kk, cc = k[:n * p].unflatten(0, (n, p)), c[:n * p].unflatten(0, (n, p))
    probs = torch.softmax(cc.float() + ape.float()[None], dim=1)
    return (probs * kk.float()).sum(1).to(k.dtype)


def candidates(pos: T, n_pools: int, p: int) -> T:
    """cand[t, j] = (j p + p - 1 <= pos_t): pos [T] -> bool [T, P]."""
    return (torch.arange(n_pools, device=pos.device)[None, :] * p + p - 1) <= pos[:, None]


def choose_pools(scores: T, cand: T, k: int) -> T:
    """The k best candidates per row, -1 where fewer are candidates: [T, P] -> [T, min(k, P)] int64."""
    k = min(k, scores.shape[-1])
    ids = topk_stable(scores.masked_fill(~cand, float("-inf")), k)
    return ids.masked_fill(~cand.gather(-1, ids), -1)


def tail_tokens(pos: T, p: int) -> T:
    """tail[t, i] = floor((pos_t+1)/p) p + i for i < (pos_t+1) mod p, else -1: pos [T] -> [T, p-1] int64."""
    count = (pos + 1) % p
    i = torch.arange(p - 1, device=pos.device)
    return torch.where(i[None, :] < count[:, None], (pos + 1 - count)[:, None] + i[None, :], -1).long()


def token_mask(pools: T, tail: T, length: int, p: int) -> T:
    """mask [T, L] from the chosen pools [T, K] and the tail tokens [T, p-1] (either may hold -1)."""
    t = pools.shape[0]
    tok = (pools[:, :, None] * p + torch.arange(p, device=pools.device)).reshape(t, -1)
    tok = torch.where(pools.repeat_interleave(p, dim=1) >= 0, tok, -1)
    idx = torch.cat([tok, tail], dim=1)
    hits = torch.zeros(t, length + 1, dtype=torch.bool, device=pools.device)
    hits.scatter_(1, torch.where(idx >= 0, idx, length), True)                   # -1 lands in a spare column
    return hits[:, :length]


def indexer(x_k: T, x_q: T, q_resid: T, pos: T, w: IndexerWeights, heads: int, p: int, topk: int,
            select_tail: bool) -> Selection:
    """x_k [L, H], x_q [T, H], q_resid [T, q_lora], pos [T] -> Selection (see ``reference.ops.dsa``)."""
    k = F.layer_norm(F.linear(x_k, w.wk).float(), (w.wk.shape[0],), w.k_norm_w.float(), w.k_norm_b.float(),
                     1e-6).to(x_k.dtype)
    keys = pooled_keys(k, F.linear(x_k, w.gate), w.ape, p)
    di = keys.shape[-1]
    q = F.linear(q_resid, w.wq_b).unflatten(-1, (heads, di))
    rel = torch.relu(torch.einsum("thd,jd->thj", q.float(), keys.float()) * di ** -0.5)
    weights = F.linear(x_q, w.weights_proj).float() * heads ** -0.5
    scores = torch.einsum("th,thj->tj", weights, rel)
    cand = candidates(pos, keys.shape[0], p)
    pools = choose_pools(scores, cand, topk // p)
    tail = tail_tokens(pos, p) if select_tail else pools.new_zeros(len(pos), 0)
    return Selection(scores.masked_fill(~cand, float("-inf")), pools, tail, token_mask(pools, tail, x_k.shape[0], p))
