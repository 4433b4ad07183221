"""qwen4exp's QSA block mask, in float64 (docs/FAMILIES_MOE.md section 4.5 "QSA": ``indexer_{n_heads, kv_heads
(= 1), head_dim, budget, compress_ratio}``; GGUF ``indexer.{q_proj, k_proj, q_norm, k_norm}``,
``attention.compress_ratios``; section 8.1: the QSA mask on the gated GQA of the full layers, trunk only).

Keys are the context rows 0..L-1 (x_k [L, H]); queries are rows at positions pos [T] (x_q [T, H]). ni heads of
width di, blocks of r = compress_ratio tokens, budget tokens (so budget / r blocks). Weights qk [(ni + 1) di, H] (the
query heads, then the one key head), q_norm, k_norm [di] (zero-centred: 1 + w):

    [q_t | kraw_s] = x qk^T;   q_t = rope_{pos_t}( norm_q(q_t) )                                   [T, ni, di]
    block b = tokens br .. br+r-1 (complete blocks only):
        key_b = rope_{br}( norm_k( mean_i kraw_{br+i} ) )                  roped at the block's first position
    score_{t,b} = sum_h relu(q_{t,h} . key_b) / sqrt(di)                              float32 on the device
    block b is a candidate for query t iff its last token is visible: br + r - 1 <= pos_t
    chosen_t = the min(budget / r, #candidates) best candidates (``topk_stable``, ties to the lower block)
    mask[t] = the chosen blocks' tokens and the incomplete tail floor((pos_t+1)/r) r .. pos_t, always

The selection machinery (candidates, choice, tail, mask) is DSA's (``reference.ops.dsa``); only the scoring
differs: mean-pooled, normed, roped keys and an unweighted relu sum over the heads (DSA: learned pool softmax,
a LayerNorm, NoPE, a weighted head sum). rope is the model's partial rotate-half rope (``rope.partial_rope``).
The mask is ANDed into the layer's causal mask (it is a subset of it).

Storage points (``st``): the qk projection, both norms, the mean, both ropes. Scores and choice: float32, no ``st``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .dsa import Selection, candidates, choose_pools, tail_tokens, token_mask
from .gated_hc import grouped_norm
from .rope import partial_rope


@dataclass
class QsaWeights:
    """One QSA indexer's weights (module docstring)."""

    qk: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray


def block_keys(kraw: np.ndarray, k_norm: np.ndarray, r: int, eps: float, rotary_dim: int,
               theta: float) -> np.ndarray:
    """kraw [L, di] -> the complete blocks' keys [L // r, di] (module docstring)."""
    xp, kraw, k_norm = common(kraw, k_norm)
    n, di = kraw.shape[0] // r, kraw.shape[-1]
    mean = st(kraw[:n * r].reshape(n, r, di).mean(axis=1))
    normed = grouped_norm(mean, k_norm, di, eps)
    return partial_rope(normed[:, None, :], xp.arange(n) * r, rotary_dim, theta)[:, 0]


def qsa_select(x_k: np.ndarray, x_q: np.ndarray, pos: np.ndarray, w: QsaWeights, heads: int, r: int, budget: int,
               eps: float, rotary_dim: int, theta: float) -> Selection:
    """x_k [L, H], x_q [T, H], pos [T] -> Selection (scores [T, NB] with -inf off the candidates, blocks, tail,
    mask [T, L])."""
    xp, x_k, x_q, pos = common(x_k, x_q, pos)
    di = w.q_norm.shape[0]
    q = linear(x_q, w.qk[:heads * di]).reshape(len(pos), heads, di)
    q = partial_rope(grouped_norm(q, w.q_norm, di, eps), pos, rotary_dim, theta)
    keys = block_keys(linear(x_k, w.qk[heads * di:]), w.k_norm, r, eps, rotary_dim, theta)
    scores = xp.maximum(xp.einsum("thd,bd->thb", q, keys), 0.0).sum(axis=1) / np.sqrt(di)
    cand = candidates(pos, keys.shape[0], r)
    blocks = choose_pools(scores, cand, budget // r)
    tail = tail_tokens(pos, r)
    return Selection(xp.where(cand, scores, -np.inf), blocks, tail, token_mask(blocks, tail, x_k.shape[0], r))
