"""DeepSeek V4.1's compressed streams shared from source layers on the device (torch, CPU or CUDA); the math,
shapes and storage points are in ``reference.ops.v41_stream`` (name for name; docs/V41.md section 6).

Rows [R, ...] at positions p0..; a kv source keeps its compressor's projections k, z [cap, d] by position
(``StreamCache``) and pools the complete windows of the committed prefix and this pass each pass, so its entries
and keys [n, d] / [n, di] (n = end // m) never read a position past the pass; readers attend the entry slots
[cap // m, d] (unwritten slots masked) as ``kernels.ops.v4_attention`` does. The candidate mask (``block_scores``,
``candidate_blocks``, ``candidate_mask``; docs/V41.md 8) is per row of the pass: the source layer's, from its own
scores, for the later layers of the same pass; nothing of it is kept across passes (a row's mask reads only its
scores and its count of entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import sink_attention, sliding_mask
from .moe import topk_stable
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

T = torch.Tensor
__all__ = ["IndexerWeights", "StreamWeights", "IndexKeyWeights", "StreamCache", "pooled", "stream_entries",
           "index_keys", "stream_scores", "entries_seen", "block_scores", "candidate_blocks", "candidate_mask",
           "stream_choice", "stream_attention"]


@dataclass
class StreamWeights:
    """A kv source's compressor: kv [d, H], gate [d, H] or None (ratio 1), norm [d]."""

    kv: T
    gate: T | None
    norm: T


@dataclass
class IndexKeyWeights:
    """A key owner's index-key projection of the pooled latent: k [di, d], k_norm [di]."""

    k: T
    k_norm: T


@dataclass
class StreamCache:
    """A kv source's projections by position, run dtype: k [cap, d], z [cap, d] (None without a gate)."""

    k: T
    z: T | None

    @classmethod
    def empty(cls, cap: int, d: int, gated: bool, device: torch.device | str, dtype: torch.dtype) -> StreamCache:
        return cls(torch.zeros(cap, d, device=device, dtype=dtype),
                   torch.zeros(cap, d, device=device, dtype=dtype) if gated else None)


