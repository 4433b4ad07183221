"""MTP / NextN draft of a qwen38 (Qwen3.5/3.8) target on the device (DRAFTERS.md section 1; the math is
written out in ``reference.drafts.mtp``).

Row j reads the token at position j and the target's POST-final-norm hidden h_{j-1} and predicts j+1:
    u = fc( [ n(E(tok_j), pre_fc_norm_embedding) ; n(h_{j-1}, pre_fc_norm_hidden) ] )   EMBEDDING FIRST
    y = the trunk's gated full-attention layer on u (weights mtp.layers.0.*), RoPE position j
    g = n(y, mtp.norm);  logits = head(g)                 n(x, w) = rms(x) * (1 + w), the target's head
Chained drafts feed g back as the hidden with E(drafted id): widths 1..4 (any width >= 1 runs).

The draft keeps its own KV store by RoPE position, written and rolled back as ``chain_store.ChainStore``
says (real rows for good, chained rows transient).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import MTPSpec, Qwen38Spec

from ..families.ffn import ffn_for
from ..families.qwen38.model import Qwen38Target, attention_mixer, norm_gain
from ..ops.attention import attend
from ..ops.norm import rms_norm
from ..ops.rope import rope_tables
from .chain_store import ChainStore
from .proposal import Proposal

T = torch.Tensor
P, L0 = "mtp.", "mtp.layers.0."
DEFAULT_WIDTH = 3


def target_hidden(taps: T, final_gain: T, eps: float) -> T:
    """The target's post-final-norm rows (the head's input) from its taps [L+1, R, H] -> [R, H]."""
    return rms_norm(taps[-1], final_gain, eps)


def concat_inputs(e: T, h: T) -> T:
    """The fc input: normed embedding FIRST, then the normed hidden."""
    return torch.cat([e, h], dim=-1)


def mtp_layer(t: Mapping[str, T], tspec: Qwen38Spec, u: T, cos: T, sin: T, attend_kv, train: bool = False) -> T:
    """The MTP decoder layer on rows u [N, R, H] (the trunk's full-attention layer, mtp.layers.0 weights; its FFN
    the trunk's kind, ``ffn.ffn_for``: dense, or the MoE of a qwen35moe target)."""
    eps = tspec.layer.rms_eps
    a = rms_norm(u, norm_gain(t[L0 + "input_layernorm.weight"]), eps)
    y = u + attention_mixer(tspec, t, L0 + "self_attn.", a, cos, sin, attend_kv)
    m = rms_norm(y, norm_gain(t[L0 + "post_attention_layernorm.weight"]), eps)
    return y + ffn_for(tspec, train)(tspec, t, L0, m)


def mtp_in(t: Mapping[str, T], e: T, h: T, eps: float) -> T:
    """u = fc(concat(n(e, pre_fc_norm_embedding), n(h, pre_fc_norm_hidden)))."""
    x = concat_inputs(rms_norm(e, norm_gain(t[P + "pre_fc_norm_embedding.weight"]), eps),
                      rms_norm(h, norm_gain(t[P + "pre_fc_norm_hidden.weight"]), eps))
    return F.linear(x, t[P + "fc.weight"])


class MTPDraft(ChainStore):
    """Device MTP draft bound to a qwen38 target engine (shares its embedding, final norm and head)."""

    def __init__(self, spec: MTPSpec, target: Qwen38Target, max_len: int, width: int = DEFAULT_WIDTH):
        if width < 1:
            raise ValueError(f"MTP width {width}: expected >= 1 drafts per window")
        self.spec, self.width, self.tspec = spec, width, target.spec
        self.device, self.dtype = target.device, target.dtype
        self.t = {n: x.to(device=self.device, dtype=self.dtype) for n, x in spec.tensors.items()}
        self.embed, self.head = target.embed, target.head
        self.final_gain, self.eps = target.final_norm, target.shape.rms_eps
        s = spec.layer
        self.init_store(s.num_kv_heads, s.head_dim, max_len + width + 2, self.device, self.dtype, "MTP")
        self.cos, self.sin = rope_tables(spec.rotary_dim, s.rope_theta, self.cap, self.device)

    def _rows(self, e: T, h: T, slot0: int) -> tuple[T, T]:
        """Rows (e_j, h_j) [R, H] at slots slot0..slot0+R-1, written to the store -> (y, g) [R, H]."""
        r = e.shape[0]
        u = mtp_in(self.t, e, h, self.eps)[None]
        y = mtp_layer(self.t, self.tspec, u, self.cos[slot0:slot0 + r], self.sin[slot0:slot0 + r],
                      self.attend_at(slot0, r))[0]
        return y, rms_norm(y, norm_gain(self.t[P + "norm.weight"]), self.eps)

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, H]: rows 1..P-1 (token j, hidden j-1) are real; hidden P-1 waits for the anchor."""
        self.start(taps[0][1:], target_hidden(taps, self.final_gain, self.eps))

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows: their tokens and post-final-norm hidden rows join the queue (``queue``)."""
        self.queue(kept, taps[0], target_hidden(taps[:, :kept], self.final_gain, self.eps))

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids ``width`` drafts; with ``detail`` the logits [width, V] and layer_out [1, width, H], the
        MTP layer's output per drafted row."""
        e, h = self.real_rows(self.embed[anchor])
        y, g = self._rows(e, h, self.next_slot)                  # every row real: written for good
        self.written(e.shape[0])
        ys, gs = [y[-1:]], [g[-1:]]
        logits = [F.linear(gs[-1], self.head)]
        ids = [int(logits[-1].argmax(-1))]
        for i in range(1, self.width):                           # chained rows: transient slots
            y, g = self._rows(self.embed[ids[-1]][None], gs[-1], self.next_slot + i - 1)
            ys.append(y)
            gs.append(g)
            logits.append(F.linear(g, self.head))
            ids.append(int(logits[-1].argmax(-1)))
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(logits), torch.cat(ys)[None])


