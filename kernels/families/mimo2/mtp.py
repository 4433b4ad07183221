"""The 3-layer MTP head of a mimo2 (MiMo-V2-Flash) target on the device; the math is in
``reference.families.mimo2.mtp`` (layer k = chain step k+1, its own SWA attention over its own rows).

State, all indexed by position (slot = position): the committed tokens' embedding rows E [cap, H], the target's
hidden rows X [cap, H] (post- or pre-final-norm per ``hidden``), and per layer k a KV store k/v [1, nkv, cap, d|dv]
and its recycled output G_k [cap, H]. ``real_end[k]``: the first position whose layer-k row is not yet written for
good. A window with anchor a at position A (= the committed count):

    layer k runs rows real_end[k] .. A+k: rows <= A are real (every input a committed token and a real hidden row,
    written for good: real_end[k] = A+1), rows A+1..A+k read the drafts d_1..d_k (chained: transient, the next
    window's real rows overwrite them, which is the rollback); d_{k+1} = argmax head(final_layernorm(row A+k)).

``accept`` only records the kept rows' embeddings and hidden rows; a window run plain (no ``propose``) still
``accept``s, and the next ``propose`` writes every real row behind it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Mimo2MTPSpec, Mimo2Spec

from ...drafts.proposal import Proposal
from ...ops.attention import sink_attention
from ...ops.mlp import swiglu
from ...ops.norm import rms_norm
from .model import Mimo2Target, attention_mixer, tables, window_mask

T = torch.Tensor
P = "model.mtp.layers."
HIDDEN = ("post", "pre")


def mtp_layer(spec: Mimo2MTPSpec, t: Mapping[str, T], k: int, e: T, h: T, cos: T, sin: T, attend_kv) -> tuple[T, T]:
    """Layer k on rows (e, h) [N, R, H] -> (y, g = final_layernorm(y)) [N, R, H]."""
    p, eps = f"{P}{k}.", spec.rms_eps
    u = F.linear(torch.cat([rms_norm(e, t[p + "enorm.weight"], eps), rms_norm(h, t[p + "hnorm.weight"], eps)], -1),
                 t[p + "eh_proj.weight"])
    a = rms_norm(u, t[p + "input_layernorm.weight"], eps)
    y = u + attention_mixer(spec.attn, spec.value_scale, t, p + "self_attn.", a, cos, sin, attend_kv)
    m = rms_norm(y, t[p + "pre_mlp_layernorm.weight"], eps)
    y = y + swiglu(m, t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"])
    return y, rms_norm(y, t[p + "final_layernorm.weight"], eps)


class Mimo2MTPDraft:
    """Device MTP draft bound to a mimo2 target engine (its embedding, final norm and head)."""

    def __init__(self, spec: Mimo2MTPSpec, target: Mimo2Target, max_len: int, hidden: str | None = None):
        hidden = spec.hidden if hidden is None else hidden
        if hidden not in HIDDEN:
            raise ValueError(f"MTP hidden {hidden!r}: expected one of {HIDDEN}")
        self.spec, self.hidden, self.width = spec, hidden, spec.num_layers
        self.run_spec = replace(spec, hidden=hidden)          # what the gate's checks and state reference read
        self.device, self.dtype = target.device, target.dtype
        self.t = {n: x.to(device=self.device, dtype=self.dtype) for n, x in spec.tensors.items()}
        self.embed, self.head, self.final_gain = target.embed, target.head, target.final_norm
        self.eps = spec.rms_eps
        a, H = spec.attn, spec.hidden_size
        self.cap = max_len + self.width + 2
        z = lambda *s: torch.zeros(*s, device=self.device, dtype=self.dtype)  # noqa: E731
        self.k = [z(1, a.num_kv_heads, self.cap, a.head_dim) for _ in range(self.width)]
        self.v = [z(1, a.num_kv_heads, self.cap, a.v_head_dim) for _ in range(self.width)]
        self.g = [z(self.cap, H) for _ in range(self.width)]
        self.e, self.x = z(self.cap, H), z(self.cap, H)
        self.cos, self.sin = tables(a, self.cap, self.device)
        self.key_pos = torch.arange(self.cap, device=self.device)
        self.committed, self.real_end = 0, [k + 1 for k in range(self.width)]

    def target_rows(self, taps: T) -> T:
        """The target hidden rows the head reads, from taps [L+1, R, H]: post-final-norm or the last layer's out."""
        return rms_norm(taps[-1], self.final_gain, self.eps) if self.hidden == "post" else taps[-1]

    def prompt(self, taps: T) -> None:
        n = taps.shape[1]
        self.e[:n], self.x[:n] = taps[0], self.target_rows(taps)
        self.committed, self.real_end = n, [k + 1 for k in range(self.width)]

    def accept(self, kept: int, taps: T) -> None:
        c = self.committed
        if c + kept > self.cap:
            raise ValueError(f"MTP store of {self.cap} positions is full (window ends at {c + kept})")
        self.e[c:c + kept], self.x[c:c + kept] = taps[0][:kept], self.target_rows(taps[:, :kept])
        self.committed += kept

    def chain_source(self, k: int) -> T:
        """The hidden rows layer k reads (by position): the target's for layer 0, layer k-1's recycled output after."""
        return self.x if k == 0 else self.g[k - 1]

    def _attend(self, k: int, q0: int, r: int):
        pos = torch.arange(q0, q0 + r, device=self.device)
        allowed = window_mask(pos, self.key_pos, self.spec.attn.window) & (self.key_pos[None, :] >= k + 1)

        def cached(q, kk, vv, z):
            self.k[k][:, :, q0:q0 + r], self.v[k][:, :, q0:q0 + r] = kk, vv
            return sink_attention(q, self.k[k], self.v[k], allowed, z)
        return cached

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids one draft per MTP layer; with ``detail`` the logits [K, V] and layer_out [1, K, H],
        layer k's row A+k before final_layernorm."""
        a = self.committed
        if a + self.width + 1 > self.cap:
            raise ValueError(f"MTP store of {self.cap} positions is full (window ends at {a + self.width + 1})")
        self.e[a] = self.embed[anchor]
        ids, ys, logits = [], [], []
        for k in range(self.width):
            q0, q1 = self.real_end[k], a + k                        # rows q0..q1; q1 > a read the drafts
            e, h = self.e[q0:q1 + 1][None], self.chain_source(k)[q0 - 1:q1][None]
            y, g = mtp_layer(self.spec, self.t, k, e, h, self.cos[q0:q1 + 1], self.sin[q0:q1 + 1],
                             self._attend(k, q0, q1 - q0 + 1))
            self.g[k][q0:q1 + 1] = (g if self.hidden == "post" else y)[0]
            self.real_end[k] = a + 1
            logits.append(F.linear(g[0, -1:], self.head))
            ids.append(int(logits[-1].argmax(-1)))
            ys.append(y[0, -1:])
            if k + 1 < self.width:
                self.e[a + k + 1] = self.embed[ids[-1]]              # transient: overwritten by accept
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(logits), torch.cat(ys)[None])

    def store_rows(self, k: int) -> tuple[T, T]:
        """Read-only views of layer k's real rows, positions k+1..real_end[k]-1: (k after RoPE [nkv, R, d],
        v after the value scale [nkv, R, dv])."""
        return self.k[k][0, :, k + 1:self.real_end[k]], self.v[k][0, :, k + 1:self.real_end[k]]


