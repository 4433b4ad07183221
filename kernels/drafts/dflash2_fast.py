"""The DFlash2 draft with its propose step and its context extension as CUDA graphs (``DFlash2Draft``'s math and
interface, ``kernels.drafts.dflash2``; bound to a ``FastQwen38Target`` or any target whose verify taps are one
static buffer ``taps_buf`` [L+1, W, H]), laid out as the fast target engines run a layer: q/k/v and gate/up stacked
(``FusedLayer``), norm gains in f32, every projection through ``ops.proj`` (``kernels.dispatch.decode_ops``: the
Triton decode projection ``kernels.triton.gemv`` where it takes the shape, cuBLAS for gate/up and the head), the
q/k norms + RoPE + cache store one ``ops.qk_rope_store``, the attention ``ops.attention``.

One draft layer over the block rows h [B, H] at positions s..s+B-1 (s = p0, staged on the device):
    a  = rms(h, ln_in)           da = a W_kp^T [B, 2TG]     a0 = Conv^0(a ; da)
    qkv = a0 [Wq; Wk; Wv]^T      q, k normed per head, rotated; k, v stored in the context cache at s..s+B-1
    o  = attention(q, cache keys <= s+B-1)       (context < s, the whole block: DFlash's rule, no mask built)
    h  = h + Conv^1(o Wo^T ; da)
    m  = rms(h, ln_post)         dm = m W_kp'^T             gu = Conv^0'(m ; dm) [Wg; Wu]^T
    h  = h + Conv^1'(silu(g) u Wd^T ; dm)
The block's K/V in the cache are transient: rows past the context, overwritten by the next extension before any
block reads them (``FastDFlashDraft``'s rule). Then rows = rms(h[1:], norm) [B-1, H]; logits = head_logits(rows)
[B-1, V] f32; g = rows W_hp^T [B-1, r]; the selector's top-K, scores and walk (``ops.selector.select``).

propose   the pass above with s = ctx_len and the anchor staged (``inp`` = [s, anchor]); the B-1 walked ids and the
          logits land in ``ids_buf`` / ``logits_buf``. One graph.
extend    context K/V of the kept rows at positions p0.. (p0 staged) from the target's static taps:
              u = rms(concat_j taps[l_j + 1] Wfc^T, hidden_norm)   k, v = u [Wk; Wv]^T (k normed, rotated) -> cache
          One graph per row count 1..W. The prompt's extension runs eagerly.
Nothing inside either pass reads a device value back; the ids are read once after the propose."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..dispatch import decode_ops
from ..families.qwen3.model import FusedLayer, LayerWeights
from ..graphs import Staged, rows_pad
from ..ops.selector import head_logits, select
from .dflash import GraphedPropose, context_features
from .dflash2 import ConvWeights, DFlash2Draft, Proposal

T = torch.Tensor


def _views(w: LayerWeights, f: FusedLayer, s) -> LayerWeights:
    """``w`` with q/k/v and gate/up as row views of the stacked copies (the separate device copies freed where
    nothing else holds them)."""
    nq, nkv, i = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, f.wgu.shape[0] // 2
    return dataclasses.replace(w, wq=f.wqkv[:nq], wk=f.wqkv[nq:nq + nkv], wv=f.wqkv[nq + nkv:], wg=f.wgu[:i],
                               wu=f.wgu[i:])


class FastDFlash2Draft(GraphedPropose, DFlash2Draft):
    proposal = Proposal

    def __init__(self, spec, target, max_len: int, impl: str = "auto", graphs: bool = True):
        super().__init__(spec, target, max_len, impl)
        if any(w is not None for w in spec.windows):
            raise ValueError("FastDFlash2Draft: sliding-window draft layers run on DFlash2Draft only")
        self.target = target
        self.ops = decode_ops(self.impl, self.device)
        self.flayers = [FusedLayer.of(w) for w in self.layers]
        self.layers = [_views(w, f, self.shape) for w, f in zip(self.layers, self.flayers, strict=True)]
        f32 = lambda x: x.float().contiguous()  # noqa: E731
        self.norm32, self.hidden32, self.target32 = f32(self.norm), f32(self.hidden_norm), f32(self.target_norm)
        self.rp = rows_pad(self.b)                                # the propose's projections pad to this
        self.ext_rp = rows_pad(target.max_width)                  # every extension width pads the same
        self.inp = Staged(2, self.device)                          # [s, anchor]
        self.ext = Staged(1, self.device)                          # [p0]
        self.block = torch.full((self.b,), spec.mask_token_id, dtype=torch.long, device=self.device)
        self.ids_buf = torch.zeros(self.b - 1, dtype=torch.long, device=self.device)
        self.logits_buf = torch.zeros(self.b - 1, spec.vocab_size, device=self.device)
        self._graph_passes(graphs)

    def capture(self) -> None:
        """Capture the propose and the extension of every row count now (their warm-up writes land past the
        context: transient)."""
        self.inp.put([self.ctx_len, 0])
        self.propose_graph.capture(0)
        self.ext.put([self.ctx_len])
        for r in range(1, self.target.max_width + 1):
            self.extend_graphs.capture(r)

    def prompt(self, taps: T) -> None:
        self._extend_pass(taps, torch.zeros(1, dtype=torch.long, device=self.device))
        self.ctx_len = taps.shape[1]

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows starting at the last anchor's position: their context K/V."""
        if self.ctx_len + kept > self.cap:
            raise ValueError(f"draft context of {self.cap} positions is full")
        if taps.data_ptr() == self.target.taps_buf.data_ptr():
            self.ext.put([self.ctx_len])
            self.extend_graphs.run(kept)
        else:
            self._extend_pass(taps[:, :kept], torch.tensor([self.ctx_len], device=self.device))
        self.ctx_len += kept

    def _propose_key(self, _key) -> None:
        self._propose_pass(self.inp.dev[:1], self.inp.dev[1:2])

    def _extend_rows(self, r: int) -> None:
        """The extension graph's pass: the target's r kept taps at the staged p0."""
        self._extend_pass(self.target.taps_buf[:, :r], self.ext.dev)

    def _extend_pass(self, taps: T, p0: T) -> None:
        """Context K/V at positions p0 + r from target taps [L+1, R, H] (graph-safe)."""
        s, ops = self.shape, self.ops
        nq, nkv, d, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_eps
        u = context_features(taps, self.spec.target_layer_ids, self.fc, self.hidden32, eps, self.target32,
                             self.target_eps, ops, self.ext_rp)
        for i, w in enumerate(self.flayers):
            kv = ops.proj(u, w.wqkv[nq * d:], None, eps, rp=self.ext_rp)
            ops.qk_rope_store(kv, 0, nkv, d, None, w.k_norm, self.cos, self.sin, p0, self.k_ctx[i, 0],
                              self.v_ctx[i, 0], eps)

    def detail_pass(self) -> Proposal:
        """The propose pass run eagerly, recording each layer's output and the selector's candidates, their
        logits, scores and walked indices (what the gate's draft checks read)."""
        rec: dict = {"outs": []}
        self._propose_pass(self.inp.dev[:1], self.inp.dev[1:2], rec)
        sel = rec["sel"]
        return Proposal(self.ids_buf.tolist(), self.logits_buf.clone(), torch.stack(rec["outs"]), sel.cand, sel.unary,
                        sel.scores, sel.idx)

    def _layer(self, h: T, w: FusedLayer, cw: ConvWeights, i: int, p0: T) -> T:
        """One draft layer (module docstring) over the block rows h [B, H] at p0.. (graph-safe)."""
        s, ops, conv, b, rp = self.shape, self.ops, self.conv, self.b, self.rp
        nq, nkv, d, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_eps
        kc, vc = self.k_ctx[i, 0], self.v_ctx[i, 0]
        a = ops.rms(h, w.ln_in, eps)
        da = ops.proj(a, cw.attn_kp, None, eps, rp=rp)
        qkv = ops.proj(conv(a, da, cw.attn_base, 0, b), w.wqkv, None, eps, rp=rp)
        ops.qk_rope_store(qkv, nq, nkv, d, w.q_norm, w.k_norm, self.cos, self.sin, p0, kc, vc, eps)
        o = ops.attention(qkv, nq, nkv, d, kc, vc, p0, causal=False)
        h = conv(ops.proj(o, w.wo, None, eps, rp=rp), da, cw.attn_base, 1, b, res=h)
        m = ops.rms(h, w.ln_post, eps)
        dm = ops.proj(m, cw.mlp_kp, None, eps, rp=rp)
        gu = ops.proj(conv(m, dm, cw.mlp_base, 0, b), w.wgu, None, eps, rp=rp)
        return conv(ops.proj(ops.silu_mul(gu), w.wd, None, eps, rp=rp), dm, cw.mlp_base, 1, b, res=h)

    def _propose_pass(self, s: T, anchor: T, rec: dict | None = None) -> None:
        """DFlash2Draft.propose with s and the anchor on the device (graph-safe); ``rec`` (eager runs only)
        collects each layer's output [B, H] and the selection."""
        sp = self.spec
        self.block[:1].copy_(anchor)
        h = F.embedding(self.block, self.embed)                                               # [B, H]
        if sp.input_embedding_scale != 1.0:
            h = h * sp.input_embedding_scale
        for i, (w, cw) in enumerate(zip(self.flayers, self.convs, strict=True)):
            h = self._layer(h, w, cw, i, s)
            if rec is not None:
                rec["outs"].append(h.clone())
        rows = self.ops.rms(h[1:], self.norm32, self.shape.rms_eps)                           # [B-1, H]
        head_logits(rows, self.head, sp.output_multiplier, sp.final_logit_softcapping, out=self.logits_buf)
        g = self.ops.proj(rows, self.w_hp, None, self.shape.rms_eps, rp=self.rp)
        sel = select(self.logits_buf, g, anchor[0], self.a, self.bs, sp.selector_top_k, self.fused, self.topk)
        self.ids_buf.copy_(sel.ids)
        if rec is not None:
            rec["sel"] = sel
