"""DeepSeek V4's attention on the device (torch, CPU or CUDA); the math, shapes and storage points are in
``reference.ops.v4_attention`` (name for name; docs/FAMILIES_MOE.md section 4.4 "Attention").

Rows x [R, H] in the run dtype at positions p0..p0+R-1. Projections, norms, ropes, the pooled entries after their
norm and the grouped output are stored in the run dtype; the rope angles (from float64), the gate logits + bias and
their softmax, the pooled sums, the indexer's scores and head weights and the attention's softmax are float32.

State (``V4Cache``, one per layer): the roped key = value head of every position [cap, d] and, on CSA / HCA
layers, the compressor's (and the indexer's) projections of every position, from which each pass pools the
entries of the complete windows before its end (an entry reads only rows at or before the queries that may see
it, so rows past the commit point are never read by a committed query and are overwritten by the next pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import RopeScaling

from .attention import sink_attention, sliding_mask
from .moe import topk_stable
from .norm import rms_norm
from .rope import inv_freq

T = torch.Tensor


@dataclass
class CompressorWeights:
    """kv / gate [c d, H], bias [m, c d] (float32), norm [d]."""

    kv: T
    gate: T
    bias: T
    norm: T


@dataclass
class IndexerWeights:
    """comp (c = 2, width di), q_b [nih di, ql], weights_proj [nih, H]."""

    comp: CompressorWeights
    q_b: T
    weights_proj: T


@dataclass
class V4AttnWeights:
    """As ``reference.ops.v4_attention.V4AttnWeights`` (sinks float32)."""

    q_a: T
    q_a_norm: T
    q_b: T
    kv: T
    kv_norm: T
    o_a: T
    o_b: T
    sinks: T
    comp: CompressorWeights | None = None
    indexer: IndexerWeights | None = None


@dataclass(frozen=True)
class Rope:
    theta: float
    rope_dim: int
    scaling: RopeScaling | None = None


@dataclass
class V4Cache:
    """One layer's state, rows by position, run dtype: kv [cap, d] (roped K = V); on CSA / HCA layers the
    compressor's projections k, z [cap, c d]; on CSA layers the indexer's ik, iz [cap, 2 di]."""

    kv: T
    k: T | None = None
    z: T | None = None
    ik: T | None = None
    iz: T | None = None

    @classmethod
    def empty(cls, cap: int, kind: str, head_dim: int, index_head_dim: int, device: torch.device | str,
              dtype: torch.dtype) -> V4Cache:
        def z(width: int) -> T:
            return torch.zeros(cap, width, device=device, dtype=dtype)
        c = {"sliding": 0, "hca": 1, "csa": 2}[kind]
        comp = (z(c * head_dim), z(c * head_dim)) if c else (None, None)
        idx = (z(2 * index_head_dim), z(2 * index_head_dim)) if kind == "csa" else (None, None)
        return cls(z(head_dim), *comp, *idx)


def rope_angles(positions: T, rope: Rope) -> tuple[T, T]:
    """cos, sin [R, r/2] float32 (angles in float64, attention factor 1)."""
    f = inv_freq(rope.rope_dim, rope.theta, rope.scaling).to(positions.device)
    a = positions.double()[:, None] * f[None, :]
    return a.cos().float(), a.sin().float()


def tail_rope(x: T, positions: T, rope: Rope, conjugate: bool = False) -> T:
    """The interleaved rope on the trailing r channels; x [R, ..., d] -> same, in x's dtype."""
    cos, sin = rope_angles(positions, rope)
    if conjugate:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.view(shape), sin.view(shape)
    r = rope.rope_dim
    tail = x[..., -r:].float()
    even, odd = tail[..., 0::2], tail[..., 1::2]
    y = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], y.to(x.dtype)], dim=-1)


def unweighted_rms(x: T, eps: float) -> T:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def q_heads(x: T, w: V4AttnWeights, num_heads: int, eps: float, q_head_norm: bool = True) -> tuple[T, T]:
    """(q_res [R, ql], q [R, nh, d] before its rope; per-head RMS unless ``q_head_norm`` is False, V4.1)."""
    q_res = rms_norm(F.linear(x, w.q_a), w.q_a_norm, eps)
    q = F.linear(q_res, w.q_b).view(x.shape[0], num_heads, -1)
    return q_res, unweighted_rms(q, eps) if q_head_norm else q


