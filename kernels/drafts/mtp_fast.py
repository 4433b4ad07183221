"""The MTP draft of a ``FastQwen38Target`` with its propose step as CUDA graphs (``MTPDraft``'s interface and math,
``kernels.drafts.mtp``; the store and queue rules are ``chain_store.ChainStore``'s, unchanged).

A propose writes the n queued real rows and the anchor's row at slots s0..s0+n-1, then chains ``width`` - 1 rows at
s0+n.., each reading the one before's own output and the embedding of its argmax. Here that whole step is one pass
over static buffers: the rows (e, h) [n, H] are copied into ``in_e`` / ``in_h``, s0 is staged on the device, the
chained ids are taken by ``argmax(out=)`` and gathered on the device, and the ``width`` ids and logits land in
``ids_buf`` / ``logits_buf``: no host read inside the pass, one readback after it. On CUDA one graph per n
(1..``max_rows``; the rows a verify of ``target.max_width`` leaves, plus the anchor); a longer queue (plain
windows run back to back) runs the same pass eagerly. The prompt's rows are written at ``prompt`` (the draft's
prefill), so the first propose is one row. Attention attends keys 1..position
(slot 0 holds no row): the target's flash-decoding kernel where the target runs it (``ops.attention`` from key 1),
else the masked matmul over the whole store. The final norm of the target's rows is ``ops.rms`` (one kernel)."""

from __future__ import annotations

import torch

from bloomery_gates.spec import MTPSpec

from ..families.qwen38.fast import _Cast, fast_attn, ffn_into, gated_attention
from ..families.qwen38.model import norm_gain
from ..graphs import GraphSet, Staged
from ..ops.rope import rope_tables
from .chain_store import ChainStore
from .mtp import DEFAULT_WIDTH, P, Proposal

T = torch.Tensor


