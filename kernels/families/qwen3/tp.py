"""Qwen3 split over N processes (tensor parallel, Megatron's column / row split): the shard one rank holds and
runs. The driver (rank 0, ``bloomery_cli.parallel.tp``) and every worker run the same ``ShardEngine`` pass on
their shard.

Rank r of N, with nh q heads, nkv kv heads (both divisible by N) and I MLP columns (divisible by N):
    Wq  rows of heads  r nh/N .. (r+1) nh/N - 1      [nh/N d, H]       (column split: its own heads)
    Wk, Wv rows of kv heads r nkv/N ..               [nkv/N d, H]      (q head i reads kv head i // g, g = nh/nkv:
                                                                         the shard's q heads read its own kv heads)
    Wo  columns of its heads                         [H, nh/N d]       (row split: a partial sum)
    Wg, Wu rows r I/N ..                             [I/N, H]          Wd columns [H, I/N]
    embedding, head, norms (input, post, q_norm, k_norm, final): replicated

One layer on rank r (h [1, R, H] replicated):
    a   = rms(h, ln_in);  o_r = attend(q_r, K_r, V_r) Wo_r^T           [1, R, H]  partial
    h   = h + allreduce_f32(o_r)                                        (partials cast to f32, summed, cast back)
    m_r = swiglu_r(rms(h, ln_post)) = (silu(m Wg_r^T) * m Wu_r^T) Wd_r^T
    h   = h + allreduce_f32(m_r)
so sum_r o_r = attend(q, K, V) Wo^T and sum_r m_r = swiglu(m): the same layer, two all-reduces per layer.
Each rank's KV cache holds its own kv heads [L, 1, nkv/N, cap, d]; ``gather_kv`` puts them back in head order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bloomery_gates.spec import LayerShape, ModelSpec

from ...ops.norm import rms_norm
from .model import LayerWeights, StaticCache, cached_layers


def all_reduce_f32(x: torch.Tensor, group=None) -> torch.Tensor:
    """sum over ranks of x, accumulated in float32, returned in x's dtype."""
    p = x.float()
    dist.all_reduce(p, group=group)
    return p.to(x.dtype)


def reduce_attn(x: torch.Tensor, group=None) -> torch.Tensor:
    """The o_proj partials' sum (its own name: a FAIL-first test drops this one alone)."""
    return all_reduce_f32(x, group)


def reduce_mlp(x: torch.Tensor, group=None) -> torch.Tensor:
    """The down_proj partials' sum."""
    return all_reduce_f32(x, group)


def split_sizes(spec: ModelSpec, world: int) -> str | None:
    """Why ``spec`` cannot split over ``world`` ranks, or None when it can."""
    s = spec.layer
    inter = spec.tensors["model.layers.0.mlp.gate_proj.weight"].shape[0]
    for what, n in (("num_key_value_heads", s.num_kv_heads), ("num_attention_heads", s.num_heads),
                    ("intermediate_size", inter)):
        if n % world:
            return f"{what}={n} does not divide by --tp {world}"
    return None


def shard_shape(shape: LayerShape, world: int) -> LayerShape:
    return replace(shape, num_heads=shape.num_heads // world, num_kv_heads=shape.num_kv_heads // world)


def shard_layer(w: LayerWeights, shape: LayerShape, rank: int, world: int, cast) -> LayerWeights:
    """Rank ``rank``'s slice of one layer (sliced on the host, then cast: a card holds its shard only)."""
    d = shape.head_dim
    qh, kh = shape.num_heads // world * d, shape.num_kv_heads // world * d
    inter = w.wg.shape[0] // world

    def rows(t: torch.Tensor, n: int) -> torch.Tensor:
        return cast(t[rank * n:(rank + 1) * n].contiguous())

    def cols(t: torch.Tensor, n: int) -> torch.Tensor:
        return cast(t[:, rank * n:(rank + 1) * n].contiguous())

    return LayerWeights(cast(w.ln_in), rows(w.wq, qh), rows(w.wk, kh), rows(w.wv, kh), cols(w.wo, qh),
                        cast(w.q_norm), cast(w.k_norm), cast(w.ln_post), rows(w.wg, inter), rows(w.wu, inter),
                        cols(w.wd, inter))


@dataclass
class ShardPass:
    taps: torch.Tensor                 # [L+1, R, H] (replicated: every rank has them after each all-reduce)
    logits: torch.Tensor | None        # [R, V] on the rank that holds the head, else None


class ShardEngine:
    """One rank's shard of the Qwen3 target: KV cache [L, 1, nkv/N, cap, d], one pass at a given start position
    (the driver owns ``length``: a worker needs no commit). ``head`` False: no LM head (the workers')."""

    def __init__(self, spec: ModelSpec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None, rank: int, world: int, group=None, head: bool = True):
        self.spec, self.full_shape = spec, spec.layer
        self.shape = shard_shape(spec.layer, world)
        self.device, self.dtype, self.rank, self.world, self.group = torch.device(device), dtype, rank, world, group
        cast = lambda x: x.to(device=self.device, dtype=dtype)  # noqa: E731
        self.layers = [shard_layer(LayerWeights.gather(spec.tensors, f"model.layers.{i}."), spec.layer, rank,
                                   world, cast) for i in range(spec.num_layers)]
        self.embed = cast(spec.tensors["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight()) if head else None
        self.final_norm = cast(spec.tensors["model.norm.weight"])
        c = StaticCache.make(self.shape, spec.num_layers, max_len + (rows or 0), self.device, dtype)
        self.cap, self.cos, self.sin, self.key_pos = c.cap, c.cos, c.sin, c.key_pos
        self.k_cache, self.v_cache = c.k_cache, c.v_cache

    def run(self, ids: list[int], p0: int, want_logits: bool) -> ShardPass:
        """Rows ids at positions p0..p0+R-1 (KV written there), the same ops as ``Qwen3Target._run``."""
        taps = cached_layers(self, ids, p0, lambda x: reduce_attn(x, self.group), lambda x: reduce_mlp(x, self.group))
        logits = None
        if self.head is not None and want_logits:
            logits = F.linear(rms_norm(taps[-1], self.final_norm, self.shape.rms_eps), self.head)
        return ShardPass(torch.stack(taps), logits)

    def gather_kv(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every rank's kv heads of ``layer``, positions 0..length-1, in head order: [nkv, length, d] each
        (a collective: every rank calls it; all get the result)."""
        out = []
        for cache in (self.k_cache, self.v_cache):
            mine = cache[layer, 0, :, :length].contiguous()
            parts = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine, group=self.group)
            out.append(torch.cat(parts, dim=0))
        return out[0], out[1]