def forward_train(mparams: Mapping[str, T], mspec: Mimo2MTPSpec, tspec: Mimo2Spec, hidden: T, ids: T,
                  hidden_mode: str = "post") -> list[T]:
    """Differentiable teacher-forced chain. ``mparams``: the model.mtp.* tensors plus the target's
    model.embed_tokens.weight and lm_head.weight; hidden [N, T, H] the target's rows (post or pre) over ids
    [N, T]. Returns per layer k the logits [N, T-1-k, V]; row i is position q = i+k+1 and predicts ids[:, q+1]
    (valid where q+1 < T)."""
    n, tl = ids.shape
    cos, sin = tables(mspec.attn, tl, ids.device)
    emb = F.embedding(ids, mparams["model.embed_tokens.weight"])
    head = mparams["model.embed_tokens.weight" if tspec.tie_word_embeddings else "lm_head.weight"]
    x, out = hidden[:, :-1], []
    for k in range(mspec.num_layers):
        r = min(x.shape[1], tl - 1 - k)
        pos = torch.arange(k + 1, k + 1 + r, device=ids.device)
        allowed = window_mask(pos, pos, mspec.attn.window)

        def own_rows(q, kk, vv, z, allowed=allowed):
            return sink_attention(q, kk, vv, allowed, z)

        y, g = mtp_layer(mspec, mparams, k, emb[:, k + 1:k + 1 + r], x[:, :r], cos[k + 1:k + 1 + r],
                         sin[k + 1:k + 1 + r], own_rows)
        out.append(F.linear(g, head))
        x = g if hidden_mode == "post" else y
    return out
