"""MTP / NextN head of a qwen38 (Qwen3.5/3.8) target, float64 host reference (DRAFTERS.md section 1).

No cache: every call runs all of its rows. A row j of the MTP layer reads the token at position j and
the target's POST-final-norm hidden at j-1 (the rows that enter the LM head), and predicts j+1:

    n(x, w)  = x / sqrt(mean(x^2) + eps) * (1 + w)          every norm here is zero-centred
    u_j = [ n(E(tok_j), pre_fc_norm_embedding) ; n(h_{j-1}, pre_fc_norm_hidden) ] fc^T   EMBEDDING FIRST
    one gated full-attention layer (the trunk's full-attention type), rows at RoPE positions j, causal:
        a = n(u, input_layernorm)
        [q | gate] per head = a Wq^T  ([T, nh, 2d]: the first d channels the query, the next d the gate)
        q = n_head(q, q_norm), k = n_head(a Wk^T, k_norm), v = a Wv^T
        rotate the first rotary_dim channels of each q/k head (rotate-half within them), the rest pass
        o = softmax(q k^T / sqrt(d) + causal) v * sigmoid(gate)          ->  y = u + o Wo^T
        y = y + swiglu(n(y, post_attention_layernorm))
    g_j = n(y_j, mtp.norm);  logits_j = g_j head^T                      the TARGET's head

Chained drafts: the row after the last real one reads (d_i, g) where d_i is the previous row's draft
and g its normed output; a chained row attends to every row before it (real and chained).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import MTPSpec, Qwen38Spec

from ..families.ffn import ffn_for
from ..families.qwen3.model import embed_rows, head
from ..families.qwen38.model import gated_attention, norm1p, project_kv
from ..ops.attention import causal_mask
from ..ops.moe import at_layer
from ..rounding import linear, st
from ..weights import as_f64
from ..xp import here, ns

P = "mtp."
L0 = "mtp.layers.0."


@dataclass(frozen=True)
class MTPRefOut:
    """Per row: layer_out [R, H] (the MTP layer's output before mtp.norm), g [R, H] (after it),
    logits [R, V], ids [R] = argmax (lowest index on ties)."""

    layer_out: np.ndarray
    g: np.ndarray
    logits: np.ndarray
    ids: np.ndarray


def mtp_input(mtp: MTPSpec, emb: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """u = fc([n(emb, pre_fc_norm_embedding) ; n(hidden, pre_fc_norm_hidden)]): [R, H] each -> [R, H]."""
    w, eps = as_f64(mtp), mtp.layer.rms_eps
    e = norm1p(emb, w[P + "pre_fc_norm_embedding.weight"], eps)
    x = ns(e).concatenate([e, norm1p(hidden, w[P + "pre_fc_norm_hidden.weight"], eps)], axis=-1)
    return linear(x, w[P + "fc.weight"])


def layer(mtp: MTPSpec, target: Qwen38Spec, u: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The MTP decoder layer over rows u [R, H] at ``positions``, causal among the rows: the trunk's
    full-attention layer (the target's shape: heads, head_dim, rotary_dim) on the mtp.layers.0 weights."""
    w, eps = as_f64(mtp), mtp.layer.rms_eps
    a = norm1p(u, w[L0 + "input_layernorm.weight"], eps)
    y = st(u + gated_attention(target, w, L0 + "self_attn.", a, positions, causal_mask(len(u), ns(a))))
    return st(y + ffn_for(target)(target, w, L0, norm1p(y, w[L0 + "post_attention_layernorm.weight"], eps)))


def target_final(target: Qwen38Spec, last_hidden: np.ndarray) -> np.ndarray:
    """The target's post-final-norm rows from its last layer's output [T, H] (zero-centred model.norm)."""
    return norm1p(last_hidden, as_f64(target)["model.norm.weight"], target.layer.rms_eps)


def rows(mtp: MTPSpec, target: Qwen38Spec, emb: np.ndarray, hidden: np.ndarray, positions: np.ndarray) -> MTPRefOut:
    """MTP rows (emb_j = E(tok_j), hidden_j = h_{j-1}) at ``positions``, causal among themselves."""
    y = layer(mtp, target, mtp_input(mtp, emb, hidden), positions)
    g = norm1p(y, as_f64(mtp)[P + "norm.weight"], mtp.layer.rms_eps)
    logits = head(target, g)
    return MTPRefOut(layer_out=y, g=g, logits=logits, ids=ns(logits).argmax(logits, axis=-1))


def teacher_forced(mtp: MTPSpec, target: Qwen38Spec, ids: Sequence[int], final: np.ndarray) -> MTPRefOut:
    """Every row j = 1..T-1 of a sequence: reads (ids[j], final[j-1]), row j-1 of the result predicts ids[j+1].

    final: [T, H] the target's post-final-norm rows over ``ids``."""
    emb = embed_rows(target, ids[1:])
    return rows(mtp, target, emb, here(final)[:-1], ns(emb).arange(1, len(ids)))


def draft(mtp: MTPSpec, target: Qwen38Spec, ids: Sequence[int], final: np.ndarray, anchor: int, width: int,
          chain_ids: Sequence[int] | None = None) -> MTPRefOut:
    """``width`` chained drafts after a context of T = len(ids) positions.

    final [T, H]: the target's post-final-norm rows over ``ids``; anchor: the id at position T (the last
    one the target emitted). Row T reads (anchor, final[T-1]); chained row T+i reads (d_i, g_{T+i-1}).
    d_i is the previous row's argmax, or ``chain_ids[i-1]`` when given (so a check can follow another
    engine's drafts). Returns the ``width`` drafted rows only."""
    t = len(ids)
    toks = list(ids[1:]) + [anchor]
    final = here(final)
    xp, hid = ns(final), list(final[:t])
    for i in range(width):
        with at_layer(i):                  # chained row i's choices are layer i's in a layered pin (a MoE layer)
            out = rows(mtp, target, embed_rows(target, toks), xp.stack(hid), xp.arange(1, t + 1 + i))
        if i + 1 < width:
            toks.append(int(out.ids[-1]) if chain_ids is None else int(chain_ids[i]))
            hid.append(out.g[-1])
    k = slice(t - 1, t - 1 + width)
    return MTPRefOut(layer_out=out.layer_out[k], g=out.g[k], logits=out.logits[k], ids=out.ids[k])


def store_rows(mtp: MTPSpec, target: Qwen38Spec, ids: Sequence[int],
               final: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The MTP layer's K/V of the real rows j = 1..T-1 of a sequence (row j reads ids[j] and final[j-1]; RoPE
    position j), as the draft's store keeps them at slots 1..T-1: (k, v), each [T-1, nkv, d].

    final: [T, H] the target's post-final-norm rows over ``ids`` (row T-1 is not read)."""
    w, eps = as_f64(mtp), mtp.layer.rms_eps
    emb = embed_rows(target, ids[1:])
    a = norm1p(mtp_input(mtp, emb, final[:-1]), w[L0 + "input_layernorm.weight"], eps)
    return project_kv(target, w, L0 + "self_attn.", a, ns(a).arange(1, len(ids)))
