"""DeepSeek V4.1 ("deepseek41") trunk on the device (torch, CPU or CUDA): the V4.1 deltas over
``kernels.families.deepseek4.model`` (docs/V41.md), written out in ``reference.families.deepseek41.model``: the
lagged hyper-connection mixes and the LastMix collapse (``kernels.ops.mhc_lagged``), no per-head q norm, the
compressed streams shared from source layers (``kernels.ops.v41_stream``: a kv source keeps its compressor's
projections by position in a ``StreamCache`` and pools every pass; its readers attend its entries), the engram
sites (``kernels.ops.engram``, the table rows hashed on the host from the committed ids and the pass's); V4's routing
and MoE (MXFP4 experts included) are the deepseek4 engine's.

Rows [R, ...] (one sequence). A layer's state is (streams x [R, S, H], lag [R, S] float32); the taps are its packed
form [L+1, R, S+1, H] in the run dtype (``pack_lag``), and the lag travels between layers in that tap (rounded to
the run dtype at each layer boundary, as the reference's ``pack_lag`` stores it). ``final`` [R, H] =
norm(last_mix(x, lag)): no ``model.hc_head.*``. The caches, commit and passes are the deepseek4 engine's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek41Spec

from ...ops import engram as keng
from ...ops import mhc_lagged as klag
from ...ops import v4_attention as kv4
from ...ops import v41_stream as ks
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..deepseek4.model import Deepseek4Target, attn_weights_at, ffn, layer_rope
from ..qwen38.model import Qwen38Pass

T = torch.Tensor


def stream_key(l: int) -> str:
    """The name of topk source l's stream choice (``reference.families.deepseek41.model.stream_key``: the gates pin
    the kernel's choice under it)."""
    return f"stream choice of layer {l}"


def candidate_key(l: int) -> str:
    """The name of candidate source l's kept blocks (``reference.families.deepseek41.model.candidate_key``)."""
    return f"candidate blocks of layer {l}"


