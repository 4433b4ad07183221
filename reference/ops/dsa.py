"""GLM-5.3's DSA indexer with k-pool compression, in float64 (docs/FAMILIES_MOE.md section 4.3: ``index_{topk,
head_dim, n_heads, kpool, kpool_always_select_tail}``, ``indexer_types`` full / shared; GGUF ``indexer.{k_norm,
proj, attn_k, attn_q_b}``, ``indexer_compressor_gate`` / ``_ape``; section 8.1 "MLA NoPE + DSA k-pool indexer").

Keys are the context rows 0..L-1 (x_k [L, H]); queries are rows at absolute positions pos [T] (x_q [T, H], with
q_resid [T, q_lora] = q_a_layernorm(q_a_proj x_q), the MLA's own). ni indexer heads of width di, pool size p
(kpool), topk tokens (so topk / p pools). Weights: wq_b [ni di, q_lora], wk [di, H], k_norm (w, b) [di] (a
LayerNorm with a bias), weights_proj [ni, H], gate [di, H], ape [p, di]:

    k_s = LayerNorm(wk x_s),  c_s = gate x_s                                                      [L, di]
    pool j = tokens jp .. jp+p-1, built only when complete (jp+p <= L):
        key_j = sum_i softmax_i(c_{jp+i} + ape_i) o k_{jp+i}      a softmax over the pool's p tokens per channel
    q_{t,h} = (wq_b q_resid_t)_h                                                                 [T, ni, di]
    score_{t,j} = ni^-1/2 sum_h (weights_proj x_t)_h relu(q_{t,h} . key_j / sqrt(di))            float32 on device
    pool j is a candidate for query t iff its last token is visible: jp + p - 1 <= pos_t
    chosen_t = the min(topk / p, #pools) best candidates (``topk_stable``: value descending, ties to the lower
               pool; a slot with no candidate left is -1)
    the tail rule (kpool_always_select_tail): the incomplete pool that holds pos_t joins as raw tokens,
        tail_t = { floor((pos_t + 1) / p) p + i : i < (pos_t + 1) mod p }            at most p - 1 tokens
    mask[t, s] = s in a chosen pool of t, or s in tail_t                                         [T, L] bool

Without the tail rule a query never sees its own incomplete pool, itself included: the first p - 1 queries of a
sequence would see nothing. A ``shared`` indexer layer runs no indexer: it takes the mask of the full layer before
it (``indexer_types``; the NextN layer's indexer is always full).

Storage points (``st``, as ``kernels.ops.dsa`` stores them): wk x, the LayerNorm, gate x, the pooled keys, wq_b
q_resid, weights_proj x. The pool softmax, the scores and the choice are float32 on the device (no ``st``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .attention import softmax
from .moe import topk_stable
from .norm import layer_norm

NEG = -np.inf


@dataclass
class IndexerWeights:
    """One full indexer's weights (module docstring)."""

    wq_b: np.ndarray
    wk: np.ndarray
    k_norm_w: np.ndarray
    k_norm_b: np.ndarray
    weights_proj: np.ndarray
    gate: np.ndarray
    ape: np.ndarray


@dataclass
class Selection:
    """scores [T, P] (-inf where not a candidate), pools [T, topk/p] int64 (-1: none), tail [T, p-1] int64 (-1:
    none), mask [T, L] bool."""

    scores: np.ndarray
    pools: np.ndarray
    tail: np.ndarray
    mask: np.ndarray


def pooled_keys(k: np.ndarray, c: np.ndarray, ape: np.ndarray, p: int) -> np.ndarray:
    """k, c [L, di], ape [p, di] -> the keys of the L // p complete pools [P, di]."""
    _, k, c, ape = common(k, c, ape)
    n = k.shape[0] // p
    kk, cc = k[:n * p].reshape(n, p, -1), c[:n * p].reshape(n, p, -1)
    return st((softmax(cc + ape[None], axis=1) * kk).sum(axis=1))


