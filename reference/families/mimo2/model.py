"""MiMo-V2-Flash ("mimo2"), float64 host reference (no cache: every call runs the whole sequence). HF model_type
``mimo_v2_flash``; weights [out, in], y = x W^T; norms are plain RMSNorm (gain w).

Every layer l (h: [T, H]) is pre-norm:

    a = rms(h, input_layernorm)
    h = h + attn_l(a)                      full_attention or sliding_attention (shape ``spec.mimo.attn(l)``)
    h = h + mlp_l(rms(h, post_attention_layernorm))      dense: swiglu; sparse: routed experts (``ops.moe``)

attn(a), nh heads, nkv kv heads, q/k heads of d, v heads of dv, rotary dim r, value scale s, window W, sinks z:
    q = (a Wq^T) [T, nh, d],  k = (a Wk^T) [T, nkv, d],  v = (a Wv^T) [T, nkv, dv] * s
    q, k: rope (theta of the layer kind) on channels [0, r) (rotate-half inside them), channels [r, d) pass
    scores[h, t, j] = q_t . k_j / sqrt(d) where allowed(t, j), allowed = j <= t and (W is None or t - j < W)
    p = softmax over [scores[h, t, :] ; z_h] with the sink column dropped after it (the sink takes mass, no value)
    o = p v -> [T, nh dv];  out = o Wo^T

logits = rms(h, model.norm) head^T (head = lm_head.weight, or embed_tokens.weight when tied).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bloomery_gates.spec import AttnShape, Mimo2Spec

from ...ops.attention import sink_attention, window_mask
from ...ops.moe import at_layer, routed_experts
from ...ops.norm import rms_norm
from ...ops.rope import partial_rope
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns
from ..ffn import route
from ..qwen3.model import RefOut, Weights, embed, head, mlp

__all__ = ["RefOut", "forward", "reference_layer", "decoder_layer", "attention", "project_kv", "kv_rows", "ffn"]


def project_kv(a_shape: AttnShape, w: Weights, prefix: str, a: np.ndarray, positions: np.ndarray,
               value_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values of normed rows a [T, H] as a KV cache stores them: k = rope(a Wk^T) [T, nkv, d],
    v = (a Wv^T) * value_scale [T, nkv, dv]. ``prefix`` ends in "self_attn."."""
    t = len(a)
    k = linear(a, w[prefix + "k_proj.weight"]).reshape(t, a_shape.num_kv_heads, a_shape.head_dim)
    v = linear(a, w[prefix + "v_proj.weight"]).reshape(t, a_shape.num_kv_heads, a_shape.v_head_dim)
    return partial_rope(k, positions, a_shape.rotary_dim, a_shape.rope_theta), st(v * value_scale)


def attention(a_shape: AttnShape, w: Weights, prefix: str, a: np.ndarray, positions: np.ndarray,
              value_scale: float, mask: np.ndarray | None = None) -> np.ndarray:
    """One attention sublayer on normed rows a [T, H] at ``positions`` -> [T, H]. ``mask`` [T, T] defaults to
    causal cut to the kind's window."""
    t, nh = len(a), a_shape.num_heads
    q = linear(a, w[prefix + "q_proj.weight"]).reshape(t, nh, a_shape.head_dim)
    q = partial_rope(q, positions, a_shape.rotary_dim, a_shape.rope_theta)
    k, v = project_kv(a_shape, w, prefix, a, positions, value_scale)
    sinks = w[prefix + "attention_sink_bias"] if a_shape.sinks else None
    m = window_mask(positions, positions, a_shape.window) if mask is None else mask
    o = sink_attention(q, k, v, m, sinks).reshape(t, nh * a_shape.v_head_dim)
    return linear(o, w[prefix + "o_proj.weight"])


def ffn(spec: Mimo2Spec, w: Weights, l: int, x: np.ndarray) -> np.ndarray:
    """Layer l's MLP on normed rows x [T, H]: dense SwiGLU, or the routed experts (no shared expert)."""
    p, m = f"model.layers.{l}.mlp.", spec.mimo.moe
    if spec.mimo.mlp_types[l] == "dense":
        return mlp(w, p, x)
    routing = route(m, w, p, x)                             # the shared router (ffn.route)
    e = [f"{p}experts.{i}." for i in range(m.num_experts)]
    xp = ns(w[e[0] + "down_proj.weight"])
    gate_up = xp.stack([xp.concatenate([w[x_ + "gate_proj.weight"], w[x_ + "up_proj.weight"]]) for x_ in e])
    return routed_experts(x, routing, gate_up, xp.stack([w[x_ + "down_proj.weight"] for x_ in e]))


def decoder_layer(spec: Mimo2Spec, w: Weights, l: int, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Layer l over the whole sequence h [T, H] at ``positions`` (causal, windowed on SWA layers) -> [T, H]."""
    p, eps, h = f"model.layers.{l}.", spec.layer.rms_eps, here(h)
    a = rms_norm(h, w[p + "input_layernorm.weight"], eps)
    h = st(h + attention(spec.mimo.attn(l), w, p + "self_attn.", a, positions, spec.mimo.value_scale))
    return st(h + ffn(spec, w, l, rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)))


def reference_layer(spec: Mimo2Spec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: input rows h [T, H] at positions 0..T-1 -> output [T, H]."""
    h = here(h)
    return decoder_layer(spec, as_f64(spec), l, h, ns(h).arange(len(h)))


def forward(spec: Mimo2Spec, ids: Sequence[int]) -> RefOut:
    """The whole sequence ids (positions 0..T-1) with every layer's output kept."""
    if spec.family != "mimo2":
        raise ValueError(f"reference.families.mimo2.model got a {spec.family!r} spec")
    w = as_f64(spec)
    h = embed(spec, ids)
    xp = ns(h)
    positions = xp.arange(len(h))
    hidden = [h]
    for l in range(spec.num_layers):
        with at_layer(l):
            h = decoder_layer(spec, w, l, h, positions)
        hidden.append(h)
    final = rms_norm(h, w["model.norm.weight"], spec.layer.rms_eps)
    return RefOut(logits=head(spec, final), hidden=xp.stack(hidden), final=final)


def kv_rows(spec: Mimo2Spec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer l the K/V rows a fresh run leaves for positions 0..length-1: (k [length, nkv, d], v [length,
    nkv, dv]), from the taps of a run over at least ``length`` ids. An SWA layer's store keeps every position
    (the window is a mask on the reads), so its rows are all of them too."""
    w, eps = as_f64(spec), spec.layer.rms_eps
    out = {}
    for l in range(spec.num_layers):
        p = f"model.layers.{l}."
        a = rms_norm(taps.hidden[l, :length], w[p + "input_layernorm.weight"], eps)
        out[l] = project_kv(spec.mimo.attn(l), w, p + "self_attn.", a, ns(a).arange(length), spec.mimo.value_scale)
    return out
