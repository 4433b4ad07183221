"""DeepSeek V4 ("deepseek4") trunk, float64 host reference (no cache: every call runs the whole sequence). HF
model_type ``deepseek_v4`` (tensors under ``model.``, ``lm_head.weight``); weights [out, in], y = x W^T; norms
RMSNorm with gain w (docs/FAMILIES_MOE.md section 4.4).

The residual is S = hc.count streams, x [T, S, H]; the embedding enters as S copies. Layer l:

    (pre, post, comb) = mhc_weights(x; attn_hc)                         ``reference.ops.mhc``
    a  = rms(sum_s pre_s x_s, input_layernorm)                                                      [T, H]
    y  = v4_attention(a)    sliding | csa | hca, main rope on sliding layers, compress rope on the others
                            (``reference.ops.v4_attention``)
    x  = post y + comb^T x                                                                       [T, S, H]
    (pre, post, comb) = mhc_weights(x; ffn_hc)
    b  = rms(sum_s pre_s x_s, post_attention_layernorm)
    y  = sum_j w_j expert_{ids_j}(b) + shared(b)       clamped SwiGLU experts (``ops.swiglu_clamp``), the shared
                                                       expert ungated; routing (``reference.ops.router_v4``):
         hash layer:  ids = tid2eid[token],  w = renormalised sqrt(softplus(b Wr^T))[ids] x routed_scale
         moe layer:   ids = topk(s + bias),  w = renormalised s[ids] x routed_scale,  s = sqrt(softplus(b Wr^T))
    x  = post y + comb^T x

MXFP4 experts (``spec.experts_mxfp4``): gate_up / down are the e2m1 code bytes and ``..._scale_inv`` the e8m0 bytes
(uint8, read as their integer values 0..255, exact in float64); the experts run on the exact dequantised values
(``reference.ops.mxfp4.routed_experts_mxfp4``: W = E2M1[code] 2^(e - 127)), so the bands do not move.

final = rms(hyper_head(x; model.hc_head), model.norm) [T, H] (the trained HC head, ``reference.ops.mhc``);
logits = final head^T.

Taps: ``hidden`` [L+1, T, S, H] (hidden[0] the S copies of the embedding, hidden[l+1] layer l's output streams),
``final`` [T, H] (= HF's last hidden state), ``logits``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bloomery_gates.spec import Deepseek4Spec

from ...ops import mhc as rmhc
from ...ops import mxfp4 as rmx
from ...ops import router_v4 as rrouter
from ...ops import v4_attention as rv4
from ...ops.moe import Routing, at_layer, router_logits
from ...ops.norm import rms_norm
from ...ops.swiglu_clamp import routed_experts_clamped, swiglu_clamped
from ...rounding import st
from ...weights import as_f64
from ...xp import here, ns, to_host
from ..qwen3.model import RefOut

__all__ = ["RefOut", "forward", "reference_layer", "final_norm", "decoder_layer", "embed_streams"]

Weights = Mapping[str, np.ndarray]
P = "model."


def check_ids(spec: Deepseek4Spec, ids: Sequence[int] | None) -> np.ndarray:
    idx = np.asarray(to_host(ids) if ids is not None else [], dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0 or (idx < 0).any() or (idx >= spec.vocab_size).any():
        raise ValueError(f"ids must be a non-empty 1-D sequence in [0, {spec.vocab_size})")
    return idx


def embed_streams(spec: Deepseek4Spec, ids: Sequence[int]) -> np.ndarray:
    """E(ids) as S copies: [T, S, H]."""
    e = as_f64(spec).rows(P + "embed_tokens.weight", check_ids(spec, ids))
    return ns(e).repeat(e[:, None, :], spec.hc.count, axis=1)


def _mhc(spec: Deepseek4Spec, w: Weights, p: str, x: np.ndarray) -> rmhc.MhcWeights:
    return rmhc.mhc_weights(x, w[p + "fn"], w[p + "base"], w[p + "scale"], spec.hc.sinkhorn_iters, spec.hc.eps,
                            spec.layer.rms_eps)


def compressor_weights(w: Weights, c: str) -> rv4.CompressorWeights:
    return rv4.CompressorWeights(kv=w[c + "kv_proj.weight"], gate=w[c + "gate_proj.weight"],
                                 bias=w[c + "position_bias"], norm=w[c + "kv_norm.weight"])


def attn_weights_at(w: Weights, a: str, kind: str) -> rv4.V4AttnWeights:
    """The attention tensors under prefix ``a`` (``...self_attn.``) of a ``kind`` layer (its compressor and
    indexer by the kind); the trunk's layers and the MTP block share it."""
    comp = idx = None
    if kind != "sliding":
        comp = compressor_weights(w, a + "compressor.")
    if kind == "csa":
        i = a + "compressor.indexer."
        idx = rv4.IndexerWeights(compressor_weights(w, i), w[i + "q_b_proj.weight"],
                                 w[i + "scorer.weights_proj.weight"])
    return rv4.V4AttnWeights(
        q_a=w[a + "q_a_proj.weight"], q_a_norm=w[a + "q_a_norm.weight"], q_b=w[a + "q_b_proj.weight"],
        kv=w[a + "kv_proj.weight"], kv_norm=w[a + "kv_norm.weight"], o_a=w[a + "o_a_proj.weight"],
        o_b=w[a + "o_b_proj.weight"], sinks=w[a + "sinks"], comp=comp, indexer=idx)


