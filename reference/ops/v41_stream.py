"""DeepSeek V4.1's compressed streams shared from source layers, in float64 (docs/V41.md section 6; ik's
``ds4_attention`` under ``dsv4_shared_streams``, ``ds4_build_comp`` type 1, ``dsv4_build_lid_top_k``; the seed's
``walk_streams``). V4's pieces (``reference.ops.v4_attention``) are reused: the pooling, the rope, the indexer's
scores and top-k, the sink attention and the grouped output.

A compressed layer l (ratio m > 0) reads three sources, each the last layer at or before l that carries it:
kv_source (the compressor), key_source (the index-key projection, on a compressor's layer), topk_source (the
indexer query). Only a kv source pools, from ITS attention input a_src [T, H] (the normed fold):

    k = a_src Wc^T, z = a_src Wz^T (z = k without a gate: ratio 1, a softmax over one slot is 1)       [T, d]
    pre_w   = rms( sum_j softmax_j(z_{wm+j}) k_{wm+j}, norm )        no position bias, no overlap       [n, d]
    entry_w = rope(pre_w, w m)                                        the layer's (compress) rope       [n, d]
    key_w   = rope(rms(pre_w Wk^T, k_norm), w m)                      on a key owner (``index_keys``)   [n, di]

ik follows the key and the indexer query with the same Hadamard rotation; only the scores' top-k reads them, and
a shared orthogonal (or uniformly scaled) rotation leaves q.k's order unchanged, so it is not applied here.
A topk source chooses with its own query, on the key owner's keys (``reference.ops.v4_attention.indexer_choice``:
relu(q_h . key_w) summed with the weights (a Wi^T)_h (nih di)^-1/2 over the entries each query sees, w < (p+1) // m;
top min(topk, n)). Layer l then attends (``stream_attention``) the window keys and the entries of its kv source that
its query sees AND its topk source chose, V4's way (K = V, sinks, the conjugate rope on the output, grouped output).

The candidate mask (docs/V41.md 8; ``spec.candidates``): the candidate source layer c, an index source, keeps per
query row t the best blocks of its own index scores I_c [T, n] (-inf where not visible), and every later index
source l > c at the same ratio chooses only inside them (``block_scores``, ``candidate_blocks`` (a named choice, as
the stream top-k: the gates pin the kernel's blocks), ``candidate_mask``, ``stream_choice``'s ``allow``):

    len_t  = min((t + 1) // m, n)                          the entries row t sees (0: nothing kept)        [T]
    b_tj   = max_{i in [j B, (j+1) B)} I_c[t, i]           block scores, the last block padded with -inf  [T, nb]
    b_tj   = +inf for j = (len_t - 1) // B                 the newest visible entry's block, always kept
    keep_t = the top min(K_b, nb) blocks of b_t (equal scores: the lower block), -1 for any at -inf       [T, K_b]
    allow  = [i // B in keep_t]                                                                            [T, n]
    I_l    = where(allow, I_l, -inf)  before l's top-k (its choice still the named ``moe.chosen`` one)

(B ``block_size``, K_b ``topk_blocks``; the source's own top-k is unmasked). The form is the public transformers-style
V4.1 model's ``select_candidate_blocks`` and the seed's Rust transcription ``candidate_mask`` (read, not copied;
upstream's ``topk`` leaves a tie at the cut unspecified, the seed refuses one; here the lower block wins).

Storage points (``st``): the pooled entry after its norm (pre), the roped entry, the key projection, its norm and
rope; the attention's as ``reference.ops.v4_attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear
from ..xp import common, ns
from .attention import sink_attention, sliding_mask
from .moe import chosen, topk_stable
from .norm import rms_norm
from .v4_attention import (
    IndexerWeights,
    Rope,
    V4AttnWeights,
    chosen_mask,
    grouped_output,
    indexer_choice,
    indexer_logits,
    kv_rows,
    pool_windows,
    q_heads,
    tail_rope,
    visible,
)

__all__ = ["IndexerWeights", "StreamWeights", "IndexKeyWeights", "pooled", "stream_entries", "index_keys",
           "stream_scores", "entries_seen", "block_scores", "candidate_blocks", "candidate_mask", "stream_choice",
           "stream_attention"]


@dataclass
class StreamWeights:
    """A kv source's compressor: kv [d, H], gate [d, H] or None (ratio 1), norm [d]."""

    kv: np.ndarray
    gate: np.ndarray | None
    norm: np.ndarray


@dataclass
class IndexKeyWeights:
    """A key owner's index-key projection of the pooled latent: k [di, d], k_norm [di]."""

    k: np.ndarray
    k_norm: np.ndarray


def pooled(a: np.ndarray, w: StreamWeights, rate: int, eps: float) -> np.ndarray:
    """pre [T // m, d]: the normed pooled rows of complete windows of a kv source's input a [T, H]."""
    xp, a = common(a)
    k = linear(a, w.kv)
    z = linear(a, w.gate) if w.gate is not None else k
    bias = xp.zeros((rate, k.shape[1]), dtype=k.dtype)
    return rms_norm(pool_windows(k, z, bias, rate, False), w.norm, eps)


def stream_entries(pre: np.ndarray, rate: int, rope: Rope) -> np.ndarray:
    """The entries the readers attend: pre [n, d] roped at w m."""
    return tail_rope(pre, ns(pre).arange(pre.shape[0]) * rate, rope)


