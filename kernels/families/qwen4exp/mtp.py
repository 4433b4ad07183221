"""The MTP head of a qwen4exp (Qwen3.8-Flash-Next) target on the device; the math (shapes, names) is written out in
``reference.families.qwen4exp.mtp`` (docs/FAMILIES_MOE.md section 6 "Math").

Row j reads the token at j and the target's 4 RAW hyper-connection streams of position j-1 (``target_streams``: the
last layer's output taps[L] [R, S*H], not their mean, not the mixer's normed streams) and predicts j+1:

    u_s = eh_proj([n(E(tok_j), enorm) ; n(x_{j-1, s}, hnorm_s)])        per stream s, EMBEDDING FIRST   [S*H]
    y   = HC-wrapped dense gated attention, then HC-wrapped MoE (``ops.gated_hc`` around the trunk's blocks)
    f   = hc_head(y) (the head's own mixer collapse);  logits = head(f)                the target's head
Chained drafts feed y (the head's own raw output streams) back with E(drafted id).

The draft keeps its own KV store by RoPE position (``drafts.chain_store.ChainStore``: real rows written for good,
chained rows transient, so a reject rolls back by overwriting them).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Qwen4ExpMTPSpec, Qwen4ExpSpec

from ...drafts.chain_store import ChainStore
from ...drafts.mtp import chained_attends
from ...drafts.proposal import Proposal
from ...ops import gated_hc as hc
from ...ops.rope import rope_tables
from ..ffn import ffn_for
from ..qwen38.model import attention_mixer
from .model import Qwen4ExpTarget

T = torch.Tensor
P, L0 = "mtp.", "mtp.layers.0."
MIXER = P + "hyper_connection_mixer."
WIDTH = 3


def target_streams(taps: T) -> T:
    """The rows the head reads as the target hidden: the last layer's raw streams taps[L] [R, S*H]."""
    return taps[-1]


def _residual(t: Mapping[str, T], pre: str, x: T, streams: int, eps: float, inject: bool = True) -> hc.HcIn:
    return hc.gated_residual(x, t[pre + "hc_norm.weight"], t[pre + "input_mix_weight_down.weight"],
                             t[pre + "input_mix_weight_up.weight"],
                             t[pre + "block_inject_weight.weight"] if inject else None, streams, eps)


def mtp_in(t: Mapping[str, T], e: T, x: T, streams: int, eps: float) -> T:
    """u [..., S*H] from embedding rows e [..., H] and the hidden streams x [..., S*H] (per stream eh_proj)."""
    h = e.shape[-1]
    en = hc.grouped_norm(e, t[P + "pre_fc_norm_embedding.weight"], h, eps)
    xn = hc.grouped_norm(x, t[P + "pre_fc_norm_hidden.weight"], h, eps).unflatten(-1, (streams, h))
    cat = torch.cat([en.unsqueeze(-2).expand(xn.shape), xn], -1)                        # [..., S, 2H]
    eh = torch.cat([t[P + "fc_embedding.weight"], t[P + "fc_hidden.weight"]], 1)          # [H, 2H]
    return F.linear(cat, eh).flatten(-2)


def mtp_block(t: Mapping[str, T], tspec: Qwen4ExpSpec, u: T, cos: T, sin: T, attend_kv, train: bool = False) -> T:
    """The head's block on rows u [N, R, S*H] -> output streams [N, R, S*H]."""
    s, eps = tspec.hc.count, tspec.layer.rms_eps
    a = _residual(t, L0 + "attn_hyper_connection.", u, s, eps)
    u = hc.hc_inject(u, attention_mixer(tspec, t, L0 + "self_attn.", a.block_in, cos, sin, attend_kv), a.inject)
    m = _residual(t, L0 + "mlp_hyper_connection.", u, s, eps)
    return hc.hc_inject(u, ffn_for(tspec, train)(tspec, t, L0, m.block_in), m.inject)


def collapse(t: Mapping[str, T], tspec: Qwen4ExpSpec, y: T) -> T:
    """nextn.hc_head: streams y [..., S*H] -> [..., H]."""
    return _residual(t, MIXER, y, tspec.hc.count, tspec.layer.rms_eps, inject=False).block_in