def pooled(a: T, w: StreamWeights, rate: int, eps: float, p0: int = 0, cache: StreamCache | None = None) -> T:
    """pre [end // m, d] in a's dtype: the normed pooled complete windows of positions 0..end-1, this pass's rows
    a [R, H] written into ``cache`` at p0.. first (without one: the pass's own rows from position 0)."""
    end = p0 + a.shape[0]
    if cache is None:
        cache = StreamCache.empty(end, w.kv.shape[0], w.gate is not None, a.device, a.dtype)
    cache.k[p0:end] = F.linear(a, w.kv)
    if cache.z is not None:
        cache.z[p0:end] = F.linear(a, w.gate)
    full = (end // rate) * rate
    k = cache.k[:full]
    z = cache.z[:full] if cache.z is not None else k
    bias = torch.zeros(rate, k.shape[1], device=a.device, dtype=torch.float32)
    return rms_norm(pool_windows(k, z, bias, rate, False), w.norm, eps).to(a.dtype)


def stream_entries(pre: T, rate: int, rope: Rope) -> T:
    """pre [n, d] roped at w m, in pre's dtype."""
    return tail_rope(pre, torch.arange(pre.shape[0], device=pre.device) * rate, rope)


def index_keys(pre: T, w: IndexKeyWeights, rate: int, rope: Rope, eps: float) -> T:
    """rope(rms(pre Wk^T, k_norm), w m) [n, di] in pre's dtype."""
    keys = rms_norm(F.linear(pre, w.k), w.k_norm, eps)
    return tail_rope(keys, torch.arange(pre.shape[0], device=pre.device) * rate, rope)


def stream_scores(keys: T, a: T, w: V4AttnWeights, iw: IndexerWeights, num_heads: int, index_heads: int, rate: int,
                  rope: Rope, eps: float, p0: int = 0) -> T:
    """A topk source's index scores [R, n] float32 (-inf: not visible) for rows a at positions p0.."""
    q_res, _ = q_heads(a, w, num_heads, eps, False)
    pos = torch.arange(p0, p0 + a.shape[0], device=a.device)
    return indexer_logits(keys, a, q_res, pos, iw, index_heads, rate, rope)


def entries_seen(p0: int, rows: int, n: int, rate: int, device: torch.device | str) -> T:
    """compress_len [R] int64: the entries row p0 + t sees, min((p + 1) // m, n)."""
    return ((torch.arange(p0, p0 + rows, device=device) + 1) // rate).clamp(max=n)


def block_scores(scores: T, lens: T, block_size: int) -> T:
    """b [R, nb] float32, nb = ceil(n / B): the block maxima of the source's scores [R, n] (-inf: not visible; the
    last block padded with -inf), +inf at the newest visible entry's block (lens [R]: the entries each row sees)."""
    r, n = scores.shape
    nb = -(-n // block_size)
    pad = scores.new_full((r, nb * block_size - n), float("-inf"))
    b = torch.cat([scores, pad], dim=1).float().view(r, nb, block_size).amax(-1)
    newest = torch.div(lens - 1, block_size, rounding_mode="floor")                                  # -1: none
    return b.masked_fill(torch.arange(nb, device=b.device)[None, :] == newest[:, None], float("inf"))


def candidate_blocks(b: T, topk_blocks: int) -> T:
    """The kept blocks [R, K] int64 of the block scores b [R, nb]: the top min(K, nb) (equal scores: the lower
    block), -1 for one at -inf and for the columns past nb."""
    r, nb = b.shape
    top = topk_stable(b, min(topk_blocks, nb))
    top = torch.where(b.gather(1, top) > float("-inf"), top, torch.full_like(top, -1))
    return torch.cat([top, top.new_full((r, topk_blocks - top.shape[1]), -1)], dim=1)


def candidate_mask(blocks: T, n: int, block_size: int) -> T:
    """allow [R, n] bool: entry i where its block i // B is among ``blocks`` [R, K] (-1: none)."""
    return chosen_mask(blocks, -(-n // block_size)).repeat_interleave(block_size, dim=1)[:, :n]


def stream_choice(keys: T, a: T, w: V4AttnWeights, iw: IndexerWeights, num_heads: int, index_heads: int, topk: int,
                  rate: int, rope: Rope, eps: float, p0: int = 0, allow: T | None = None) -> T:
    """A topk source's choice [R, min(topk, n)] int64 (-1: no visible entry) for rows a at positions p0..; ``allow``
    [R, n] bool: the candidate mask its choice is taken inside (None: every entry)."""
    q_res, _ = q_heads(a, w, num_heads, eps, False)
    pos = torch.arange(p0, p0 + a.shape[0], device=a.device)
    return indexer_choice(keys, a, q_res, pos, iw, index_heads, topk, rate, rope, allow)


def stream_attention(x: T, w: V4AttnWeights, num_heads: int, window: int, rope: Rope, eps: float, groups: int,
                     entries: T | None = None, rate: int = 0, chosen: T | None = None, p0: int = 0,
                     kv_cache: T | None = None) -> T:
    """Rows x [R, H] at positions p0.. -> y [R, H]: the window keys of ``kv_cache`` [cap, d] (this pass's rows
    written at p0..; without one, the pass's own from 0) and, on a compressed layer, the ``entries`` [n, d] each
    query sees among ``chosen`` [R, k], padded to cap // m slots."""
    r, end = x.shape[0], p0 + x.shape[0]
    if kv_cache is None:
        kv_cache = x.new_zeros(r, w.kv.shape[0])
    cap = kv_cache.shape[0]
    pos = torch.arange(p0, end, device=x.device)
    _, q = q_heads(x, w, num_heads, eps, False)
    q = tail_rope(q, pos, rope)
    kv_cache[p0:end] = tail_rope(kv_rows(x, w, eps), pos, rope)
    keys, mask = kv_cache, sliding_mask(pos, torch.arange(cap, device=x.device), window)
    if entries is not None:
        slots = cap // rate
        entries = torch.cat([entries, entries.new_zeros(slots - entries.shape[0], entries.shape[1])])
        see = visible(pos, slots, rate)
        if chosen is not None:
            see = see & chosen_mask(chosen, slots)
        keys, mask = torch.cat([keys, entries]), torch.cat([mask, see], dim=1)
    kk = keys[None, None]
    o = sink_attention(q.transpose(0, 1)[None], kk, kk, mask, w.sinks)[0]
    o = tail_rope(o.view(r, num_heads, -1), pos, rope, conjugate=True)
    return grouped_output(o.reshape(r, -1), w.o_a, w.o_b, groups)
