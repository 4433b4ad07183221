"""DeepSeek V4's attention, in float64 (docs/FAMILIES_MOE.md section 4.4 "Attention"; transformers 5.24's
``DeepseekV4Attention`` and its compressors are the outside oracle). One sequence, rows x [T, H] (the block's
normed input), positions p [T]; nh heads of width d, the rope on the trailing r = rope_dim channels of each head.

Shared-KV MQA (one KV head, K = V):

    q_res = rms(x Wqa^T, q_a_norm)                                  [T, ql]   (also the indexer's query input)
    q     = rope(urms(q_res Wqb^T as [T, nh, d]), p)                [T, nh, d] urms: the unweighted per-head RMS
    kv    = rope(rms(x Wkv^T, kv_norm), p)                          [T, d]     the one key = value head

rope is GPT-J's interleaved form on the trailing slice only (channels [d - r, d); the leading d - r pass): channel
pairs (2i, 2i+1) of the slice turn by the angle a_i = p f_i, f_i = theta^(-2i/r) (``inv_freq``; a YaRN "compress"
rope keeps attention factor 1):

    y_2i = x_2i cos a_i - x_2i+1 sin a_i,      y_2i+1 = x_2i+1 cos a_i + x_2i sin a_i

Sliding layers use the "main" rope (rope_theta), CSA / HCA layers the "compress" rope (compress_rope_theta, its
scaling) for q, kv, the compressed entries and the indexer. Keys are the window rows s with p_t - W < p_s <= p_t
(W = sliding_window keys, the query's own included) and, on CSA / HCA layers, the compressed entries c_w a query
may see (below). Attention with per-head sinks (``attention.sink_attention``, scale d^-1/2): the sink z_h joins
the softmax and takes mass only. Because V = K carries the rope, the output's rope slice is turned back by the
CONJUGATE rope (angle -a) at the query's own position:

    o_t   = rope^-1(sum_s P[h, t, s] kv_s, p_t)                     [T, nh, d]
    y     = o_b( [o_a_g(o_t[group g]) for g] )                      o_a block-diagonal: group g of nh d / G
                                                                    channels -> ol (its own rows g ol..(g+1) ol of
                                                                    Woa [G ol, nh d / G]); then Wob [H, G ol]

Compressors (``compress_hca`` / ``compress_csa``), rate m, on the rows of complete windows w = 0..n-1 (n = T // m):

    HCA:  k = x Wc^T, z = x Wz^T + B[j]           [T, d] (B [m, d] the position bias, j the slot in the window)
          c_w = rope(rms( sum_j softmax_j(z_{wm+j}) * k_{wm+j}, kv_norm ), w m)          per channel, m slots
    CSA:  k, z [T, 2d] (two series: a = [:d], b = [d:]); B [m, 2d]
          c_w = rope(rms( sum over 2m slots softmax(z) * k, kv_norm ), w m), slots: the a-series of window w-1
          (none for w = 0) then the b-series of window w: width 2m, stride m (overlapping)

A query at p sees entry w iff w < (p + 1) // m (every source row of it is at or before p). HCA shows it all of
those; CSA only those its lightning indexer chooses (``indexer_choice``), on its own compressor of width di
(``compress_csa`` at di with the indexer's own weights):

    qi    = rope(q_res Wiq^T as [T, nih, di], p)                    compress rope, trailing r channels of di
    I[t, w] = sum_h (x Wiw^T)_{t,h} nih^-1/2 * relu(qi_{t,h} . ci_w) di^-1/2        visible w only (else -inf)
    chosen[t] = topk_stable(I[t], min(topk, n)), an entry that is not visible -> -1          int [T, k]

Storage points (``st``, as ``kernels.ops.v4_attention`` stores them): every projection, every norm, every rope,
the pooled entry after its norm, the attention's products (``sink_attention``), the grouped output. The gate
logits + bias, their softmax, the indexer's scores and weights are float32 on the device, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import RopeScaling

from ..rounding import linear, st
from ..xp import common, ns
from .attention import sink_attention, sliding_mask, softmax
from .moe import chosen, topk_stable
from .norm import rms_norm
from .rope import inv_freq


@dataclass
class CompressorWeights:
    """One compressor: kv / gate [c d, H] (c = 2 on CSA, 1 on HCA), bias (the position bias) [m, c d], norm [d]."""

    kv: np.ndarray
    gate: np.ndarray
    bias: np.ndarray
    norm: np.ndarray


@dataclass
class IndexerWeights:
    """The lightning indexer: its compressor (c = 2, width di), q_b [nih di, ql], weights_proj [nih, H]."""

    comp: CompressorWeights
    q_b: np.ndarray
    weights_proj: np.ndarray


@dataclass
class V4AttnWeights:
    """q_a [ql, H], q_a_norm [ql], q_b [nh d, ql], kv [d, H], kv_norm [d], o_a [G ol, nh d / G], o_b [H, G ol],
    sinks [nh]; comp (CSA / HCA layers) and indexer (CSA layers) or None."""

    q_a: np.ndarray
    q_a_norm: np.ndarray
    q_b: np.ndarray
    kv: np.ndarray
    kv_norm: np.ndarray
    o_a: np.ndarray
    o_b: np.ndarray
    sinks: np.ndarray
    comp: CompressorWeights | None = None
    indexer: IndexerWeights | None = None


@dataclass(frozen=True)
class Rope:
    """One rope of V4: theta, its scaling (None: default), the rotated tail width r."""

    theta: float
    rope_dim: int
    scaling: RopeScaling | None = None


def rope_angles(positions: np.ndarray, rope: Rope) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of a[t, i] = p_t f_i, [T, r/2] (attention factor 1: V4 keeps cos/sin unscaled)."""
    xp = ns(positions)
    f = xp.asarray(inv_freq(rope.rope_dim, rope.theta, rope.scaling))
    a = xp.asarray(positions, dtype=np.float64)[:, None] * f[None, :]
    return xp.cos(a), xp.sin(a)


