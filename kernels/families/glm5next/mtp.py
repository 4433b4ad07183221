"""The NextN draft of a glm5next (GLM-5.3) target on the device; the math is written out in
``reference.families.glm5next.mtp`` (name for name). One NextN block (plain residual MLA + full DSA indexer +
sparse FFN, no mHC), chained ``width`` times a window: its row at NextN position r reads the token at r+1 and the
target's post-norm row h_r = rms(mean of the last layer's streams, model.norm); a chained row reads (d_i, g).

State, by NextN position (slot j = position j-1; ``ChainStore``'s queue of real rows): the latent
c [cap, kl] (what MLA keeps per row) and the normed block inputs a [cap, H] (what the indexer's keys and pooled keys
are made from, on every pass). Real rows (a token the target emitted, a hidden row it computed) are written for
good; chained rows (the draft's own g) are written past them and overwritten by the next pass: that is the rollback
on a reject. ``accept`` only queues the kept rows' real inputs; ``propose`` writes the queue and the anchor's row in
one pass, so after a verify the kept positions' rows are rewritten from the target's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Glm5NextSpec

from ...drafts.chain_store import ChainStore
from ...drafts.proposal import Proposal
from ...ops import dsa as kdsa
from ...ops import mhc as kmhc
from ...ops import mla as kmla
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..ffn import route
from .model import F32_SUFFIXES, Glm5NextTarget, indexer_weights, mla_weights, moe, text_prefix

T = torch.Tensor
WIDTH = 3
N = "nextn."        # the draft's own tensor names: nextn.<rest of layers.{n}.>


@dataclass
class Store:
    """Where a pass writes its rows: latent [cap, kl] and normed block inputs [cap, H], from position p0."""

    latent: T
    index_in: T
    p0: int


def block(t: dict[str, T], spec: Glm5NextSpec, e: T, h: T, store: Store | None,
          select_tail: bool) -> tuple[T, T, Routing, kdsa.Selection]:
    """The NextN block on rows (e, h) [R, H] (the embedding of tok_{r+1}, the hidden h_r) -> (z, g, routing, the
    indexer's Selection). With a ``store`` the rows sit at NextN positions p0.. and attend over (and index) the
    store's rows 0..p0+R-1, theirs written first; without one (training) they are the positions 0..R-1 and attend
    among themselves."""
    eps, d, w, iw = spec.layer.rms_eps, spec.dsa, mla_weights(t, N + "self_attn."), indexer_weights(t, N + "self_attn.")
    u = F.linear(torch.cat([rms_norm(e, t[N + "enorm.weight"], eps), rms_norm(h, t[N + "hnorm.weight"], eps)], -1),
                 t[N + "eh_proj.weight"])
    a = rms_norm(u, t[N + "input_layernorm.weight"], eps)
    c, p0 = kmla.latent(a, w, eps), 0 if store is None else store.p0
    end = p0 + a.shape[0]
    if store is not None:
        store.latent[p0:end], store.index_in[p0:end] = c, a
        c, keys = store.latent[:end], store.index_in[:end]
    else:
        keys = a
    qr = kmla.q_resid(a, w, eps)
    sel = kdsa.indexer(keys, a, qr, torch.arange(p0, end, device=a.device), iw, d.num_heads, d.kpool, d.topk,
                       select_tail)
    y = u + kmla.mla_attention(qr, c, sel.mask, w, spec.mla.num_heads, spec.mla.qk_nope_head_dim)
    b = rms_norm(y, t[N + "post_attention_layernorm.weight"], eps)
    routing = route(spec.moe, t, N + "mlp.", b)
    z = y + moe(spec, t, N + "mlp.", b, routing)
    return z, rms_norm(z, t[N + "shared_head.norm.weight"], eps), routing, sel


class Glm5NextNDraft(ChainStore):
    """Device NextN draft bound to a glm5next target engine (its embedding and final norm; its head unless the
    NextN block ships shared_head.head)."""

    def __init__(self, spec: Glm5NextSpec, target: Glm5NextTarget, max_len: int, width: int = WIDTH):
        if spec.nextn_layers < 1:
            raise ValueError("this glm5next checkpoint ships no NextN layer (num_nextn_predict_layers 0)")
        if width < 1:
            raise ValueError(f"NextN width {width}: expected >= 1 drafts per window")
        self.spec, self.width, self.eps = spec, width, spec.layer.rms_eps
        self.device, self.dtype = target.device, target.dtype
        src = text_prefix(spec) + f"layers.{spec.num_layers}."
        self.t = {N + n[len(src):]: x.to(device=self.device, dtype=torch.float32 if n.endswith(F32_SUFFIXES)
                                         else self.dtype)
                  for n, x in spec.tensors.items() if n.startswith(src)}
        self.embed = target.embed
        self.head = self.t.get(N + "shared_head.head.weight", target.head)
        self.final_gain = target.final_norm
        self.select_tail = spec.dsa.select_tail
        self.cap, self.store_what = max_len + width + 2, "NextN"
        z = lambda *s: torch.zeros(*s, device=self.device, dtype=self.dtype)  # noqa: E731
        self.latent, self.index_in = z(self.cap, spec.mla.kv_lora_rank), z(self.cap, spec.hidden_size)
        self.routings: list[Routing] = []             # per pass since ``prompt``: the router's choice
        self.selections: list[kdsa.Selection] = []    # and the indexer's (scores, pools, tail, mask)
        self.next_slot, self.anchor_written = 1, False
        self.pend_e = self.pend_h = self.last_h = None

    def target_rows(self, taps: T) -> T:
        """The target rows the block reads, from taps [L+1, R, S, H]: rms(mean of the last layer's streams,
        model.norm) -> [R, H] (the rows that enter the target's head)."""
        return rms_norm(kmhc.mhc_head(taps[-1]), self.final_gain, self.eps).to(self.dtype)

    def _rows(self, e: T, h: T, slot0: int) -> tuple[T, T]:
        """Rows (e, h) [R, H] at slots slot0.. (NextN positions slot0-1..), written to the store -> (z, g)."""
        p0 = slot0 - 1
        if p0 + e.shape[0] > self.cap:
            raise ValueError(f"NextN store of {self.cap} positions is full (pass ends at {p0 + e.shape[0]})")
        z, g, routing, sel = block(self.t, self.spec, e, h, Store(self.latent, self.index_in, p0), self.select_tail)
        self.routings.append(routing)
        self.selections.append(sel)
        return z, g

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, S, H]: rows 0..P-2 (token j+1, hidden j) are real; hidden P-1 waits for the anchor."""
        self.routings, self.selections = [], []
        self.start(taps[0][1:, 0], self.target_rows(taps))

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows: their tokens and target rows join the queue (``ChainStore.queue``)."""
        self.queue(kept, taps[0][:, 0], self.target_rows(taps[:, :kept]))

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids ``width`` drafts; with ``detail`` the logits [width, V] and layer_out [1, width, H], z
        (before shared_head.norm) per drafted row."""
        e, h = self.real_rows(self.embed[anchor])
        z, g = self._rows(e, h, self.next_slot)                  # every row real: written for good
        self.written(e.shape[0])
        zs, gs = [z[-1:]], [g[-1:]]
        logits = [F.linear(gs[-1], self.head)]
        ids = [int(logits[-1].argmax(-1))]
        for i in range(1, self.width):                           # chained rows: transient slots
            z, g = self._rows(self.embed[ids[-1]][None], gs[-1], self.next_slot + i - 1)
            zs.append(z)
            gs.append(g)
            logits.append(F.linear(g, self.head))
            ids.append(int(logits[-1].argmax(-1)))
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(logits), torch.cat(zs)[None])

    def store_rows(self) -> tuple[T, T]:
        """Read-only views of the real rows, NextN positions 0..next_slot-2: (latent [R, kl], a [R, H])."""
        return self.latent[:self.next_slot - 1], self.index_in[:self.next_slot - 1]
