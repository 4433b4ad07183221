"""EAGLE-3 draft on the device (DRAFTERS.md section 5; the math is written out in ``reference.drafts.eagle3``).

Row q reads the token at q and the hidden of q-1, and predicts q+1:
    u_p = [taps[l_1][p] ; ... ; taps[l_n][p]] fc^T                the target feature at p (aux ids = tap indices)
    a   = [ rms(E(tok_q), input_layernorm) ; rms(h_{q-1}, hidden_norm) ]       EMBEDDING FIRST  [2H]
    y   = h_{q-1} (or its rms) + attn(a) Wo^T;  y = y + swiglu(rms(y, post_attention_layernorm))
    logits = rms(y, norm) lm_head^T  (draft vocab);  id = argmax + d2t[argmax]   (a target id)
Real rows read h = u (the target's); the K-1 chained rows of a window read h = y of the row before (the draft's
own output; rms(y, norm) with norm_output) and the token the row before drafted.

The draft keeps its own KV store by RoPE position, written and rolled back as ``chain_store.ChainStore``
says (real rows for good, chained rows transient; real rows read the target's features).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Eagle3Spec

from ..ops.mlp import swiglu
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope, rope_tables
from .chain_store import ChainStore
from .mtp import chained_attends

T = torch.Tensor
L0, A = "layers.0.", "layers.0.self_attn."
AttendFn = Callable[[T, T, T], T]


def aux_features(taps: T | list[T], layer_ids, fc: T) -> T:
    """taps: L+1 tensors [..., H] (taps[l] = the hidden state entering target layer l) -> u [..., H]."""
    return F.linear(torch.cat([taps[l] for l in layer_ids], dim=-1), fc)


def concat_inputs(e: T, h: T) -> T:
    """The q/k/v input: the normed embedding FIRST, then the normed hidden."""
    return torch.cat([e, h], dim=-1)


def chain_hidden(spec: Eagle3Spec, y: T, n: T) -> T:
    """What the next chained row reads as its hidden: the layer output y (rms(y, norm) with norm_output)."""
    return n if spec.norm_output else y


def _heads(x: T, w: T, norm: T | None, heads: int, spec: Eagle3Spec, cos: T, sin: T, rotate: bool = True) -> T:
    """x [N, R, 2H] -> [N, heads, R, d]: projected, normed per head (Qwen3 layer), rotated."""
    n, r, _ = x.shape
    s = spec.layer
    y = F.linear(x, w).view(n, r, heads, s.head_dim)
    if norm is not None:
        y = rms_norm(y, norm, s.rms_eps)
    y = y.transpose(1, 2)
    return apply_rope(y, cos, sin) if rotate else y


def eagle3_layer(t: Mapping[str, T], spec: Eagle3Spec, e: T, h: T, cos: T, sin: T, attend_kv: AttendFn) -> T:
    """The draft layer on rows (e = E(tok_q), h = h_{q-1}) [N, R, H]; ``attend_kv(q, k, v)`` owns the keys."""
    s = spec.layer
    hn = rms_norm(h, t[L0 + "hidden_norm.weight"], s.rms_eps)
    a = concat_inputs(rms_norm(e, t[L0 + "input_layernorm.weight"], s.rms_eps), hn)
    qn, kn = (t.get(A + "q_norm.weight"), t.get(A + "k_norm.weight")) if spec.qk_norm else (None, None)
    q = _heads(a, t[A + "q_proj.weight"], qn, s.num_heads, spec, cos, sin)
    k = _heads(a, t[A + "k_proj.weight"], kn, s.num_kv_heads, spec, cos, sin)
    v = _heads(a, t[A + "v_proj.weight"], None, s.num_kv_heads, spec, cos, sin, rotate=False)
    y = (hn if spec.norm_before_residual else h) + F.linear(attend_kv(q, k, v), t[A + "o_proj.weight"])
    m = rms_norm(y, t[L0 + "post_attention_layernorm.weight"], s.rms_eps)
    return y + swiglu(m, t[L0 + "mlp.gate_proj.weight"], t[L0 + "mlp.up_proj.weight"], t[L0 + "mlp.down_proj.weight"])


def draft_head(t: Mapping[str, T], spec: Eagle3Spec, y: T) -> tuple[T, T]:
    """(n, logits): n = rms(y, norm), logits = n lm_head^T over the draft vocab."""
    n = rms_norm(y, t["norm.weight"], spec.layer.rms_eps)
    return n, F.linear(n, t["lm_head.weight"])


@dataclass
class Proposal:
    ids: list[int]                              # ``width`` drafts, target ids
    logits: T | None = None                     # [width, Vd] when asked (draft vocab)
    layer_out: T | None = None                  # [1, width, H]: the draft layer's output per drafted row
    draft_ids: list[int] | None = None          # [width] argmax in the draft vocab, when asked


class Eagle3Draft(ChainStore):
    """Device EAGLE-3 draft bound to a target engine (shares its embedding; its own fc, layer, norm and head)."""

    def __init__(self, spec: Eagle3Spec, target, max_len: int, width: int | None = None):
        width = spec.speculative_tokens if width is None else width
        if width < 1:
            raise ValueError(f"EAGLE-3 width {width}: expected >= 1 drafts per window")
        self.spec, self.width = spec, width
        self.device, self.dtype = target.device, target.dtype
        self.t = {n: x.to(device=self.device, dtype=self.dtype) for n, x in spec.tensors.items()}
        self.embed = target.embed
        self.to_target = spec.target_ids().to(self.device)
        s = spec.layer
        self.init_store(s.num_kv_heads, s.head_dim, max_len + width + 2, self.device, self.dtype, "EAGLE-3")
        self.cos, self.sin = rope_tables(s.head_dim, s.rope_theta, self.cap, self.device, s.rope_scaling)

    def features(self, taps: T) -> T:
        return aux_features(taps, self.spec.aux_layer_ids, self.t["fc.weight"])

    def chain_input(self, y: T, n: T) -> T:
        """The hidden the next chained row reads: this row's own output (never the target's hidden rows)."""
        return chain_hidden(self.spec, y, n)

    def _rows(self, e: T, h: T, slot0: int) -> tuple[T, T, T]:
        """Rows (e_q, h_q) [R, H] at slots slot0..slot0+R-1, written to the store -> (y, n, logits)."""
        r = e.shape[0]
        cos, sin = self.cos[slot0:slot0 + r], self.sin[slot0:slot0 + r]
        y = eagle3_layer(self.t, self.spec, e[None], h[None], cos, sin, self.attend_at(slot0, r))[0]
        n, logits = draft_head(self.t, self.spec, y)
        return y, n, logits

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, H]: rows 1..P-1 (token q, feature q-1) are real; feature P-1 waits for the anchor."""
        self.start(taps[0][1:], self.features(taps))

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows: their tokens and target features join the queue (``queue``); they replace
        the chain's entries."""
        self.queue(kept, taps[0], self.features(taps[:, :kept]))

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        e, h = self.real_rows(self.embed[anchor])
        y, n, logits = self._rows(e, h, self.next_slot)           # every row real: written for good
        self.written(e.shape[0])
        ys, ls = [y[-1:]], [logits[-1:]]
        draft_ids = [int(ls[-1].argmax(-1))]
        ids = [int(self.to_target[draft_ids[-1]])]
        hidden = self.chain_input(y[-1:], n[-1:])
        for i in range(1, self.width):                             # chained rows: transient slots
            y, n, logits = self._rows(self.embed[ids[-1]][None], hidden, self.next_slot + i - 1)
            ys.append(y)
            ls.append(logits)
            draft_ids.append(int(logits.argmax(-1)))
            ids.append(int(self.to_target[draft_ids[-1]]))
            hidden = self.chain_input(y, n)
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(ls), torch.cat(ys)[None], draft_ids)