def index_keys(pre: np.ndarray, w: IndexKeyWeights, rate: int, rope: Rope, eps: float) -> np.ndarray:
    """A key owner's index keys from its pre [n, d]: rope(rms(pre Wk^T, k_norm), w m) [n, di]."""
    keys = rms_norm(linear(pre, w.k), w.k_norm, eps)
    return tail_rope(keys, ns(pre).arange(pre.shape[0]) * rate, rope)


def stream_scores(keys: np.ndarray, a: np.ndarray, w: V4AttnWeights, iw: IndexerWeights, num_heads: int,
                  index_heads: int, rate: int, rope: Rope, eps: float) -> np.ndarray:
    """A topk source's index scores I [T, n] (-inf: not visible) on the keys [n, di] from its own rows a."""
    xp, a = common(a)
    q_res, _ = q_heads(a, w, num_heads, eps, False)
    return indexer_logits(keys, a, q_res, xp.arange(a.shape[0]), iw, index_heads, rate, rope)


def entries_seen(t: int, n: int, rate: int) -> np.ndarray:
    """len [T] int64: the entries row t sees, min((t + 1) // m, n)."""
    return np.minimum((np.arange(t) + 1) // rate, n)


def block_scores(scores: np.ndarray, lens: np.ndarray, block_size: int) -> np.ndarray:
    """b [T, nb], nb = ceil(n / B): the block maxima of the source's scores [T, n] (-inf: not visible; the last
    block padded with -inf), +inf at the newest visible entry's block (lens [T]; module docstring)."""
    xp, scores = common(scores)
    lens = xp.asarray(lens)
    t, n = scores.shape
    nb = -(-n // block_size)
    padded = xp.concatenate([scores, xp.full((t, nb * block_size - n), -np.inf)], axis=1)
    b = padded.reshape(t, nb, block_size).max(axis=2)
    return xp.where(xp.arange(nb)[None, :] == ((lens - 1) // block_size)[:, None], np.inf, b)


def candidate_blocks(b: np.ndarray, topk_blocks: int, key: str | None = None) -> np.ndarray:
    """The kept blocks [T, K] int64 of the block scores b [T, nb]: the top min(K, nb) (equal scores: the lower
    block), -1 for one at -inf and for the columns past nb. With a ``key`` a named choice of ``moe.pinned`` (b
    recorded; the pinned blocks used where given), as the stream choices are."""
    xp, b = common(b)
    t, nb = b.shape
    top = topk_stable(b, min(topk_blocks, nb))
    top = xp.where(xp.take_along_axis(b, top, axis=1) > -np.inf, top, -1)
    top = xp.concatenate([top, xp.full((t, topk_blocks - top.shape[1]), -1, dtype=np.int64)], axis=1)
    return top if key is None else chosen(b, top, key)


def candidate_mask(blocks: np.ndarray, n: int, block_size: int) -> np.ndarray:
    """allow [T, n] bool: entry i where its block i // B is among ``blocks`` [T, K] (-1: none)."""
    xp = ns(blocks)
    return xp.repeat(chosen_mask(blocks, -(-n // block_size)), block_size, axis=1)[:, :n]


def stream_choice(keys: np.ndarray, a: np.ndarray, w: V4AttnWeights, iw: IndexerWeights, num_heads: int,
                  index_heads: int, topk: int, rate: int, rope: Rope, eps: float, key: str | None = None,
                  allow: np.ndarray | None = None) -> np.ndarray:
    """A topk source's choice [T, min(topk, n)] (-1: no visible entry) on the keys [n, di] from its own rows a
    (``key``: its name for ``moe.pinned``; ``allow`` [T, n]: the candidate mask it chooses inside, None: all)."""
    xp, a = common(a)
    q_res, _ = q_heads(a, w, num_heads, eps, False)
    return indexer_choice(keys, a, q_res, xp.arange(a.shape[0]), iw, index_heads, topk, rate, rope, key, allow)


def stream_attention(x: np.ndarray, w: V4AttnWeights, num_heads: int, window: int, rope: Rope, eps: float,
                     groups: int, entries: np.ndarray | None = None, rate: int = 0,
                     chosen: np.ndarray | None = None) -> np.ndarray:
    """V4.1 attention of rows x [T, H] at positions 0..T-1 (no per-head q norm) over the window keys and, on a
    compressed layer, the ``entries`` [n, d] its query sees (w < (p+1) // m) among ``chosen`` [T, k] -> y [T, H]."""
    xp, x = common(x)
    t = x.shape[0]
    pos = xp.arange(t)
    _, q = q_heads(x, w, num_heads, eps, False)
    q = tail_rope(q, pos, rope)
    kv = tail_rope(kv_rows(x, w, eps), pos, rope)
    keys, mask = kv, sliding_mask(pos, pos, window)
    if entries is not None:
        n = entries.shape[0]
        see = visible(pos, n, rate)
        if chosen is not None:
            see = see & chosen_mask(chosen, n)
        keys, mask = xp.concatenate([kv, entries], axis=0), xp.concatenate([mask, see], axis=1)
    o = sink_attention(q, keys[:, None, :], keys[:, None, :], mask, w.sinks)
    o = tail_rope(o, pos, rope, conjugate=True)
    return grouped_output(o.reshape(t, -1), w.o_a, w.o_b, groups)