def candidates(pos: np.ndarray, n_pools: int, p: int) -> np.ndarray:
    """cand[t, j] = (j p + p - 1 <= pos_t): pos [T] -> bool [T, P]."""
    xp, pos = common(pos)
    return (xp.arange(n_pools)[None, :] * p + p - 1) <= pos[:, None]


def choose_pools(scores: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
    """The k best candidates per row (value descending, ties to the lower pool), -1 where fewer than k are
    candidates: scores [T, P] (any float dtype: the tier-1 transcription runs it on the device's float32 scores),
    cand bool [T, P] -> [T, min(k, P)] int64. Comparisons only, exact in the scores' dtype."""
    xp, scores, cand = common(scores, cand)
    k = min(k, scores.shape[-1])
    if k == 0:
        return xp.zeros((scores.shape[0], 0), dtype=np.int64)
    masked = xp.where(cand, scores, xp.asarray(NEG, dtype=scores.dtype))
    ids = topk_stable(masked, k)
    ok = xp.take_along_axis(cand, ids, axis=-1)
    return xp.where(ok, ids, -1)


def tail_tokens(pos: np.ndarray, p: int) -> np.ndarray:
    """The tail rule: tail[t, i] = floor((pos_t+1)/p) p + i for i < (pos_t+1) mod p, else -1: pos [T] -> [T, p-1]."""
    xp, pos = common(pos)
    count = (pos + 1) % p
    start = pos + 1 - count
    i = xp.arange(p - 1)
    return xp.where(i[None, :] < count[:, None], start[:, None] + i[None, :], -1).astype(np.int64)


def token_mask(pools: np.ndarray, tail: np.ndarray | None, length: int, p: int) -> np.ndarray:
    """mask [T, L]: the tokens of the chosen pools, and the tail's (``tail`` None: the rule dropped)."""
    xp, pools, tail = common(pools, tail)
    t = pools.shape[0]
    mask = xp.zeros((t, length), dtype=bool)
    rows = xp.arange(t)[:, None]
    tok = (pools[:, :, None] * p + xp.arange(p)[None, None, :]).reshape(t, -1)
    valid = xp.repeat(pools >= 0, p, axis=1)
    mask[xp.broadcast_to(rows, tok.shape)[valid], tok[valid]] = True
    if tail is not None:
        ok = tail >= 0
        mask[xp.broadcast_to(rows, tail.shape)[ok], tail[ok]] = True
    return mask


def indexer(x_k: np.ndarray, x_q: np.ndarray, q_resid: np.ndarray, pos: np.ndarray, w: IndexerWeights, heads: int,
            p: int, topk: int, select_tail: bool) -> Selection:
    """The full indexer (module docstring): x_k [L, H], x_q [T, H], q_resid [T, q_lora], pos [T] -> Selection."""
    xp, x_k, x_q, q_resid, pos = common(x_k, x_q, q_resid, pos)
    length = x_k.shape[0]
    k = layer_norm(linear(x_k, w.wk), w.k_norm_w, w.k_norm_b)
    keys = pooled_keys(k, linear(x_k, w.gate), w.ape, p)
    di = keys.shape[-1]
    q = linear(q_resid, w.wq_b).reshape(x_q.shape[0], heads, di)
    rel = xp.maximum(xp.einsum("thd,jd->thj", q, keys) * di ** -0.5, 0.0)
    weights = linear(x_q, w.weights_proj) * heads ** -0.5
    scores = xp.einsum("th,thj->tj", weights, rel)
    cand = candidates(pos, keys.shape[0], p)
    pools = choose_pools(scores, cand, topk // p)
    tail = tail_tokens(pos, p) if select_tail else None
    scores = xp.where(cand, scores, NEG)
    return Selection(scores, pools, tail if tail is not None else xp.zeros((len(pos), 0), dtype=np.int64),
                     token_mask(pools, tail, length, p))
