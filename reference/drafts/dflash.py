"""DFlash block drafter, float64 host reference (DRAFTERS.md section 2). No cache: one call = one block.

Inputs: the target's reference taps over the context positions 0..s-1 and the anchor id x_s.

    c_p = concat_j hf_hidden[l_j + 1][p]                   p < s, j over target_layer_ids  [s, n*H]
    u_p = rms( c_p fc^T, hidden_norm )                     context features                 [s, H]
    y   = [x_s, m, ..., m]  (B rows, m = mask_token_id)   at positions s..s+B-1
    h   = E(y)                                             the TARGET's embedding           [B, H]
    per layer:  a = rms(h, input_layernorm)
                Q = q_norm(a Wq^T)                           rope at s..s+B-1
                K = k_norm([u ; a] Wk^T),  V = [u ; a] Wv^T  rope at 0..s-1, s..s+B-1
                h = h + softmax(Q K^T / sqrt(d)) V Wo^T      NO mask: every block row sees all s
                                                             context rows and all B block rows; a
                                                             sliding layer (windows[i] = W): the mask
                                                             of ``window_mask`` (the spec's window_rule)
                h = h + MLP( rms(h, post_attention_layernorm) )
    logits = rms(h, norm)[1:] head^T                       the TARGET's head; row i predicts s+i

hf_hidden is HF's ``output_hidden_states`` convention (what z-lab's code indexes): index 0 is the
embedding output (layer id -1 reads it), index l+1 < L the output of layer l, and index L the
POST-final-norm rows. So a layer id l_j = L-1 reads the target's ``final`` rows, not hidden[L]. To make
that unambiguous this function takes the target's whole ``RefOut`` rather than a raw [L+1, S, H] array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import DFlashSpec, ModelSpec

from ..families.qwen3.model import RefOut, embed, head, hf_hidden_states, mlp, project_kv, self_attention
from ..ops.attention import anchored_mask, sliding_mask
from ..ops.norm import rms_norm
from ..rounding import linear, st
from ..weights import as_f64
from ..xp import here, ns


@dataclass(frozen=True)
class DraftRefOut:
    """One block. logits [B-1, V] (row i predicts the token at s+1+i); layer_out [n_layers, B, H]
    (output of each draft layer, before the final norm); ids [B-1] = argmax of logits (lowest index
    on ties); u [s, H] the context features; final [B, H] = rms(layer_out[-1], norm)."""

    logits: np.ndarray
    layer_out: np.ndarray
    ids: np.ndarray
    u: np.ndarray
    final: np.ndarray


def context_features(draft: DFlashSpec, taps: RefOut, s: int) -> np.ndarray:
    """u = rms(fc(c), hidden_norm) for context positions 0..s-1, c_p = concat_j hf_hidden[l_j+1][p].

    Returns [s, H].
    """
    hf = here(hf_hidden_states(taps))
    num_layers = hf.shape[0] - 1
    for l in draft.target_layer_ids:
        if not -1 <= l < num_layers:
            raise ValueError(f"target layer id {l} is outside -1..{num_layers - 1} (-1: the embedding output)")
    c = ns(hf).concatenate([hf[l + 1, :s] for l in draft.target_layer_ids], axis=-1)
    w = as_f64(draft)
    return rms_norm(linear(c, w["fc.weight"]), w["hidden_norm.weight"], draft.layer.rms_eps)


def forward(draft: DFlashSpec, target: ModelSpec, taps: RefOut, anchor_id: int,
            s: int | None = None) -> DraftRefOut:
    """Draft one block after context positions 0..s-1 (s defaults to all rows of ``taps``).

    taps: the target reference's ``forward`` over at least s ids (rows past s are ignored);
    anchor_id: x_s, the last id the target emitted (it sits at position s).
    """
    t = taps.hidden.shape[1]
    s = t if s is None else s
    if not 1 <= s <= t:
        raise ValueError(f"context length s={s} must be in 1..{t} (rows in taps)")
    shape, w, b = draft.layer, as_f64(draft), draft.block_size
    u = context_features(draft, taps, s)
    y = [anchor_id] + [draft.mask_token_id] * (b - 1)
    h = embed(target, y)
    xp = ns(h)
    pos_q = xp.arange(s, s + b)
    pos_kv = xp.arange(s + b)
    no_mask = xp.ones((b, s + b), dtype=bool)
    windows = draft.windows or (None,) * draft.num_layers
    layer_out = []
    for i in range(draft.num_layers):
        p = f"layers.{i}."
        a = rms_norm(h, w[p + "input_layernorm.weight"], shape.rms_eps)
        x_kv = xp.concatenate([u, a], axis=0)
        mask = no_mask if windows[i] is None else window_mask(draft, pos_q, pos_kv, s, windows[i])
        h = st(h + self_attention(shape, w, p + "self_attn.", a, x_kv, pos_q, pos_kv, mask))
        m = rms_norm(h, w[p + "post_attention_layernorm.weight"], shape.rms_eps)
        h = st(h + mlp(w, p + "mlp.", m))
        layer_out.append(h)
    final = rms_norm(h, w["norm.weight"], shape.rms_eps)
    logits = head(target, final[1:])
    return DraftRefOut(logits=logits, layer_out=xp.stack(layer_out), ids=xp.argmax(logits, axis=-1),
                       u=u, final=final)


def window_mask(draft: DFlashSpec, pos_q: np.ndarray, pos_kv: np.ndarray, s: int, window: int) -> np.ndarray:
    """A sliding layer's mask [B, s+B] under the spec's ``window_rule`` (``bloomery_gates.spec.DFlashSpec``)."""
    if draft.window_rule == "query":
        return sliding_mask(pos_q, pos_kv, window)
    return anchored_mask(pos_q, pos_kv, s, window, causal=draft.window_rule == "anchor")


def context_kv(draft: DFlashSpec, taps: RefOut, s: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per draft layer i, the context store for positions 0..s-1 as the engine keeps it: (k, v) of the context
    features u [s, H] (k after k_norm and RoPE at 0..s-1), each [s, nkv, d]. DSpark and DFlash2 share it."""
    u, w = context_features(draft, taps, s), as_f64(draft)
    pos = ns(u).arange(s)
    return {i: project_kv(draft.layer, w, f"layers.{i}.self_attn.", u, pos) for i in range(draft.num_layers)}
