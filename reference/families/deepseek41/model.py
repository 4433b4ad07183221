"""DeepSeek V4.1 ("deepseek41") trunk, float64 host reference (no cache: every call runs the whole sequence); the
V4.1 deltas over ``reference.families.deepseek4.model`` (docs/V41.md), whose attention, routing and MoE it reuses:

    state    (x [T, S, H], lag [T, S]); x_0 = S copies of E(ids), lag_0 = e_0   (``reference.ops.mhc_lagged``)
    layer l  x, pre = lagged_sublayer(x, lag; attn_hc, a -> v4_attention(rms(a, input_layernorm)))
             x, lag = lagged_sublayer(x, pre; ffn_hc, b -> moe(rms(b, post_attention_layernorm)))
             i.e. each sublayer's mixes come from its own input streams, its fold from the previous sublayer's pre
    attention  V4's (K = V MQA, interleaved tail rope + its conjugate on the output, sinks, grouped output) with
               NO per-head RMS of q (``q_head_norm`` False); window-only layers (the spec's "sliding")
    moe      sqrt-softplus + bias top-k, renormalised x routed_scale, clamped SwiGLU + the ungated shared expert
    final    rms(last_mix(x, lag), model.norm) = rms(sum_s pre_{2L-1}[s] x[s], model.norm); logits = final head^T

Taps: ``hidden`` [L+1, T, S+1, H]: hidden[l] = pack_lag(x, lag) entering layer l (hidden[0] the embedding copies and
the one-hot), ``final`` [T, H], ``logits``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bloomery_gates.spec import Deepseek41Spec

from ...ops import mhc_lagged as rlag
from ...ops import v4_attention as rv4
from ...ops.norm import rms_norm
from ...weights import as_f64
from ...xp import here, ns
from ..deepseek4.model import P, Weights, attn_weights, check_ids, embed_streams, ffn, head_name, layer_rope
from ..qwen3.model import RefOut

__all__ = ["RefOut", "forward", "reference_layer", "final_norm", "decoder_layer"]


def check_supported(spec: Deepseek41Spec) -> None:
    """What this reference runs: lagged mixes, the LastMix collapse, window-only layers, routed (non-hash) MoE."""
    if spec.family != "deepseek41":
        raise ValueError(f"reference.families.deepseek41.model got a {spec.family!r} spec")
    if (spec.hc_mix, spec.collapse) != ("lagged", "last_mix") or set(spec.layer_types) != {"sliding"} or \
            set(spec.mlp_types) != {"moe"}:
        raise ValueError("deepseek41 runs lagged mixes + LastMix on window-only, routed layers only (docs/V41.md 10)")


def attention(spec: Deepseek41Spec, w: Weights, l: int, a: np.ndarray) -> np.ndarray:
    """Layer l's window-only attention on normed rows a [T, H] (positions 0..T-1), no per-head q norm."""
    s = spec.attn
    return rv4.v4_attention(a, attn_weights(spec, w, l), "sliding", s.num_heads, s.window, layer_rope(spec, l),
                            spec.layer.rms_eps, groups=s.o_groups, q_head_norm=spec.q_head_norm)[0]


def decoder_layer(spec: Deepseek41Spec, w: Weights, l: int, state: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Layer l over the whole sequence: state [T, S+1, H] (streams + lag) -> the next [T, S+1, H]."""
    hc, eps, p = spec.hc, spec.layer.rms_eps, P + f"layers.{l}."
    x, lag = rlag.unpack_lag(state)
    x, pre = rlag.lagged_sublayer(x, lag, w[p + "attn_hc.fn"], w[p + "attn_hc.base"], w[p + "attn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda a: attention(spec, w, l, rms_norm(a, w[p + "input_layernorm.weight"], eps)))
    x, lag = rlag.lagged_sublayer(x, pre, w[p + "ffn_hc.fn"], w[p + "ffn_hc.base"], w[p + "ffn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda b: ffn(spec, w, l, rms_norm(b, w[p + "post_attention_layernorm.weight"],
                                                                     eps), ids))
    return rlag.pack_lag(x, lag)


def reference_layer(spec: Deepseek41Spec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: its input state h [T, S+1, H] (streams + lag) at positions 0..T-1 -> [T, S+1, H]."""
    check_supported(spec)
    tok = check_ids(spec, ids) if ids is not None else ns(here(h)).zeros(len(h), dtype=np.int64)
    return decoder_layer(spec, as_f64(spec), l, here(h), tok)


def final_norm(spec: Deepseek41Spec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: rms(last_mix(streams, lag), model.norm) from the state h [T, S+1, H]."""
    x, lag = rlag.unpack_lag(here(h))
    return rms_norm(rlag.last_mix(x, lag), as_f64(spec)[P + "norm.weight"], spec.layer.rms_eps)


def forward(spec: Deepseek41Spec, ids: Sequence[int]) -> RefOut:
    """The whole sequence ids (positions 0..T-1) with every layer's input state kept."""
    check_supported(spec)
    w, tok = as_f64(spec), check_ids(spec, ids)
    x = embed_streams(spec, tok)
    state = rlag.pack_lag(x, rlag.lag_init(x))
    hidden = [state]
    for l in range(spec.num_layers):
        state = decoder_layer(spec, w, l, state, tok)
        hidden.append(state)
    final = final_norm(spec, state)
    return RefOut(logits=w.project(head_name(spec), final), hidden=ns(state).stack(hidden), final=final)
