"""Qwen3.5 / 3.6 / 3.8 dense hybrid ("qwen38"), float64 host reference (no cache: every call runs the
whole sequence). HF model_type ``qwen3_5`` (text config); weights [out, in], y = x W^T.

Every layer l (h: [T, H]) is pre-norm with zero-centred norms, n1(x, w) = rms(x) * (1 + w):

    a = n1(h, input_layernorm)
    h = h + mixer_l(a)             linear_attention -> gated_deltanet(a), full_attention -> gated_attention(a)
    h = h + swiglu(n1(h, post_attention_layernorm))

gated_attention(a), nh heads of d, nkv kv heads, rotary dim r = int(d * partial_rotary_factor):
    [q | gate] = (a Wq^T) viewed [T, nh, 2d]          (per head: d query channels, then d gate channels)
    q = n1(q, q_norm), k = n1(a Wk^T, k_norm)          per head over d;  v = a Wv^T
    q, k: rope on channels [0, r) (rotate-half inside them), channels [r, d) pass
    o = softmax(q k^T / sqrt(d) + causal) v  -> [T, nh d];   out = (o * sigmoid(gate)) Wo^T

gated_deltanet(a), nk key heads of dk, nv value heads of dv:
    x = a Wqkv^T  [T, 2 nk dk + nv dv];  x = silu(causal_conv(x, conv1d))      (K taps, depthwise)
    q, k, v = split(x) -> [T, nk, dk], [T, nk, dk], [T, nv, dv];  q, k repeated to nv heads (j -> j // (nv/nk))
    g, b = gates(a Wa^T, a Wb^T, A_log, dt_bias);  o = delta_rule(l2(q)/sqrt(dk), l2(k), v, g, b)
    out = (gated_rms_norm(o, norm, z) viewed [T, nv dv]) Wout^T,  z = a Wz^T viewed [T, nv, dv]

logits = n1(h, model.norm) head^T (head = lm_head.weight, or embed_tokens.weight when tied).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bloomery_gates.registry import keys
from bloomery_gates.spec import Qwen38Spec

from ...ops.attention import attention, causal_mask
from ...ops.causal_conv import causal_conv, conv_tail
from ...ops.gated_deltanet import delta_rule, gated_rms_norm, gates, l2norm, sigmoid
from ...ops.mlp import silu
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...ops.rope import partial_rope
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns
from ..ffn import ffn_for
from ..qwen3.model import RefOut, Weights, embed, head, hf_hidden_states

__all__ = ["RefOut", "hf_hidden_states", "forward", "reference_layer", "decoder_layer", "norm1p", "kv_rows",
           "recurrent_state"]


HYBRIDS = keys(hybrid=True)      # the families this wiring runs (qwen35moe: the same layers, MoE FFNs)


def norm1p(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm: x / sqrt(mean x^2 + eps) * (1 + w) over the last axis."""
    return rms_norm(x, 1.0 + w, eps)


