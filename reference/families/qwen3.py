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

from bloomery_cli.spec import LayerShape, ModelSpec

from ..ops.attention import attention, causal_mask
from ..ops.mlp import swiglu
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope
from ..rounding import linear, st
from ..weights import as_f64

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
    return np.concatenate([out.hidden[:-1], out.final[None]], axis=0)


def self_attention(shape: LayerShape, w: Weights, prefix: str, x_q: np.ndarray, x_kv: np.ndarray,
                   pos_q: np.ndarray, pos_kv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Qwen3 attention sublayer: normed inputs in, o Wo^T out (the residual add is the caller's).

    x_q: [T, H] rows that ask (queries), at positions pos_q [T]; x_kv: [S, H] rows that answer (keys,
    values) at pos_kv [S]; mask: bool [T, S]. The target passes x_q = x_kv; DFlash passes [u ; a] as
    x_kv. ``prefix`` is e.g. "model.layers.3.self_attn.". Returns [T, H].
    """
    nh, nkv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    q = linear(x_q, w[prefix + "q_proj.weight"]).reshape(len(x_q), nh, d)
    k = linear(x_kv, w[prefix + "k_proj.weight"]).reshape(len(x_kv), nkv, d)
    v = linear(x_kv, w[prefix + "v_proj.weight"]).reshape(len(x_kv), nkv, d)
    q = rms_norm(q, w[prefix + "q_norm.weight"], shape.rms_eps)
    k = rms_norm(k, w[prefix + "k_norm.weight"], shape.rms_eps)
    q = apply_rope(q, pos_q, shape.rope_theta)
    k = apply_rope(k, pos_kv, shape.rope_theta)
    o = attention(q, k, v, mask).reshape(len(x_q), nh * d)
    return linear(o, w[prefix + "o_proj.weight"])


def mlp(w: Weights, prefix: str, x: np.ndarray) -> np.ndarray:
    """SwiGLU sublayer on normed rows x [T, H]; ``prefix`` e.g. "model.layers.3.mlp."."""
    return swiglu(x, w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"],
                  w[prefix + "down_proj.weight"])


def decoder_layer(shape: LayerShape, w: Weights, prefix: str, h: np.ndarray, positions: np.ndarray,
                  mask: np.ndarray) -> np.ndarray:
    """One pre-norm layer over its own rows (self-attention): h [T, H] -> [T, H].

    ``prefix`` e.g. "model.layers.3."; positions [T]; mask bool [T, T].
    """
    a = rms_norm(h, w[prefix + "input_layernorm.weight"], shape.rms_eps)
    h = st(h + self_attention(shape, w, prefix + "self_attn.", a, a, positions, positions, mask))
    m = rms_norm(h, w[prefix + "post_attention_layernorm.weight"], shape.rms_eps)
    return st(h + mlp(w, prefix + "mlp.", m))


def embed(spec: ModelSpec, ids: Sequence[int]) -> np.ndarray:
    """E(ids): rows of model.embed_tokens.weight, [T, H]."""
    idx = np.asarray(ids, dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0 or (idx < 0).any() or (idx >= spec.vocab_size).any():
        raise ValueError(f"ids must be a non-empty 1-D sequence in [0, {spec.vocab_size})")
    return as_f64(spec)["model.embed_tokens.weight"][idx]


def head_weight(spec: ModelSpec) -> np.ndarray:
    """The LM head [V, H] as float64: lm_head.weight, or the embedding when tied."""
    name = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    return as_f64(spec)[name]


def forward(spec: ModelSpec, ids: Sequence[int]) -> RefOut:
    """Run the whole sequence ids (positions 0..T-1, causal) and keep every layer's output."""
    if spec.family != "qwen3":
        raise ValueError(f"reference.families.qwen3 got a {spec.family!r} spec")
    w = as_f64(spec)
    h = embed(spec, ids)
    t = len(h)
    positions = np.arange(t)
    mask = causal_mask(t)
    hidden = [h]
    for i in range(spec.num_layers):
        h = decoder_layer(spec.layer, w, f"model.layers.{i}.", h, positions, mask)
        hidden.append(h)
    final = rms_norm(h, w["model.norm.weight"], spec.layer.rms_eps)
    logits = linear(final, head_weight(spec))
    return RefOut(logits=logits, hidden=np.stack(hidden), final=final)