def chain_mask(r: int, s: int, device) -> T:
    """[R, s*R] keys of chain step s (1-based) over [step-1 rows ; ... ; step-s rows], row i = position i+1.

    Step s at position q continues the chain anchored at a = q-s+1: it sees the real rows at positions <= a
    and the chain's own rows (step s' at a+s'-1, s' = 2..s), exactly the keys the engine's store holds."""
    i = torch.arange(r, device=device)[:, None]
    j = torch.arange(r, device=device)[None, :]
    blocks = [j <= i - s + 1] + [j == i - (s - sp) for sp in range(2, s + 1)]
    return torch.cat(blocks, dim=1)


def chained_attends(r: int, steps: int, device) -> Iterator[Callable[[T, T, T], T]]:
    """The attention of chain steps s = 1..steps in teacher-forced training, one per iteration: each keeps its
    step's K / V [N, heads, R, d] beside the earlier steps' and attends over all of them under ``chain_mask(r, s)``
    (the keys the engine's store would hold at inference)."""
    keys: list[T] = []
    vals: list[T] = []
    for s in range(1, steps + 1):
        allowed = chain_mask(r, s, device)

        def chained(q: T, k: T, v: T, allowed: T = allowed) -> T:
            keys.append(k)
            vals.append(v)
            return attend(q, torch.cat(keys, 2), torch.cat(vals, 2), allowed)

        yield chained


def forward_train(mparams: Mapping[str, T], tspec: Qwen38Spec, final: T, ids: T, steps: int) -> list[T]:
    """Differentiable chained MTP over teacher-forced sequences. ``mparams``: the mtp.* tensors plus the target's
    model.embed_tokens.weight (and lm_head.weight when untied). final [N, T, H]: the target's post-final-norm
    rows over ids [N, T]. Returns ``steps`` logits tensors [N, T-1, V]; entry s-1, row i (position q = i+1) is
    the step-s draft of the chain anchored at q-s+1 (valid for q >= s), which predicts position q+1.

    Step 1 reads (ids[q], final[q-1]); step s > 1 reads (ids[q], g of step s-1 at q-1), as chained drafts do
    at inference after s-1 accepted drafts."""
    eps = tspec.layer.rms_eps
    n, tl, _ = final.shape
    r = tl - 1
    cos, sin = rope_tables(tspec.hybrid.rotary_dim, tspec.layer.rope_theta, tl, ids.device)
    cos, sin = cos[1:], sin[1:]
    e = F.embedding(ids[:, 1:], mparams["model.embed_tokens.weight"])
    h = final[:, :-1]
    head = mparams["model.embed_tokens.weight" if tspec.tie_word_embeddings else "lm_head.weight"]
    out = []
    for chained in chained_attends(r, steps, ids.device):
        y = mtp_layer(mparams, tspec, mtp_in(mparams, e, h, eps), cos, sin, chained, train=True)
        g = rms_norm(y, norm_gain(mparams[P + "norm.weight"]), eps)
        out.append(F.linear(g, head))
        h = F.pad(g[:, :-1], (0, 0, 1, 0))              # step s+1 at q reads g of step s at q-1
    return out
