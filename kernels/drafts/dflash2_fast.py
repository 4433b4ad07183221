"""The DFlash2 draft with its propose step and its context extension as CUDA graphs (``DFlash2Draft``'s math and
interface, ``kernels.drafts.dflash2``; bound to a ``FastQwen38Target`` or any target whose verify taps are one
static buffer ``taps_buf`` [L+1, W, H]).

propose   the block [anchor, m, ..., m] at positions s..s+B-1 with s = ctx_len and the anchor staged on the device
          (``inp`` = [s, anchor]); RoPE rows gathered at s + r, the context mask key < s built on the device; the
          layers, the head and the selector's scores and walk are DFlash2Draft's own functions; the B-1 walked ids
          and the logits land in ``ids_buf`` / ``logits_buf``. One graph.
extend    context K/V of the kept rows at positions p0.. (p0 staged) from the target's static taps, stored by
          ``index_copy_`` at device positions. One graph per row count 1..W. The prompt's extension runs eagerly.
Nothing inside either pass reads a device value back; the ids are read once after the propose."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..families.qwen3.model import project_kv
from ..graphs import GraphSet, Staged
from ..ops.attention import attend
from ..ops.norm import rms_norm
from ..ops.selector import head_logits, select
from .dflash import GraphedPropose, block_ids, context_features
from .dflash2 import DFlash2Draft, Proposal, conv_layer, draft_rows

T = torch.Tensor


class FastDFlash2Draft(GraphedPropose, DFlash2Draft):
    proposal = Proposal

    def __init__(self, spec, target, max_len: int, impl: str = "auto", graphs: bool = True):
        super().__init__(spec, target, max_len, impl)
        if any(w is not None for w in spec.windows):
            raise ValueError("FastDFlash2Draft: sliding-window draft layers run on DFlash2Draft only")
        self.target = target
        self.inp = Staged(2, self.device)                          # [s, anchor]
        self.ext = Staged(1, self.device)                          # [p0]
        self.ids_buf = torch.zeros(self.b - 1, dtype=torch.long, device=self.device)
        self.logits_buf = torch.zeros(self.b - 1, spec.vocab_size, device=self.device)
        self.ones = torch.ones(self.b, self.b, dtype=torch.bool, device=self.device)
        self.propose_graph = GraphSet(lambda _: self._propose_pass(self.inp.dev[:1], self.inp.dev[1:2]),
                                      self.device, enabled=graphs)
        self.extend_graphs = GraphSet(lambda r: self._extend_pass(target.taps_buf[:, :r], self.ext.dev),
                                      self.device, enabled=graphs)

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


    def _extend_pass(self, taps: T, p0: T) -> None:
        """Context K/V at positions p0 + r from target taps [L+1, R, H] (graph-safe)."""
        r = taps.shape[1]
        u = context_features(taps, self.spec.target_layer_ids, self.fc, self.hidden_norm, self.shape.rms_eps,
                             self.target_norm, self.target_eps)
        pos = p0 + torch.arange(r, device=self.device)
        cos, sin = self.cos[pos], self.sin[pos]
        for i, w in enumerate(self.layers):
            k, v = project_kv(u[None], w, self.shape, cos, sin)
            self.k_ctx[i].index_copy_(2, pos, k)
            self.v_ctx[i].index_copy_(2, pos, v)

    def detail_pass(self) -> Proposal:
        """The propose pass run eagerly, recording each layer's output and the selector's candidates, their
        logits, scores and walked indices (what the gate's draft checks read)."""
        rec: dict = {"outs": []}
        self._propose_pass(self.inp.dev[:1], self.inp.dev[1:2], rec)
        sel = rec["sel"]
        return Proposal(self.ids_buf.tolist(), self.logits_buf.clone(), torch.stack(rec["outs"]), sel.cand, sel.unary,
                        sel.scores, sel.idx)

    def _propose_pass(self, s: T, anchor: T, rec: dict | None = None) -> None:
        """DFlash2Draft.propose with s and the anchor on the device (graph-safe); ``rec`` (eager runs only)
        collects each layer's output [B, H] and the selection."""
        b, sp = self.b, self.spec
        h = F.embedding(block_ids(anchor, sp.mask_token_id, b), self.embed)                   # [1, B, H]
        if sp.input_embedding_scale != 1.0:
            h = h * sp.input_embedding_scale
        pos = s + torch.arange(b, device=self.device)
        cos, sin = self.cos[pos], self.sin[pos]
        allowed = torch.cat([(self.key_pos[None, :] < s).expand(b, -1), self.ones], dim=1)    # [B, cap + B]
        for i, (w, cw) in enumerate(zip(self.layers, self.convs, strict=True)):
            def with_context(q, k, v, i=i):
                return attend(q, torch.cat([self.k_ctx[i], k], dim=2), torch.cat([self.v_ctx[i], v], dim=2), allowed)
            h = conv_layer(h, w, cw, sp, cos, sin, with_context, b, self.conv)
            if rec is not None:
                rec["outs"].append(h[0].clone())
        rows = draft_rows(rms_norm(h[0], self.norm, self.shape.rms_eps))                      # [B-1, H]
        logits = head_logits(rows, self.head, sp.output_multiplier, sp.final_logit_softcapping)
        sel = select(logits, F.linear(rows, self.w_hp), anchor[0], self.a, self.bs, sp.selector_top_k, self.fused)
        self.logits_buf.copy_(logits)
        self.ids_buf.copy_(sel.ids)
        if rec is not None:
            rec["sel"] = sel