def kv_rows(x: T, w: V4AttnWeights, eps: float) -> T:
    return rms_norm(F.linear(x, w.kv), w.kv_norm, eps)


def pool_windows(k: T, z: T, bias: T, rate: int, overlap: bool) -> T:
    """k, z [n m, c d] (run dtype), bias [m, c d] -> the pooled windows [n, d] in float32."""
    n = k.shape[0] // rate
    k = k[:n * rate].float().view(n, rate, k.shape[-1])
    z = z[:n * rate].float().view(n, rate, z.shape[-1]) + bias.float()[None]
    if not overlap:
        return (torch.softmax(z, dim=1) * k).sum(1)
    d = k.shape[-1] // 2
    prev_k = torch.cat([torch.zeros_like(k[:1, :, :d]), k[:-1, :, :d]], dim=0)
    prev_z = torch.cat([torch.full_like(z[:1, :, :d], float("-inf")), z[:-1, :, :d]], dim=0)
    kk = torch.cat([prev_k, k[:, :, d:]], dim=1)
    zz = torch.cat([prev_z, z[:, :, d:]], dim=1)
    return (torch.softmax(zz, dim=1) * kk).sum(1)


def entries_of(k: T, z: T, cw: CompressorWeights, rate: int, overlap: bool, rope: Rope, eps: float) -> T:
    """Entries from the projections k, z [P, c d] of positions 0..P-1: [P // m, d] in k's dtype, roped at w m."""
    entries = rms_norm(pool_windows(k, z, cw.bias, rate, overlap), cw.norm, eps).to(k.dtype)
    return tail_rope(entries, torch.arange(entries.shape[0], device=k.device) * rate, rope)


def compress(x: T, cw: CompressorWeights, rate: int, overlap: bool, rope: Rope, eps: float) -> T:
    """Entries of rows x [P, H] at positions 0..P-1: [P // m, d] in x's dtype, each roped at w m."""
    return entries_of(F.linear(x, cw.kv), F.linear(x, cw.gate), cw, rate, overlap, rope, eps)


