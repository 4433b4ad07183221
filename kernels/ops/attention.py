"""Grouped-query attention over an explicit key set.

    q [N, nh, R, d], k/v [N, nkv, S, d], allowed [R, S] (True = may attend) or None (all)
    scores = q k^T / sqrt(d)     (query head i reads kv head i // (nh / nkv))
    out    = softmax(scores masked) v  ->  [N, R, nh * d]

Scores and the softmax are float32; the two products run in the storage dtype (f32 accumulation on
CUDA). The key axis is whatever the caller passes: the engine passes its whole static KV buffer with
a mask, so a row's reduction never depends on how many rows share the pass or how long the valid
prefix is (the batch-invariance the lossless check needs).
"""

from __future__ import annotations

import math

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    n, nh, r, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qg = q.reshape(n, nkv, g * r, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))   # [N, nkv, g*R, S]
    scores = scores.view(n, nkv, g, r, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(n, nkv, g * r, -1)
    out = torch.matmul(probs, v).view(n, nkv, g, r, d)                                  # [N, nkv, g, R, d]
    return out.permute(0, 3, 1, 2, 4).reshape(n, r, nh * d)


def anchored_mask(pos_q: torch.Tensor, pos_kv: torch.Tensor, s: int, window: int, causal: bool) -> torch.Tensor:
    """speculators' window: context keys s - window <= j < s for every block row, block keys j >= s all
    (``causal`` False) or only j <= pos_q[r]; pos_q [R], pos_kv [S] -> bool [R, S] (AND it with the base mask)."""
    q, k = pos_q[:, None], pos_kv[None, :]
    block = (k <= q) if causal else torch.ones_like(k, dtype=torch.bool)
    return ((k >= s - window) & ((k < s) | block)).expand(len(pos_q), len(pos_kv))


def sliding_mask(pos_q: torch.Tensor, pos_kv: torch.Tensor, window: int) -> torch.Tensor:
    """allowed[r, s] = pos_q[r] - window < pos_kv[s] <= pos_q[r]: a causal window of ``window`` keys over
    absolute positions (``formats.sliding``); pos_q [R], pos_kv [S] -> bool [R, S], built in one shot."""
    q, k = pos_q[:, None], pos_kv[None, :]
    return (k <= q) & (k > q - window)


def window_mask(pos_q: torch.Tensor, pos_k: torch.Tensor, window: int | None) -> torch.Tensor:
    """allowed[t, j] = pos_k[j] <= pos_q[t] and (no window or pos_q[t] - pos_k[j] < window): causal, and a sliding
    window of ``window`` keys counting the query's own position (HF's ``sliding_window``); [R, S] bool."""
    if window is not None:
        return sliding_mask(pos_q, pos_k, window)
    return pos_k[None, :] <= pos_q[:, None]


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                 sinks: torch.Tensor | None) -> torch.Tensor:
    """``attend`` with per-head attention sinks and a value width dv of its own (MiMo-V2):

        q [N, nh, R, d], k [N, nkv, S, d], v [N, nkv, S, dv], allowed [R, S] or None, sinks [nh] or None
        p = softmax over [q k^T / sqrt(d) masked ; sink_h], sink column dropped  ->  out [N, R, nh * dv]

    Scores, the sink logit and the softmax are float32; the products run in the storage dtype."""
    n, nh, r, d = q.shape
    nkv, dv = k.shape[1], v.shape[-1]
    g = nh // nkv
    scores = torch.matmul(q.reshape(n, nkv, g * r, d), k.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
    scores = scores.view(n, nkv, g, r, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        z = sinks.float().view(1, nkv, g, 1, 1).expand(n, nkv, g, r, 1)
        probs = torch.softmax(torch.cat([scores, z], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(v.dtype).reshape(n, nkv, g * r, -1), v).view(n, nkv, g, r, dv)
    return out.permute(0, 3, 1, 2, 4).reshape(n, r, nh * dv)