def attn_weights(spec: Deepseek4Spec, w: Weights, l: int) -> rv4.V4AttnWeights:
    """Layer l's attention tensors (its compressor and indexer by its kind)."""
    return attn_weights_at(w, P + f"layers.{l}.self_attn.", spec.layer_types[l])


def layer_rope(spec: Deepseek4Spec, l: int) -> rv4.Rope:
    """The main rope on a sliding layer, the compress rope (its theta and scaling) on a CSA / HCA layer."""
    a = spec.attn
    if spec.layer_types[l] == "sliding":
        return rv4.Rope(a.rope_theta, a.rope_dim)
    return rv4.Rope(a.compress_theta, a.rope_dim, a.compress_scaling)


def attention(spec: Deepseek4Spec, w: Weights, l: int, a: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Layer l's attention on normed rows a [T, H] (positions 0..T-1) -> (y [T, H], the CSA choice or None)."""
    s, kind = spec.attn, spec.layer_types[l]
    rate = {"csa": s.csa_rate, "hca": s.hca_rate}.get(kind, 0)
    return rv4.v4_attention(a, attn_weights(spec, w, l), kind, s.num_heads, s.window, layer_rope(spec, l),
                            spec.layer.rms_eps, rate, s.index_heads, s.index_topk, s.o_groups)


def route_at(spec: Deepseek4Spec, w: Weights, m: str, kind: str, b: np.ndarray, ids: np.ndarray) -> Routing:
    """The routing of rows b [T, H] by the router under prefix ``m`` (``...mlp.``) of a "hash" | "moe" layer."""
    g, scale = m + "gate.", spec.moe.routed_scale
    logits = router_logits(b, w[g + "weight"])
    if kind == "hash":
        return rrouter.hash_route(logits, w[g + "tid2eid"], ids, scale)
    return rrouter.sqrtsoftplus_topk(logits, w[g + "e_score_correction_bias"], spec.moe.top_k, scale)


def route(spec: Deepseek4Spec, w: Weights, l: int, b: np.ndarray, ids: np.ndarray) -> Routing:
    """Layer l's routing of rows b [T, H] (token ids [T] for a hash layer)."""
    return route_at(spec, w, P + f"layers.{l}.mlp.", spec.mlp_types[l], b, ids)


def ffn_at(spec: Deepseek4Spec, w: Weights, m: str, routing: Routing, b: np.ndarray) -> np.ndarray:
    """The MoE under prefix ``m`` on normed rows b [T, H] with its routing: clamped routed experts + the
    ungated clamped shared expert."""
    lim = spec.swiglu_limit
    if m + "experts.gate_up_proj_scale_inv" in w:                  # MXFP4 under this prefix (as kernels/ decides)
        gu, dn = (rmx.Mxfp4(w[m + n].astype(np.uint8), w[m + n + "_scale_inv"].astype(np.uint8))
                  for n in ("experts.gate_up_proj", "experts.down_proj"))
        routed = rmx.routed_experts_mxfp4(b, routing, gu, dn, lim)
    else:
        routed = routed_experts_clamped(b, routing, w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"], lim)
    s = m + "shared_experts."
    return st(routed + swiglu_clamped(b, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                                      w[s + "down_proj.weight"], lim))


def ffn(spec: Deepseek4Spec, w: Weights, l: int, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Layer l's MoE on normed rows b [T, H]: clamped routed experts + the ungated clamped shared expert."""
    return ffn_at(spec, w, P + f"layers.{l}.mlp.", route(spec, w, l, b, ids), b)


def hc_block(spec: Deepseek4Spec, w: Weights, p: str, x: np.ndarray, attend: Callable[[np.ndarray], np.ndarray],
             moe: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """One mHC block under prefix ``p`` on streams x [T, S, H] (the layer of the module docstring with its
    attention ``attend`` and MoE ``moe`` on normed rows [T, H]) -> x' [T, S, H]."""
    eps = spec.layer.rms_eps
    hw = _mhc(spec, w, p + "attn_hc.", x)
    a = rms_norm(rmhc.mhc_collapse(x, hw.pre), w[p + "input_layernorm.weight"], eps)
    x = rmhc.mhc_expand(attend(a), x, hw.post, hw.comb)
    fw = _mhc(spec, w, p + "ffn_hc.", x)
    b = rms_norm(rmhc.mhc_collapse(x, fw.pre), w[p + "post_attention_layernorm.weight"], eps)
    return rmhc.mhc_expand(moe(b), x, fw.post, fw.comb)


def decoder_layer(spec: Deepseek4Spec, w: Weights, l: int, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Layer l over the whole sequence x [T, S, H] (token ids [T]) -> x' [T, S, H]."""
    return hc_block(spec, w, P + f"layers.{l}.", x, lambda a: attention(spec, w, l, a)[0],
                    lambda b: ffn(spec, w, l, b, ids))


def reference_layer(spec: Deepseek4Spec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: input streams h [T, S, H] at positions 0..T-1 -> output streams [T, S, H]; ``ids`` the
    token ids of the rows (a hash layer routes by them; required there: a ValueError names the layer)."""
    if spec.mlp_types[l] == "hash" and ids is None:
        raise ValueError(f"deepseek4 layer {l} is a hash layer: pass the rows' token ids")
    tok = check_ids(spec, ids) if ids is not None else ns(here(h)).zeros(len(h), dtype=np.int64)
    return decoder_layer(spec, as_f64(spec), l, here(h), tok)


def final_norm(spec: Deepseek4Spec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: rms(hyper_head(streams h [T, S, H]), model.norm) -> [T, H]."""
    w, s = as_f64(spec), spec.hc
    x = rmhc.hyper_head(here(h), w[P + "hc_head.hc_fn"], w[P + "hc_head.hc_base"], w[P + "hc_head.hc_scale"],
                        s.eps, spec.layer.rms_eps)
    return rms_norm(x, w[P + "norm.weight"], spec.layer.rms_eps)


def head_name(spec: Deepseek4Spec) -> str:
    return P + "embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"


def forward(spec: Deepseek4Spec, ids: Sequence[int]) -> RefOut:
    """The whole sequence ids (positions 0..T-1) with every layer's output streams kept."""
    if spec.family != "deepseek4":
        raise ValueError(f"reference.families.deepseek4.model got a {spec.family!r} spec")
    w, tok = as_f64(spec), check_ids(spec, ids)
    x = embed_streams(spec, tok)
    hidden = [x]
    for l in range(spec.num_layers):
        with at_layer(l):
            x = decoder_layer(spec, w, l, x, tok)
        hidden.append(x)
    final = final_norm(spec, x)
    return RefOut(logits=w.project(head_name(spec), final), hidden=ns(x).stack(hidden), final=final)