def visible(positions: T, n: int, rate: int) -> T:
    """vis[t, w] = w < (p_t + 1) // m: bool [R, n]."""
    return torch.arange(n, device=positions.device)[None, :] < ((positions + 1) // rate)[:, None]


def indexer_scores(qi: T, keys: T, hw: T) -> T:
    """qi [R, nih, di], keys [n, di], hw [R, nih] -> [R, n] float32."""
    s = torch.relu(torch.einsum("thd,wd->thw", qi.float(), keys.float())) / qi.shape[-1] ** 0.5
    return torch.einsum("thw,th->tw", s, hw.float())


def indexer_logits(keys: T, x: T, q_res: T, positions: T, iw: IndexerWeights, num_heads: int, rate: int,
                   rope: Rope) -> T:
    """The indexer's scores [R, n] float32 over keys [n, di], -inf where an entry is not visible."""
    qi = F.linear(q_res, iw.q_b)
    qi = tail_rope(qi.view(qi.shape[0], num_heads, -1), positions, rope)
    hw = F.linear(x.float(), iw.weights_proj.float()) * num_heads ** -0.5
    vis = visible(positions, keys.shape[0], rate)
    return indexer_scores(qi, keys, hw).masked_fill(~vis, float("-inf"))


def indexer_choice(keys: T, x: T, q_res: T, positions: T, iw: IndexerWeights, num_heads: int, topk: int, rate: int,
                   rope: Rope, allow: T | None = None) -> T:
    """chosen [R, min(topk, n)] int64 over the indexer's entries keys [n, di] (``compress`` with its own
    weights), -1 for a slot with no visible entry; ``allow`` bool [R, n]: only those entries (the rest -inf)."""
    n = keys.shape[0]
    if n == 0:
        return torch.zeros(x.shape[0], 0, dtype=torch.long, device=x.device)
    scores = indexer_logits(keys, x, q_res, positions, iw, num_heads, rate, rope)
    if allow is not None:
        scores = scores.masked_fill(~allow, float("-inf"))
    ids = topk_stable(scores, min(topk, n))
    return torch.where(torch.isfinite(scores.gather(1, ids)), ids, torch.full_like(ids, -1))


def chosen_mask(chosen: T, n: int) -> T:
    return (chosen[:, :, None] == torch.arange(n, device=chosen.device)[None, None, :]).any(1)


def grouped_output(o: T, o_a: T, o_b: T, groups: int) -> T:
    """o [R, nh d] -> [R, H]."""
    r = o.shape[0]
    og = o.view(r, groups, -1).transpose(0, 1)                                    # [G, R, nh d / G]
    wa = o_a.view(groups, -1, og.shape[-1])                                       # [G, ol, nh d / G]
    mid = torch.bmm(og, wa.transpose(1, 2)).transpose(0, 1).reshape(r, -1)
    return F.linear(mid, o_b)


def v4_attention(x: T, w: V4AttnWeights, kind: str, num_heads: int, window: int, rope: Rope, eps: float,
                 rate: int = 0, index_heads: int = 0, index_topk: int = 0, groups: int = 1, p0: int = 0,
                 cache: V4Cache | None = None, q_head_norm: bool = True) -> tuple[T, T | None]:
    """Rows x [R, H] at positions p0.. -> (y [R, H], chosen [R, k] or None). The rows' kv and projections are
    written into ``cache`` at p0.. (without one, a cache of the pass's own rows and p0 = 0); the keys are the
    cache's whole buffer [cap, d] and every entry slot [cap // m, d] with a mask (unwritten slots masked), so a
    row's reductions do not depend on how many rows share the pass or where the valid prefix ends."""
    r, end = x.shape[0], p0 + x.shape[0]
    if cache is None:
        if p0:
            raise ValueError("v4_attention without a cache runs from position 0")
        di = w.indexer.q_b.shape[0] // index_heads if w.indexer is not None else 0
        cache = V4Cache.empty(r, kind, w.kv.shape[0], di, x.device, x.dtype)
    cap = cache.kv.shape[0]
    pos = torch.arange(p0, end, device=x.device)
    q_res, q = q_heads(x, w, num_heads, eps, q_head_norm)
    q = tail_rope(q, pos, rope)
    cache.kv[p0:end] = tail_rope(kv_rows(x, w, eps), pos, rope)
    keys, mask, chosen = cache.kv, sliding_mask(pos, torch.arange(cap, device=x.device), window), None
    if kind != "sliding":
        cache.k[p0:end], cache.z[p0:end] = F.linear(x, w.comp.kv), F.linear(x, w.comp.gate)
        full, slots = (end // rate) * rate, cap // rate
        entries = entries_of(cache.k[:full], cache.z[:full], w.comp, rate, kind == "csa", rope, eps)
        entries = torch.cat([entries, entries.new_zeros(slots - entries.shape[0], entries.shape[1])])
        see = visible(pos, slots, rate)
        if kind == "csa":
            iw = w.indexer
            cache.ik[p0:end], cache.iz[p0:end] = F.linear(x, iw.comp.kv), F.linear(x, iw.comp.gate)
            ikeys = entries_of(cache.ik[:full], cache.iz[:full], iw.comp, rate, True, rope, eps)
            chosen = indexer_choice(ikeys, x, q_res, pos, iw, index_heads, index_topk, rate, rope)
            see = see & chosen_mask(chosen, slots)
        keys, mask = torch.cat([keys, entries]), torch.cat([mask, see], dim=1)
    kk = keys[None, None]                                                          # [1, 1, S, d]
    o = sink_attention(q.transpose(0, 1)[None], kk, kk, mask, w.sinks)[0]          # [R, nh d]
    o = tail_rope(o.view(r, num_heads, -1), pos, rope, conjugate=True)
    return grouped_output(o.reshape(r, -1), w.o_a, w.o_b, groups), chosen
