"""EAGLE-3 drafter, float64 host reference (DRAFTERS.md section 5; speculators' ``Eagle3DraftModel``). No cache:
every call runs all of its rows.

Inputs: the target's taps over the context, hidden [L+1, T, H] with hidden[l] the hidden state ENTERING target
layer l (hidden[0] the embedding rows, hidden[L] the last layer's output before the final norm), which is
speculators' aux id l (HF ``hidden_states[l]``).

    c_p = concat_j hidden[l_j][p]                     aux rows, j over aux_layer_ids      [T, n*H]
    u_p = c_p fc^T                                    the target feature at p              [T, H]
    row q (position q) reads the token at q and the hidden of q-1, and predicts the token at q+1:
        a  = [ rms(E(tok_q), input_layernorm) ; rms(h_{q-1}, hidden_norm) ]          [2H]  EMBEDDING FIRST
        r  = h_{q-1}   (rms(h_{q-1}, hidden_norm) with norm_before_residual)
        q, k = rms_head(a Wq^T, q_norm), rms_head(a Wk^T, k_norm)   (Qwen3 layer; a Llama layer has no q/k norm)
        v  = a Wv^T;  rope on q, k at the rows' positions;  o = softmax(q k^T / sqrt(d) + causal) v
        y  = r + o Wo^T;  y = y + swiglu(rms(y, post_attention_layernorm))        the layer output  [H]
        n  = rms(y, norm);  logits = n lm_head^T                                  [Vd] the DRAFT vocab
        d  = argmax logits (lowest index on ties);  target id t = d + d2t[d]
    real rows q = 1..T read (tok_q, u_{q-1}), tok_T = the anchor (the last id the target emitted);
    chained row T+i (i = 1..K-1) reads (t_{i}, y_{T+i-1}) (n_{T+i-1} with norm_output): the draft's OWN output,
    never a target hidden; every row attends to every row before it (real and chained), causal.

E() is the target's embedding (the reader checks a shipped copy equals it). The RoPE positions are the token
positions (speculators' training convention; vLLM uses q-1, the same scores since RoPE sees differences only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import Eagle3Spec, ModelSpec

from ..families.qwen3.model import embed_rows, mlp
from ..ops.attention import attention, causal_mask
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope
from ..rounding import linear, st
from ..weights import as_f64
from ..xp import here, ns

L0 = "layers.0."
A = L0 + "self_attn."


@dataclass(frozen=True)
class Eagle3RefOut:
    """Per row: layer_out [R, H] (y), chain [R, H] (what the next chained row reads: y, or n with norm_output),
    logits [R, Vd] (draft vocab), draft_ids [R] = argmax, ids [R] = their target ids."""

    layer_out: np.ndarray
    chain: np.ndarray
    logits: np.ndarray
    draft_ids: np.ndarray
    ids: np.ndarray

    def rows(self, k: slice) -> Eagle3RefOut:
        return Eagle3RefOut(self.layer_out[k], self.chain[k], self.logits[k], self.draft_ids[k], self.ids[k])


def features(draft: Eagle3Spec, hidden: np.ndarray) -> np.ndarray:
    """u = concat_j hidden[l_j] fc^T: hidden [L+1, T, H] (the target's taps) -> [T, H]."""
    for l in draft.aux_layer_ids:
        if not 0 <= l < hidden.shape[0]:
            raise ValueError(f"aux layer id {l} is outside the taps 0..{hidden.shape[0] - 1}")
    hidden = here(hidden)
    c = ns(hidden).concatenate([hidden[l] for l in draft.aux_layer_ids], axis=-1)
    return linear(c, as_f64(draft)["fc.weight"])


def attention_sublayer(draft: Eagle3Spec, w: Mapping[str, np.ndarray], a: np.ndarray,
                       positions: np.ndarray) -> np.ndarray:
    """o Wo^T over the rows a [R, 2H] at ``positions``, causal among the rows."""
    s = draft.layer
    nh, nkv, d, r = s.num_heads, s.num_kv_heads, s.head_dim, len(a)
    q = linear(a, w[A + "q_proj.weight"]).reshape(r, nh, d)
    k = linear(a, w[A + "k_proj.weight"]).reshape(r, nkv, d)
    v = linear(a, w[A + "v_proj.weight"]).reshape(r, nkv, d)
    if draft.qk_norm:
        q = rms_norm(q, w[A + "q_norm.weight"], s.rms_eps)
        k = rms_norm(k, w[A + "k_norm.weight"], s.rms_eps)
    q = apply_rope(q, positions, s.rope_theta, s.rope_scaling)
    k = apply_rope(k, positions, s.rope_theta, s.rope_scaling)
    o = attention(q, k, v, causal_mask(r)).reshape(r, nh * d)
    return linear(o, w[A + "o_proj.weight"])


def layer(draft: Eagle3Spec, emb: np.ndarray, hid: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The draft layer over rows (emb_q = E(tok_q), hid_q = h_{q-1}) [R, H] each -> y [R, H]."""
    w, eps = as_f64(draft), draft.layer.rms_eps
    hn = rms_norm(hid, w[L0 + "hidden_norm.weight"], eps)
    a = ns(hn).concatenate([rms_norm(emb, w[L0 + "input_layernorm.weight"], eps), hn], axis=-1)
    residual = hn if draft.norm_before_residual else ns(hn).asarray(hid)
    y = st(residual + attention_sublayer(draft, w, a, positions))
    return st(y + mlp(w, L0 + "mlp.", rms_norm(y, w[L0 + "post_attention_layernorm.weight"], eps)))


def target_ids(draft: Eagle3Spec) -> np.ndarray:
    """[Vd] int64: the target id of every draft id, d + d2t[d] (d itself without d2t)."""
    base = np.arange(draft.draft_vocab_size, dtype=np.int64)
    return base if draft.d2t is None else base + np.asarray(draft.d2t.detach().cpu().numpy(), dtype=np.int64)


def rows(draft: Eagle3Spec, emb: np.ndarray, hid: np.ndarray, positions: np.ndarray) -> Eagle3RefOut:
    """Rows at ``positions``, causal among themselves: layer, final norm, draft head, id mapping."""
    w = as_f64(draft)
    y = layer(draft, emb, hid, positions)
    n = rms_norm(y, w["norm.weight"], draft.layer.rms_eps)
    logits = w.project("lm_head.weight", n)
    xp = ns(logits)
    d = xp.argmax(logits, axis=-1)
    return Eagle3RefOut(layer_out=y, chain=n if draft.norm_output else y, logits=logits, draft_ids=d,
                        ids=xp.asarray(target_ids(draft))[d])


def draft(draft: Eagle3Spec, target: ModelSpec, ids: Sequence[int], hidden: np.ndarray, anchor: int, width: int,
          chain_ids: Sequence[int] | None = None) -> Eagle3RefOut:
    """``width`` chained drafts after a context of T = len(ids) positions.

    hidden [L+1, >= T, H]: the target's taps over ``ids`` (rows past T ignored); anchor: the id at position T.
    Chained row T+i reads the previous row's target id, or ``chain_ids[i-1]`` when given (so a check can follow
    another engine's drafts). Returns the ``width`` drafted rows (positions T..T+width-1)."""
    t = len(ids)
    if not 1 <= t <= hidden.shape[1]:
        raise ValueError(f"context of {t} ids needs 1..{hidden.shape[1]} tap rows")
    toks = [*ids[1:], anchor]
    hid = list(features(draft, hidden[:, :t]))
    xp = ns(hid[0])
    out = rows(draft, embed_rows(target, toks), xp.stack(hid), xp.arange(1, t + 1))
    for i in range(1, width):
        toks.append(int(out.ids[-1]) if chain_ids is None else int(chain_ids[i - 1]))
        hid.append(out.chain[-1])
        out = rows(draft, embed_rows(target, toks), xp.stack(hid), xp.arange(1, t + 1 + i))
    return out.rows(slice(t - 1, t - 1 + width))


def teacher_forced(draft_spec: Eagle3Spec, target: ModelSpec, ids: Sequence[int], hidden: np.ndarray,
                   steps: int) -> list[Eagle3RefOut]:
    """Chains of ``steps`` drafts anchored at every position a = 1..T-steps of a sequence, their chained tokens
    taken from the sequence (speculators' training-time test): entry s-1 holds step s of every chain, row a-1
    (at position a+s-1, it reads ids[a+s-1] and predicts the token at a+s). hidden: the taps over ``ids``."""
    per_anchor = [draft(draft_spec, target, ids[:a], hidden, ids[a], steps, chain_ids=ids[a + 1:a + steps])
                  for a in range(1, len(ids) - steps + 1)]
    xp = ns(per_anchor[0].logits)
    return [Eagle3RefOut(*(xp.stack([getattr(o, f)[s] for o in per_anchor])
                           for f in ("layer_out", "chain", "logits", "draft_ids", "ids")))
            for s in range(steps)]