class Qwen4ExpMTPDraft(ChainStore):
    """Device MTP draft bound to a qwen4exp target engine (its embedding and head)."""

    def __init__(self, spec: Qwen4ExpMTPSpec, target: Qwen4ExpTarget, max_len: int, width: int = WIDTH):
        if width < 1:
            raise ValueError(f"MTP width {width}: expected >= 1 drafts per window")
        self.spec, self.width, self.tspec = spec, width, target.spec
        self.device, self.dtype = target.device, target.dtype
        self.t = {n: x.to(device=self.device, dtype=self.dtype) for n, x in spec.tensors.items()}
        self.embed, self.head = target.embed, target.head
        self.eps, self.streams, self.h = target.shape.rms_eps, spec.hc.count, spec.layer.hidden_size
        s = spec.layer
        self.init_store(s.num_kv_heads, s.head_dim, max_len + width + 2, self.device, self.dtype, "MTP")
        self.cos, self.sin = rope_tables(spec.rotary_dim, s.rope_theta, self.cap, self.device)

    def _rows(self, e: T, x: T, slot0: int) -> tuple[T, T]:
        """Rows (e_j [R, H], x_j [R, S*H]) at slots slot0.. written to the store -> (y [R, S*H], f [R, H])."""
        r = e.shape[0]
        u = mtp_in(self.t, e, x, self.streams, self.eps)[None]
        y = mtp_block(self.t, self.tspec, u, self.cos[slot0:slot0 + r], self.sin[slot0:slot0 + r],
                      self.attend_at(slot0, r))[0]
        return y, collapse(self.t, self.tspec, y)

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, S*H]: rows 1..P-1 (token j, streams j-1) are real; streams P-1 wait for the anchor."""
        self.start(taps[0][1:, :self.h], target_streams(taps))

    def accept(self, kept: int, taps: T) -> None:
        self.queue(kept, taps[0][:, :self.h], target_streams(taps[:, :kept]))

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids ``width`` drafts; with ``detail`` the logits [width, V] and layer_out [1, width, S*H],
        the head's output streams per drafted row."""
        e, x = self.real_rows(self.embed[anchor])
        y, f = self._rows(e, x, self.next_slot)                  # every row real: written for good
        self.written(e.shape[0])
        ys = [y[-1:]]
        logits = [F.linear(f[-1:], self.head)]
        ids = [int(logits[-1].argmax(-1))]
        for i in range(1, self.width):                           # chained rows: transient slots
            y, f = self._rows(self.embed[ids[-1]][None], ys[-1], self.next_slot + i - 1)
            ys.append(y)
            logits.append(F.linear(f, self.head))
            ids.append(int(logits[-1].argmax(-1)))
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(logits), torch.cat(ys)[None])


def forward_train(mparams: Mapping[str, T], tspec: Qwen4ExpSpec, streams: T, ids: T, steps: int) -> list[T]:
    """Differentiable chained head over teacher-forced sequences. ``mparams``: the mtp.* tensors plus the target's
    model.embed_tokens.weight (and lm_head.weight when untied); streams [N, T, S*H] the target's last-layer streams
    over ids [N, T]. Returns ``steps`` logits [N, T-1, V]; entry s-1, row i (position q = i+1) is the step-s draft
    of the chain anchored at q-s+1 (valid for q >= s), which predicts position q+1 (``drafts.mtp.chain_mask``)."""
    s, eps = tspec.hc.count, tspec.layer.rms_eps
    r = ids.shape[1] - 1
    cos, sin = rope_tables(tspec.hybrid.rotary_dim, tspec.layer.rope_theta, r + 1, ids.device)
    cos, sin = cos[1:], sin[1:]
    e = F.embedding(ids[:, 1:], mparams["model.embed_tokens.weight"])
    x = streams[:, :-1]
    head = mparams["model.embed_tokens.weight" if tspec.tie_word_embeddings else "lm_head.weight"]
    out = []
    for chained in chained_attends(r, steps, ids.device):
        y = mtp_block(mparams, tspec, mtp_in(mparams, e, x, s, eps), cos, sin, chained, train=True)
        out.append(F.linear(collapse(mparams, tspec, y), head))
        x = F.pad(y[:, :-1], (0, 0, 1, 0))              # step s+1 at q reads y of step s at q-1
    return out