def gated_attention(spec: Qwen38Spec, w: Weights, prefix: str, a: np.ndarray, positions: np.ndarray,
                    mask: np.ndarray) -> np.ndarray:
    """a [T, H] normed rows -> [T, H]; ``prefix`` e.g. "model.layers.3.self_attn."."""
    s, t = spec.layer, len(a)
    nh, d = s.num_heads, s.head_dim
    qg = linear(a, w[prefix + "q_proj.weight"]).reshape(t, nh, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(t, nh * d)
    q = partial_rope(norm1p(q, w[prefix + "q_norm.weight"], s.rms_eps), positions, spec.hybrid.rotary_dim,
                     s.rope_theta)
    k, v = project_kv(spec, w, prefix, a, positions)
    o = st(attention(q, k, v, mask).reshape(t, nh * d) * st(sigmoid(gate)))
    return linear(o, w[prefix + "o_proj.weight"])


def project_kv(spec: Qwen38Spec, w: Weights, prefix: str, a: np.ndarray,
               positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys and values of normed rows a [T, H] at ``positions``, as the KV cache stores them:
    k = partial_rope(n1(a Wk^T, k_norm)), v = a Wv^T, each [T, nkv, d]. ``prefix`` ends in "self_attn."."""
    s, t = spec.layer, len(a)
    k = linear(a, w[prefix + "k_proj.weight"]).reshape(t, s.num_kv_heads, s.head_dim)
    v = linear(a, w[prefix + "v_proj.weight"]).reshape(t, s.num_kv_heads, s.head_dim)
    k = partial_rope(norm1p(k, w[prefix + "k_norm.weight"], s.rms_eps), positions, spec.hybrid.rotary_dim,
                     s.rope_theta)
    return k, v


def deltanet_inputs(spec: Qwen38Spec, w: Weights, prefix: str, a: np.ndarray) -> tuple[np.ndarray, ...]:
    """The delta rule's inputs from normed rows a [T, H], from the start of the sequence (zero conv tail):
    (proj = a Wqkv^T [T, C] before the conv, q, k [T, nv, dk] normed and scaled, v [T, nv, dv], g, b [T, nv])."""
    hy, t = spec.hybrid, len(a)
    nk, nv, dk, dv = hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_key_head_dim, \
        hy.linear_value_head_dim
    proj = linear(a, w[prefix + "in_proj_qkv.weight"])
    x = st(silu(causal_conv(proj, w[prefix + "conv1d.weight"].reshape(hy.conv_dim, -1))))
    q = x[:, :hy.key_dim].reshape(t, nk, dk)
    k = x[:, hy.key_dim:2 * hy.key_dim].reshape(t, nk, dk)
    v = x[:, 2 * hy.key_dim:].reshape(t, nv, dv)
    xp = ns(x)
    q = xp.repeat(l2norm(q), nv // nk, axis=1) / np.sqrt(dk)
    k = xp.repeat(l2norm(k), nv // nk, axis=1)
    g, b = gates(linear(a, w[prefix + "in_proj_a.weight"]), linear(a, w[prefix + "in_proj_b.weight"]),
                 w[prefix + "A_log"], w[prefix + "dt_bias"])
    return proj, q, k, v, g, b


def gated_deltanet(spec: Qwen38Spec, w: Weights, prefix: str, a: np.ndarray) -> np.ndarray:
    """a [T, H] normed rows -> [T, H], from the start of the sequence (zero conv tail and state);
    ``prefix`` e.g. "model.layers.0.linear_attn."."""
    hy, t = spec.hybrid, len(a)
    nv, dv = hy.linear_num_value_heads, hy.linear_value_head_dim
    _, q, k, v, g, b = deltanet_inputs(spec, w, prefix, a)
    o, _ = delta_rule(q, k, v, g, b)
    z = linear(a, w[prefix + "in_proj_z.weight"]).reshape(t, nv, dv)
    o = gated_rms_norm(o, w[prefix + "norm.weight"], z, spec.layer.rms_eps).reshape(t, nv * dv)
    return linear(o, w[prefix + "out_proj.weight"])


def decoder_layer(spec: Qwen38Spec, w: Weights, l: int, h: np.ndarray, positions: np.ndarray,
                  mask: np.ndarray) -> np.ndarray:
    """Layer l over the whole sequence h [T, H] (positions [T], causal mask [T, T]) -> [T, H]."""
    p, eps, h = f"model.layers.{l}.", spec.layer.rms_eps, here(h)
    a = norm1p(h, w[p + "input_layernorm.weight"], eps)
    if spec.hybrid.is_linear(l):
        h = st(h + gated_deltanet(spec, w, p + "linear_attn.", a))
    else:
        h = st(h + gated_attention(spec, w, p + "self_attn.", a, positions, mask))
    return st(h + ffn_for(spec)(spec, w, p, norm1p(h, w[p + "post_attention_layernorm.weight"], eps)))


def reference_layer(spec: Qwen38Spec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: input rows h [T, H] at positions 0..T-1 -> output [T, H] (the gates' per-layer check)."""
    h = here(h)
    xp, t = ns(h), len(h)
    return decoder_layer(spec, as_f64(spec), l, h, xp.arange(t), causal_mask(t, xp))


def final_norm(spec: Qwen38Spec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: norm1p(h [T, H]) with model.norm.weight (the (1 + w) gain)."""
    return norm1p(h, as_f64(spec)["model.norm.weight"], spec.layer.rms_eps)


def forward(spec: Qwen38Spec, ids: Sequence[int]) -> RefOut:
    """Run the whole sequence ids (positions 0..T-1, causal) and keep every layer's output."""
    if spec.family not in HYBRIDS:
        raise ValueError(f"reference.families.qwen38.model got a {spec.family!r} spec")
    w = as_f64(spec)
    h = embed(spec, ids)
    xp, t = ns(h), len(h)
    positions, mask = xp.arange(t), causal_mask(t, xp)
    hidden = [h]
    for l in range(spec.num_layers):
        with at_layer(l):
            h = decoder_layer(spec, w, l, h, positions, mask)
        hidden.append(h)
    final = norm1p(h, w["model.norm.weight"], spec.layer.rms_eps)
    return RefOut(logits=head(spec, final), hidden=xp.stack(hidden), final=final)


def kv_rows(spec: Qwen38Spec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per full-attention layer l, the K/V rows a fresh run leaves for positions 0..length-1 ((k, v), each
    [length, nkv, d]), from the taps of a run over at least ``length`` ids (causal: later rows do not enter)."""
    w, eps = as_f64(spec), spec.layer.rms_eps
    out = {}
    for l in range(spec.num_layers):
        if not spec.hybrid.is_linear(l):
            p = f"model.layers.{l}."
            a = norm1p(taps.hidden[l, :length], w[p + "input_layernorm.weight"], eps)
            out[l] = project_kv(spec, w, p + "self_attn.", a, ns(a).arange(length))
    return out


def recurrent_state(spec: Qwen38Spec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per linear-attention layer l, the state a fresh run over positions 0..length-1 ends in: (the conv tail
    [K-1, C]: the projected rows at positions length-K+1..length-1, zeros before 0; the delta-rule state
    [nv, dk, dv] after position length-1), from the taps of a run over at least ``length`` ids (causal)."""
    w, eps, k = as_f64(spec), spec.layer.rms_eps, spec.hybrid.linear_conv_kernel_dim
    out = {}
    for l in range(spec.num_layers):
        if spec.hybrid.is_linear(l):
            p = f"model.layers.{l}."
            a = norm1p(taps.hidden[l, :length], w[p + "input_layernorm.weight"], eps)
            proj, q, kk, v, g, b = deltanet_inputs(spec, w, p + "linear_attn.", a)
            out[l] = (conv_tail(proj, k), delta_rule(q, kk, v, g, b)[1])
    return out