class Deepseek41Target(Deepseek4Target):
    """The V4.1 target engine: prefill / verify / commit / kv_rows as deepseek4's; passes are ``Qwen38Pass`` with
    taps [L+1, R, S+1, H] (module docstring) and ``final`` [R, H] = norm(last_mix(streams, lag))."""

    def __init__(self, spec: Deepseek41Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        if (spec.hc_mix, spec.collapse) != ("lagged", "last_mix") or \
                not set(spec.layer_types) <= {"sliding", "stream"}:
            raise ValueError("deepseek41 runs lagged mixes + LastMix on sliding / stream layers (docs/V41.md 10)")
        self._load_trunk(spec, device, dtype, rows)
        self.tap_width = (spec.hc.count + 1) * spec.hidden_size      # a tap row: the S streams and the lag row
        self.cap = max_len + (rows or 0)
        a = spec.attn
        self.cache = {l: kv4.V4Cache.empty(self.cap, "sliding", a.head_dim, a.index_head_dim, self.device, dtype)
                      for l in range(spec.num_layers)}
        self.stream_cache = {l: ks.StreamCache.empty(self.cap, a.head_dim, f"layers.{l}.self_attn.compressor."
                                                     "gate_proj.weight" in self.t, self.device, dtype)
                             for l in range(spec.num_layers) if (s := spec.stream(l)) and s.kv_source == l}
        self.routings: dict[int, Routing] = {}
        self.chosen: dict[int, T] = {}
        self.blocks: dict[int, T] = {}         # the candidate source's kept blocks [R, K] of the last pass
        self.length = 0
        self.rows_run = 0
        self._ran: int | None = None
        self.history: list[int] = []           # the committed ids (the engram sites hash each token's n-grams)
        self._ids: list[int] = []

    def reset(self) -> None:
        super().reset()
        self.history = []

    def commit(self, kept: int) -> None:
        super().commit(kept)
        self.history = self.history[:self.length - kept] + self._ids[:kept]

    def _engram(self, l: int, x: T, p0: int) -> T:
        """Layer l's engram site on the streams x [R, S, H] (``kernels.ops.engram``); x itself off a site."""
        e = self.spec.engram
        site = e.site(l) if e is not None else None
        if site is None:
            return x
        p = f"layers.{l}.engram."
        idx = torch.tensor(e.rows(site, self.history[:p0] + self._ids, start=p0), device=self.device)
        emb = F.embedding(idx.view(-1), self.t[p + "embed.weight"]).view(x.shape[0], -1)
        return keng.engram(x, emb, self.t[p + "wkv.weight"], self.t[p + "k_norm.weight"], self.t[p + "q_norm.weight"],
                           self.shape.rms_eps)

    def _prime(self, l: int, a: T, p0: int, ss: dict) -> None:
        """Layer l's source duties on its normed rows a [R, H] (``reference.families.deepseek41.model.prime``):
        the pass's pre / keys / chosen in ``ss``; the candidate source's mask [R, n] too (per row of this pass,
        read by the later masked layers of the same pass; not kept across passes)."""
        s, t, p, eps = self.spec.stream(l), self.t, f"layers.{l}.self_attn.", self.shape.rms_eps
        if s is None:
            return
        rope, at = layer_rope(self.spec, l), self.spec.attn
        if s.kv_source == l:
            sw = ks.StreamWeights(t[p + "compressor.kv_proj.weight"], t.get(p + "compressor.gate_proj.weight"),
                                  t[p + "compressor.kv_norm.weight"])
            ss[("pre", l)] = ks.pooled(a, sw, s.ratio, eps, p0, self.stream_cache[l])
        if s.key_source == l:
            kw = ks.IndexKeyWeights(t[p + "indexer.k_proj.weight"], t[p + "indexer.k_norm.weight"])
            ss[("keys", l)] = ks.index_keys(ss[("pre", l)], kw, s.ratio, rope, eps)
        if s.topk_source == l:
            iw = ks.IndexerWeights(None, t[p + "indexer.q_b_proj.weight"], t[p + "indexer.weights_proj.weight"])
            keys, aw, cm = ss[("keys", s.key_source)], attn_weights_at(t, p, "sliding"), self.spec.candidates
            allow = ss[("candidates", cm.source_layer)] if self.spec.masked(l) else None
            chosen = ks.stream_choice(keys, a, aw, iw, at.num_heads, at.index_heads, at.index_topk, s.ratio, rope,
                                      eps, p0, allow)
            ss[("chosen", l)] = self.chosen[l] = chosen
            if cm is not None and cm.source_layer == l:
                scores = ks.stream_scores(keys, a, aw, iw, at.num_heads, at.index_heads, s.ratio, rope, eps, p0)
                lens = ks.entries_seen(p0, a.shape[0], keys.shape[0], s.ratio, a.device)
                blocks = ks.candidate_blocks(ks.block_scores(scores, lens, cm.block_size), cm.topk_blocks)
                self.blocks[l] = blocks
                ss[("candidates", l)] = ks.candidate_mask(blocks, keys.shape[0], cm.block_size)

    def _attention(self, l: int, a: T, p0: int, ss: dict) -> T:
        s, at, rope = self.spec.stream(l), self.spec.attn, layer_rope(self.spec, l)
        entries = ks.stream_entries(ss[("pre", s.kv_source)], s.ratio, rope) if s is not None else None
        return ks.stream_attention(a, attn_weights_at(self.t, f"layers.{l}.self_attn.", "sliding"), at.num_heads,
                                   at.window, rope, self.shape.rms_eps, at.o_groups, entries, s.ratio if s else 0,
                                   ss[("chosen", s.topk_source)] if s is not None else None, p0, self.cache[l].kv)

    def layer(self, l: int, state: T, tok: T, p0: int, ss: dict) -> T:
        """Layer l: state [R, S+1, H] -> the next (attention, then MoE, each a lagged sublayer); ``ss`` the
        pass's stream state."""
        spec, eps, t, p = self.spec, self.shape.rms_eps, self.t, f"layers.{l}."
        hc = spec.hc

        def attend(f: T) -> T:
            a = rms_norm(f, t[p + "input_layernorm.weight"], eps)
            self._prime(l, a, p0, ss)
            return self._attention(l, a, p0, ss)

        x, lag = klag.unpack_lag(state)
        x = self._engram(l, x, p0)
        x, pre = klag.lagged_sublayer(x, lag, t[p + "attn_hc.fn"], t[p + "attn_hc.base"], t[p + "attn_hc.scale"],
                                      hc.sinkhorn_iters, hc.eps, eps, attend)
        x, lag = klag.lagged_sublayer(x, pre, t[p + "ffn_hc.fn"], t[p + "ffn_hc.base"], t[p + "ffn_hc.scale"],
                                      hc.sinkhorn_iters, hc.eps, eps,
                                      lambda b: ffn(spec, t, l, rms_norm(b, t[p + "post_attention_layernorm.weight"],
                                                                         eps), tok, self.routings))
        return klag.pack_lag(x, lag)

    def _run(self, ids: list[int], want_logits: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"cache of {self.cap} positions is full (pass ends at {p0 + r})")
        spec, eps = self.spec, self.shape.rms_eps
        self._ids = list(ids)
        tok = torch.tensor(ids, device=self.device)
        e = F.embedding(tok, self.embed)                                                    # [R, H]
        x = e[:, None, :].expand(r, spec.hc.count, -1).contiguous()                         # [R, S, H]
        state = klag.pack_lag(x, klag.lag_init(x))
        taps, ss = [state], {}
        for l in range(spec.num_layers):
            state = self.layer(l, state, tok, p0, ss)
            taps.append(state)
        self._ran = r
        self.rows_run += r
        x, lag = klag.unpack_lag(state)
        final = rms_norm(klag.last_mix(x, lag), self.final_w, eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final,
                          dict(self.routings), {stream_key(l): c for l, c in self.chosen.items()} |
                          {candidate_key(l): b for l, b in self.blocks.items()})