def tail_rope(x: np.ndarray, positions: np.ndarray, rope: Rope, conjugate: bool = False) -> np.ndarray:
    """The interleaved rope on the trailing r channels (module docstring); ``conjugate`` turns by -a.
    x [T, ..., d] (any head axes between), positions [T] -> [T, ..., d]."""
    xp, x, positions = common(x, positions)
    cos, sin = rope_angles(positions, rope)
    if conjugate:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (cos.shape[-1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    r = rope.rope_dim
    even, odd = x[..., -r::2], x[..., -r + 1::2]
    y = xp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(*x.shape[:-1], r)
    return st(xp.concatenate([x[..., :-r], y], axis=-1))


def unweighted_rms(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis (the per-head q norm, no gain)."""
    xp, x = common(x)
    return st(x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps))


def q_heads(x: np.ndarray, w: V4AttnWeights, num_heads: int, eps: float, q_head_norm: bool = True
            ) -> tuple[np.ndarray, np.ndarray]:
    """(q_res [T, ql], q [T, nh, d] normed per head, before its rope) from rows x [T, H]; ``q_head_norm`` False
    (DeepSeek V4.1, docs/V41.md section 5): q [T, nh, d] as projected, no per-head RMS."""
    q_res = rms_norm(linear(x, w.q_a), w.q_a_norm, eps)
    q = linear(q_res, w.q_b).reshape(x.shape[0], num_heads, -1)
    return q_res, unweighted_rms(q, eps) if q_head_norm else q


def kv_rows(x: np.ndarray, w: V4AttnWeights, eps: float) -> np.ndarray:
    """The key = value head before its rope: rms(x Wkv^T, kv_norm), [T, d]."""
    return rms_norm(linear(x, w.kv), w.kv_norm, eps)


def pool_windows(k: np.ndarray, z: np.ndarray, bias: np.ndarray, rate: int, overlap: bool) -> np.ndarray:
    """The softmax-gated sum of each complete window (module docstring, before its norm): k, z [n m, c d] (the
    projections of the windows' rows), bias [m, c d] -> [n, d]; ``overlap`` (c = 2) the CSA's two series."""
    xp, k, z, bias = common(k, z, bias)
    n = k.shape[0] // rate
    k = k[:n * rate].reshape(n, rate, k.shape[-1])
    z = z[:n * rate].reshape(n, rate, z.shape[-1]) + bias[None]
    if not overlap:
        return xp.sum(softmax(z, axis=1) * k, axis=1)
    d = k.shape[-1] // 2
    prev_k = xp.concatenate([xp.zeros_like(k[:1, :, :d]), k[:-1, :, :d]], axis=0)
    prev_z = xp.concatenate([xp.full_like(z[:1, :, :d], -np.inf), z[:-1, :, :d]], axis=0)
    kk = xp.concatenate([prev_k, k[:, :, d:]], axis=1)                                    # [n, 2m, d]
    zz = xp.concatenate([prev_z, z[:, :, d:]], axis=1)
    return xp.sum(softmax(zz, axis=1) * kk, axis=1)


def entries_of(k: np.ndarray, z: np.ndarray, cw: CompressorWeights, rate: int, overlap: bool, rope: Rope,
               eps: float) -> np.ndarray:
    """The compressed entries from the projections k = x Wc^T, z = x Wz^T [P, c d] of positions 0..P-1:
    [P // m, d], each normed and roped at w m."""
    xp = ns(k)
    entries = rms_norm(pool_windows(k, z, cw.bias, rate, overlap), cw.norm, eps)
    return tail_rope(entries, xp.arange(entries.shape[0]) * rate, rope)


def compress(x: np.ndarray, cw: CompressorWeights, rate: int, overlap: bool, rope: Rope, eps: float) -> np.ndarray:
    """The compressed entries of rows x [T, H] at positions 0..T-1: [T // m, d], each roped at w m."""
    _, x = common(x)
    return entries_of(linear(x, cw.kv), linear(x, cw.gate), cw, rate, overlap, rope, eps)


def visible(positions: np.ndarray, n: int, rate: int) -> np.ndarray:
    """vis[t, w] = w < (p_t + 1) // m: bool [T, n]."""
    xp = ns(positions)
    return xp.arange(n)[None, :] < ((xp.asarray(positions) + 1) // rate)[:, None]


def indexer_scores(qi: np.ndarray, keys: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """I[t, w] = sum_h hw[t, h] relu(qi[t, h] . keys[w]) / sqrt(di): qi [T, nih, di], keys [n, di], hw [T, nih]
    (already times nih^-1/2) -> [T, n]."""
    xp, qi, keys, hw = common(qi, keys, hw)
    s = xp.maximum(xp.einsum("thd,wd->thw", qi, keys), 0.0) / np.sqrt(qi.shape[-1])
    return xp.einsum("thw,th->tw", s, hw)


def indexer_logits(keys: np.ndarray, x: np.ndarray, q_res: np.ndarray, positions: np.ndarray, iw: IndexerWeights,
                   num_heads: int, rate: int, rope: Rope) -> np.ndarray:
    """The indexer's scores I [T, n] over keys [n, di] (module docstring), -inf where an entry is not visible."""
    xp, keys, x, q_res, positions = common(keys, x, q_res, positions)
    qi = linear(q_res, iw.q_b)
    qi = tail_rope(qi.reshape(qi.shape[0], num_heads, -1), positions, rope)
    hw = (x @ iw.weights_proj.T) * num_heads ** -0.5
    return xp.where(visible(positions, keys.shape[0], rate), indexer_scores(qi, keys, hw), -np.inf)


def indexer_choice(keys: np.ndarray, x: np.ndarray, q_res: np.ndarray, positions: np.ndarray, iw: IndexerWeights,
                   num_heads: int, topk: int, rate: int, rope: Rope, key: str | None = None,
                   allow: np.ndarray | None = None) -> np.ndarray:
    """chosen [T, min(topk, n)] int64 over the indexer's entries keys [n, di] (``compress`` with its own
    weights; module docstring; -1 marks a slot with no visible entry). ``allow`` bool [T, n]: only those entries
    are chosen (the scores -inf elsewhere, before the top-k). With a ``key`` the choice is a named one of
    ``moe.pinned`` (its scores, -inf where not visible or not allowed, recorded; the pinned ids used where given)."""
    xp, keys, x = common(keys, x)
    n = keys.shape[0]
    if n == 0:
        return xp.zeros((x.shape[0], 0), dtype=np.int64)
    scores = indexer_logits(keys, x, q_res, positions, iw, num_heads, rate, rope)
    if allow is not None:
        scores = xp.where(allow, scores, -np.inf)
    ids = topk_stable(scores, min(topk, n))
    ids = xp.where(xp.isfinite(xp.take_along_axis(scores, ids, axis=1)), ids, -1)
    return ids if key is None else chosen(scores, ids, key)


def chosen_mask(chosen: np.ndarray, n: int) -> np.ndarray:
    """chosen [T, k] (-1: none) -> bool [T, n], True where an entry was chosen."""
    xp = ns(chosen)
    return (chosen[:, :, None] == xp.arange(n)[None, None, :]).any(axis=1)


def grouped_output(o: np.ndarray, o_a: np.ndarray, o_b: np.ndarray, groups: int) -> np.ndarray:
    """y = o_b([o_a_g(o[group g])]_g): o [T, nh d], o_a [G ol, nh d / G], o_b [H, G ol] -> [T, H]."""
    xp, o, o_a, o_b = common(o, o_a, o_b)
    t = o.shape[0]
    og = o.reshape(t, groups, -1)
    wa = o_a.reshape(groups, -1, og.shape[-1])                                       # [G, ol, nh d / G]
    mid = st(xp.einsum("tgi,goi->tgo", og, wa)).reshape(t, -1)
    return linear(mid, o_b)


def v4_attention(x: np.ndarray, w: V4AttnWeights, kind: str, num_heads: int, window: int, rope: Rope,
                 eps: float, rate: int = 0, index_heads: int = 0, index_topk: int = 0, groups: int = 1,
                 q_head_norm: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """One V4 attention on rows x [T, H] at positions 0..T-1 -> (y [T, H], the CSA indexer's chosen [T, k] or
    None). ``kind`` "sliding" | "csa" | "hca"; ``rope`` the layer's (main on sliding, compress otherwise)."""
    xp, x = common(x)
    t = x.shape[0]
    pos = xp.arange(t)
    q_res, q = q_heads(x, w, num_heads, eps, q_head_norm)
    q = tail_rope(q, pos, rope)
    kv = tail_rope(kv_rows(x, w, eps), pos, rope)
    keys, mask, chosen = kv, sliding_mask(pos, pos, window), None
    if kind != "sliding":
        entries = compress(x, w.comp, rate, kind == "csa", rope, eps)
        n = entries.shape[0]
        see = visible(pos, n, rate)
        if kind == "csa":
            keys_i = compress(x, w.indexer.comp, rate, True, rope, eps)
            chosen = indexer_choice(keys_i, x, q_res, pos, w.indexer, index_heads, index_topk, rate, rope)
            see = see & chosen_mask(chosen, n)
        keys = xp.concatenate([kv, entries], axis=0)
        mask = xp.concatenate([mask, see], axis=1)
    o = sink_attention(q, keys[:, None, :], keys[:, None, :], mask, w.sinks)           # [T, nh, d]
    o = tail_rope(o, pos, rope, conjugate=True)
    return grouped_output(o.reshape(t, -1), w.o_a, w.o_b, groups), chosen