class FastMTPDraft(ChainStore):
    """``MTPDraft`` bound to a ``FastQwen38Target`` (its ops, embedding, head and final-norm gain)."""

    def __init__(self, spec: MTPSpec, target, max_len: int, width: int = DEFAULT_WIDTH, graphs: bool = True):
        if width < 1:
            raise ValueError(f"MTP width {width}: expected >= 1 drafts per window")
        self.spec, self.width, self.tspec, self.target = spec, width, target.spec, target
        self.device, self.dtype, self.ops = target.device, target.dtype, target.ops
        cast = _Cast(self.device, self.dtype)
        t = spec.tensors
        self.layer = fast_attn(t, "mtp.layers.0.", cast)
        self.fc = cast(t[P + "fc.weight"]).contiguous()
        self.pre_e, self.pre_h, self.norm = (norm_gain(t[P + n + ".weight"]).to(self.device)
                                             for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"))
        self.embed, self.head = target.embed, target.head
        self.flash = target.attention == "triton"          # the flash-decoding kernel (else the masked matmul)
        self.final_gain, self.eps = target.final_norm, target.shape.rms_eps
        s = spec.layer
        self.init_store(s.num_kv_heads, s.head_dim, max_len + width + 2, self.device, self.dtype, "MTP")
        self.cos, self.sin = rope_tables(spec.rotary_dim, s.rope_theta, self.cap, self.device)
        self.max_rows = target.max_width + 1
        h = s.hidden_size
        self.in_e = torch.zeros(self.max_rows, h, device=self.device, dtype=self.dtype)
        self.in_h = torch.zeros(self.max_rows, h, device=self.device, dtype=self.dtype)
        self.slot = Staged(1, self.device)
        self.ids_buf = torch.zeros(width, dtype=torch.long, device=self.device)
        self.logits_buf = torch.zeros(width, spec.vocab_size, device=self.device, dtype=self.dtype)
        self.graphs = GraphSet(self._chain_rows, self.device, enabled=graphs)

    # ------------------------------------------------------------------------------------------ the API

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, H]: rows 1..P-1 (token j, hidden j-1) are real and written to the store now, in one
        eager pass (the draft's prefill, beside the target's); hidden P-1 waits for the anchor, so the first
        propose writes the anchor's row alone (one row: the graphed pass). The rows' outputs are not needed: only
        their K/V, and causal attention makes the two passes equal to one over all P rows."""
        self.start(taps[0][1:], self.ops.rms(taps[-1], self.final_gain, self.eps))
        n = self.pend_e.shape[0]
        if n:
            if 1 + n > self.cap:
                raise ValueError(f"MTP KV store of {self.cap} positions is full (the prompt's rows end at {n + 1})")
            self._rows(self.pend_e, self.pend_h, torch.tensor([self.next_slot], device=self.device))
            self.next_slot += n
            self.pend_e, self.pend_h = self.pend_e[:0], self.pend_h[:0]

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows: their tokens and post-final-norm hidden rows join the queue (copies: the
        taps are the target's static buffer)."""
        self.queue(kept, taps[0], self.ops.rms(taps[-1][:kept], self.final_gain, self.eps))

    def capture(self) -> None:
        """Capture the propose of every n <= max_rows now (warm-up rows land past the real rows: transient)."""
        self.slot.put([self.next_slot])
        for n in range(1, self.max_rows + 1):
            if self.next_slot + n + self.width <= self.cap:
                self.graphs.capture(n)

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        e, h = self.real_rows(self.embed[anchor])
        n = e.shape[0]
        if self.next_slot + n + self.width - 1 > self.cap:
            raise ValueError(f"MTP KV store of {self.cap} positions is full (pass ends at "
                             f"{self.next_slot + n + self.width - 1})")
        if detail:                                  # the same pass, eager, recording each row's layer output
            ys: list[T] = []
            self._chain(e, h, torch.tensor([self.next_slot], device=self.device), ys)
            self.written(n)
            return Proposal(self.ids_buf.tolist(), self.logits_buf.clone(), torch.cat(ys)[None])
        if n <= self.max_rows:
            self.in_e[:n].copy_(e)
            self.in_h[:n].copy_(h)
            self.slot.put([self.next_slot])
            self.graphs.run(n)
        else:
            self._chain(e, h, torch.tensor([self.next_slot], device=self.device))
        self.written(n)
        return Proposal(self.ids_buf.tolist())

    # ------------------------------------------------------------------------------------------ the pass

    def _rows(self, e: T, h: T, slot0: T) -> T:
        """Rows (e_j, h_j) [R, H] at slots slot0 + r (device), written to the store -> the layer's output y [R, H]."""
        ops, eps = self.ops, self.eps
        r = e.shape[0]
        u = torch.mm(torch.cat([ops.rms(e, self.pre_e, eps), ops.rms(h, self.pre_h, eps)], dim=-1), self.fc.t())
        pos = slot0 + torch.arange(r, device=self.device)
        allowed = None if self.flash else (self.key_pos[None, :] <= pos[:, None]) & (self.key_pos[None, :] >= 1)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        y = gated_attention(ops, self.tspec.layer, u, self.layer, self.k[0], self.v[0], pos, slot0, allowed, cos, sin,
                            eps, first=1)
        return ffn_into(ops, y, self.layer.mlp, eps)

    def _chain_rows(self, n: int) -> None:
        """The graph's pass: the chain over the n staged rows (``_chain``)."""
        self._chain(self.in_e[:n], self.in_h[:n], self.slot.dev)

    def _chain(self, e: T, h: T, slot0: T, rec: list | None = None) -> None:
        """The propose step (graph-safe): n real rows at slot0.., then width-1 chained rows at slot0+n..; ``rec``
        (eager runs only) collects the layer's output of each drafted row [1, H]."""
        ops, eps, n = self.ops, self.eps, e.shape[0]
        y = self._rows(e, h, slot0)[-1:].contiguous()
        g = ops.rms(y, self.norm, eps)                                                        # [1, H]
        for i in range(self.width):
            if i:
                x = torch.index_select(self.embed, 0, self.ids_buf[i - 1:i])
                y = self._rows(x, g, slot0 + n + i - 1)
                g = ops.rms(y, self.norm, eps)
            if rec is not None:
                rec.append(y.clone())
            torch.mm(g, self.head.t(), out=self.logits_buf[i:i + 1])
            torch.argmax(self.logits_buf[i:i + 1], dim=-1, out=self.ids_buf[i:i + 1])