def forward_train(params: Mapping[str, T], spec: Eagle3Spec, taps: list[T], ids: T, steps: int) -> list[T]:
    """Differentiable training-time test over teacher-forced sequences. ``params``: the draft tensors plus the
    target's model.embed_tokens.weight; taps: L+1 tensors [N, T, H] (the target's, over ids [N, T]). Returns
    ``steps`` logits tensors [N, T-1, Vd]; entry s-1, row i (position q = i+1) is step s of the chain anchored at
    q-s+1 (valid for q >= s), which predicts the token at q+1.

    Step 1 reads (ids[q], u[q-1]); step s > 1 reads (ids[q], the chain hidden of step s-1 at q-1), as chained
    drafts do at inference after s-1 accepted drafts (speculators' ttt steps, its tokens from the sequence)."""
    s = spec.layer
    n, tl = ids.shape
    cos, sin = rope_tables(s.head_dim, s.rope_theta, tl, ids.device, s.rope_scaling)
    cos, sin = cos[1:], sin[1:]
    e = F.embedding(ids[:, 1:], params["model.embed_tokens.weight"])
    h = aux_features(taps, spec.aux_layer_ids, params["fc.weight"])[:, :-1]
    out = []
    for chained in chained_attends(tl - 1, steps, ids.device):
        y = eagle3_layer(params, spec, e, h, cos, sin, chained)
        nrm, logits = draft_head(params, spec, y)
        out.append(logits)
        h = F.pad(chain_hidden(spec, y, nrm)[:, :-1], (0, 0, 1, 0))     # step s+1 at q reads step s at q-1
    return out
