"""Qwen3 dense target, float64 host reference (no cache: every call runs the whole sequence).

One layer (h: [T, H], weights [out, in], y = x W^T):

    a = rms(h, input_layernorm)
    q = (a Wq^T) -> [T, nh, d],  k = (a Wk^T), v = (a Wv^T) -> [T, nkv, d]
    q = rms(q, q_norm), k = rms(k, k_norm)              per head, over d
    q, k = rope(q), rope(k)                              positions 0..T-1, rotate-half
    o = softmax(q k^T / sqrt(d) + causal) v              head i reads kv head i // (nh / nkv)
    h = h + o Wo^T
    h = h + down( silu(gate(m)) * up(m) ),  m = rms(h, post_attention_layernorm)

logits = rms(h, model.norm) head^T, head = lm_head.weight (or embed_tokens.weight when tied).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import LayerShape, ModelSpec

from ...ops.attention import attention, causal_mask
from ...ops.mlp import swiglu
from ...ops.norm import rms_norm
from ...ops.rope import apply_rope
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import common, here, ns, to_host

Weights = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class RefOut:
    """The reference's taps for one sequence of T ids.

    logits: [T, V]. hidden: [L+1, T, H], hidden[0] = embedding rows, hidden[l+1] = output of layer l,
    all BEFORE the final norm (so hidden[L] is pre-norm, unlike HF's hidden_states[L]).
    final: [T, H] = rms(hidden[L], model.norm), the rows that enter the head.
    """

    logits: np.ndarray
    hidden: np.ndarray
    final: np.ndarray


def hf_hidden_states(out: RefOut) -> np.ndarray:
    """The taps in HF's ``output_hidden_states`` convention: [L+1, T, H], index L post-final-norm."""
    xp, hidden, final = common(out.hidden, out.final)
    return xp.concatenate([hidden[:-1], final[None]], axis=0)


def self_attention(shape: LayerShape, w: Weights, prefix: str, x_q: np.ndarray, x_kv: np.ndarray,
                   pos_q: np.ndarray, pos_kv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Qwen3 attention sublayer: normed inputs in, o Wo^T out (the residual add is the caller's).

    x_q: [T, H] rows that ask (queries), at positions pos_q [T]; x_kv: [S, H] rows that answer (keys,
    values) at pos_kv [S]; mask: bool [T, S]. The target passes x_q = x_kv; DFlash passes [u ; a] as
    x_kv. ``prefix`` is e.g. "model.layers.3.self_attn.". Returns [T, H].
    """
    nh, d = shape.num_heads, shape.head_dim
    q = linear(x_q, w[prefix + "q_proj.weight"]).reshape(len(x_q), nh, d)
    q = rms_norm(q, w[prefix + "q_norm.weight"], shape.rms_eps)
    q = apply_rope(q, pos_q, shape.rope_theta, shape.rope_scaling)
    k, v = project_kv(shape, w, prefix, x_kv, pos_kv)
    o = attention(q, k, v, mask).reshape(len(x_q), nh * d)
    return linear(o, w[prefix + "o_proj.weight"])


def project_kv(shape: LayerShape, w: Weights, prefix: str, x_kv: np.ndarray,
               pos_kv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys and values of normed rows x_kv [S, H] at positions pos_kv [S], as a KV cache stores them:
    k = rope(rms(x_kv Wk^T, k_norm)), v = x_kv Wv^T, each [S, nkv, d]. ``prefix`` ends in "self_attn."."""
    nkv, d = shape.num_kv_heads, shape.head_dim
    k = linear(x_kv, w[prefix + "k_proj.weight"]).reshape(len(x_kv), nkv, d)
    v = linear(x_kv, w[prefix + "v_proj.weight"]).reshape(len(x_kv), nkv, d)
    k = apply_rope(rms_norm(k, w[prefix + "k_norm.weight"], shape.rms_eps), pos_kv, shape.rope_theta,
                   shape.rope_scaling)
    return k, v


def mlp(w: Weights, prefix: str, x: np.ndarray) -> np.ndarray:
    """SwiGLU sublayer on normed rows x [T, H]; ``prefix`` e.g. "model.layers.3.mlp."."""
    return swiglu(x, w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"],
                  w[prefix + "down_proj.weight"])


def decoder_layer(shape: LayerShape, w: Weights, prefix: str, h: np.ndarray, positions: np.ndarray,
                  mask: np.ndarray) -> np.ndarray:
    """One pre-norm layer over its own rows (self-attention): h [T, H] -> [T, H].

    ``prefix`` e.g. "model.layers.3."; positions [T]; mask bool [T, T].
    """
    h = here(h)
    a = rms_norm(h, w[prefix + "input_layernorm.weight"], shape.rms_eps)
    h = st(h + self_attention(shape, w, prefix + "self_attn.", a, a, positions, positions, mask))
    m = rms_norm(h, w[prefix + "post_attention_layernorm.weight"], shape.rms_eps)
    return st(h + mlp(w, prefix + "mlp.", m))


def embed(spec: ModelSpec, ids: Sequence[int]) -> np.ndarray:
    """E(ids): rows of model.embed_tokens.weight, [T, H]."""
    idx = np.asarray(to_host(ids), dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0 or (idx < 0).any() or (idx >= spec.vocab_size).any():
        raise ValueError(f"ids must be a non-empty 1-D sequence in [0, {spec.vocab_size})")
    return embed_rows(spec, idx)


def embed_rows(spec: ModelSpec, ids: Sequence[int]) -> np.ndarray:
    """Rows of model.embed_tokens.weight for ids [T] (unchecked; T may be 0): [T, H], only those rows read."""
    return as_f64(spec).rows("model.embed_tokens.weight", np.asarray(to_host(ids), dtype=np.int64).reshape(-1))


def head_name(spec: ModelSpec) -> str:
    """The LM head's tensor [V, H]: lm_head.weight, or the embedding when tied."""
    return "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"


def head(spec: ModelSpec, x: np.ndarray) -> np.ndarray:
    """The LM head on normed rows x [T, H] -> logits [T, V] = st(x head^T), the head streamed in row chunks."""
    return as_f64(spec).project(head_name(spec), x)


def reference_layer(spec: ModelSpec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: input rows h [T, H] at positions 0..T-1 -> output [T, H] (the gates' per-layer check)."""
    t = len(h)
    return decoder_layer(spec.layer, as_f64(spec), f"model.layers.{l}.", h, np.arange(t), causal_mask(t))


def final_norm(spec: ModelSpec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: rms_norm(h [T, H]) with model.norm.weight."""
    return rms_norm(h, as_f64(spec)["model.norm.weight"], spec.layer.rms_eps)


def forward(spec: ModelSpec, ids: Sequence[int]) -> RefOut:
    """Run the whole sequence ids (positions 0..T-1, causal) and keep every layer's output."""
    if spec.family != "qwen3":
        raise ValueError(f"reference.families.qwen3.model got a {spec.family!r} spec")
    w = as_f64(spec)
    h = embed(spec, ids)
    xp, t = ns(h), len(h)
    positions = xp.arange(t)
    mask = causal_mask(t, xp)
    hidden = [h]
    for i in range(spec.num_layers):
        h = decoder_layer(spec.layer, w, f"model.layers.{i}.", h, positions, mask)
        hidden.append(h)
    final = rms_norm(h, w["model.norm.weight"], spec.layer.rms_eps)
    logits = head(spec, final)
    return RefOut(logits=logits, hidden=xp.stack(hidden), final=final)


def kv_rows(spec: ModelSpec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer l, the K/V rows a fresh run leaves for positions 0..length-1 ((k, v), each [length, nkv, d]),
    from the taps of a run over at least ``length`` ids (causal: later rows do not enter)."""
    w, s = as_f64(spec), spec.layer
    out = {}
    for l in range(spec.num_layers):
        p = f"model.layers.{l}."
        a = rms_norm(taps.hidden[l, :length], w[p + "input_layernorm.weight"], s.rms_eps)
        out[l] = project_kv(s, w, p + "self_attn.", a, ns(a).arange(length))
    return out
