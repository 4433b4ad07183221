"""DFlash2 block drafter, float64 host reference (DRAFTERS.md section 3). No cache: one call = one block.

The DFlash backbone (``reference.drafts.dflash``: context features u [s, H] from the target's taps,
block rows y = [x_s, m, ..., m] at positions s..s+B-1, the TARGET's embedding and head) with the grouped
dynamic depthwise conv (``reference.ops.dynamic_conv``) on both sides of each sublayer:

    h  = E(y) * input_embedding_scale                                         [B, H]
    per layer:  a  = rms(h, input_layernorm) ;  da = a W_kp_attn^T  -> [B, 2, T, G]
                a0 = Conv^0(a ; da)
                Q = q_norm(a0 Wq^T),  K = k_norm([u ; a0] Wk^T),  V = [u ; a0] Wv^T     (context K/V unchanged)
                h  = h + Conv^1( softmax(Q K^T / sqrt(d)) V Wo^T ; da )               NO mask
                m  = rms(h, post_attention_layernorm) ;  dm = m W_kp_mlp^T
                h  = h + Conv^1'( MLP( Conv^0'(m ; dm) ) ; dm )
    final = rms(h, norm) ;  rows 1..B-1 (row i predicts the token at s+i)
    l = head(final[1:]) * output_multiplier (softcapped) -> the selector (``reference.ops.selector``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import DFlash2Spec, ModelSpec

from ..families.qwen3.model import RefOut, embed, head, mlp, self_attention
from ..ops.dynamic_conv import conv_delta, dynamic_conv
from ..ops.norm import rms_norm
from ..ops.selector import scaled_logits, select
from ..rounding import linear, st
from ..weights import as_f64
from ..xp import ns
from .dflash import context_features

SELECTOR = "candidate_selector."


@dataclass(frozen=True)
class DraftRefOut:
    """One block. logits [B-1, V] (multiplied / softcapped; row i predicts s+1+i); layer_out
    [n_layers, B, H]; ids [B-1] = the walked path; u [s, H]; final [B, H]; g [B-1, r] = W_hp final[1:];
    cand / unary [B-1, K] the top-K per slot; scores [B-1, K, K] S_j[p, c]; idx [B-1] the walked c."""

    logits: np.ndarray
    layer_out: np.ndarray
    ids: np.ndarray
    u: np.ndarray
    final: np.ndarray
    g: np.ndarray
    cand: np.ndarray
    unary: np.ndarray
    scores: np.ndarray
    idx: np.ndarray


def conv_layer(draft: DFlash2Spec, w, prefix: str, h: np.ndarray, u: np.ndarray, pos_q: np.ndarray,
               pos_kv: np.ndarray) -> np.ndarray:
    """One DFlash2 layer over the block rows h [B, H] with context features u [s, H]."""
    shape, t, xp = draft.layer, draft.conv_kernel_size, ns(h)
    mask = xp.ones((len(h), len(u) + len(h)), dtype=bool)
    ac, mc = prefix + "attention_conv.", prefix + "mlp_conv."
    a = rms_norm(h, w[prefix + "input_layernorm.weight"], shape.rms_eps)
    da = conv_delta(a, w[ac + "kernel_projection.weight"], t)
    a0 = dynamic_conv(a, da, w[ac + "base_kernel"], 0)
    o = self_attention(shape, w, prefix + "self_attn.", a0, xp.concatenate([u, a0], axis=0), pos_q, pos_kv, mask)
    h = st(h + dynamic_conv(o, da, w[ac + "base_kernel"], 1))
    m = rms_norm(h, w[prefix + "post_attention_layernorm.weight"], shape.rms_eps)
    dm = conv_delta(m, w[mc + "kernel_projection.weight"], t)
    y = mlp(w, prefix + "mlp.", dynamic_conv(m, dm, w[mc + "base_kernel"], 0))
    return st(h + dynamic_conv(y, dm, w[mc + "base_kernel"], 1))


def forward(draft: DFlash2Spec, target: ModelSpec, taps: RefOut, anchor_id: int,
            s: int | None = None) -> DraftRefOut:
    """Draft one block after context positions 0..s-1 (s defaults to all rows of ``taps``).

    taps: a target ``RefOut`` over at least s ids; anchor_id: x_s, the last id the target emitted.
    """
    t = taps.hidden.shape[1]
    s = t if s is None else s
    if not 1 <= s <= t:
        raise ValueError(f"context length s={s} must be in 1..{t} (rows in taps)")
    w, b = as_f64(draft), draft.block_size
    u = context_features(draft, taps, s)
    h = embed(target, [anchor_id] + [draft.mask_token_id] * (b - 1)) * draft.input_embedding_scale
    xp = ns(h)
    pos_q, pos_kv = xp.arange(s, s + b), xp.arange(s + b)
    layer_out = []
    for i in range(draft.num_layers):
        h = conv_layer(draft, w, f"layers.{i}.", h, u, pos_q, pos_kv)
        layer_out.append(h)
    final = rms_norm(h, w["norm.weight"], draft.layer.rms_eps)
    logits = scaled_logits(head(target, final[1:]), draft.output_multiplier, draft.final_logit_softcapping)
    g = linear(final[1:], w[SELECTOR + "hidden_projection.weight"])
    sel = select(logits, g, anchor_id, w[SELECTOR + "predecessor_codebook"], w[SELECTOR + "successor_codebook"],
                 draft.selector_top_k)
    return DraftRefOut(logits=logits, layer_out=xp.stack(layer_out), ids=sel.ids, u=u, final=final, g=g,
                       cand=sel.cand, unary=sel.unary, scores=sel.scores, idx=sel.idx)
