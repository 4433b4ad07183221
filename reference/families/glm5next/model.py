"""GLM-5.3-Flash ("glm5next") trunk, float64 host reference (no cache: every call runs the whole sequence). HF
model_type ``glm5_next`` (the text model, tensors under ``model.`` or, in the conditional-generation wrapper,
``model.language_model.``); weights [out, in], y = x W^T; norms are plain RMSNorm (gain w); NoPE throughout
(docs/FAMILIES_MOE.md section 4.3).

The residual is S = hc.count streams, x [T, S, H]; the embedding enters as S copies. Layer l:

    (pre, post, comb) = mhc_weights(x; attn_hc)          ``reference.ops.mhc``
    a  = rms(sum_s pre_s x_s, input_layernorm)                                                     [T, H]
    y  = KDA(a)                          linear_attention        (``ops.kda``, fresh state at row 0)
       | MLA(a; mask = DSA(a))           indexed_attention       (``ops.mla`` + ``ops.dsa``; a "shared" layer takes
                                                                  the mask of the last "full" layer before it)
    x  = post y + comb^T x                                                                      [T, S, H]
    (pre, post, comb) = mhc_weights(x; ffn_hc)
    y  = ffn(rms(sum_s pre_s x_s, post_attention_layernorm))
         dense: clamped SwiGLU (``ops.swiglu_clamp``, limit swiglu_limit);
         sparse: R2 router (sigmoid + bias, group top-k, renorm, x routed_scale; ``families.ffn.route``), clamped
                 routed experts, + the ungated clamped shared expert ``mlp.shared_experts.*``
    x  = post y + comb^T x

final = rms(mean_s x_s, model.norm) [T, H]  (``mhc_head``: the unweighted mean);  logits = final head^T.

Taps: ``hidden`` [L+1, T, S, H] (hidden[0] the S copies of the embedding, hidden[l+1] layer l's output streams,
all before the head's collapse), ``final`` [T, H] (= HF's last hidden_states entry, the NextN input), ``logits``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from bloomery_gates.spec import Glm5NextSpec

from ...ops import dsa as rdsa
from ...ops import kda as rkda
from ...ops import mhc as rmhc
from ...ops import mla as rmla
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...ops.swiglu_clamp import routed_experts_clamped, swiglu_clamped
from ...rounding import st
from ...weights import as_f64
from ...xp import here, ns, to_host
from ..ffn import route
from ..qwen3.model import RefOut

__all__ = ["RefOut", "forward", "reference_layer", "final_norm", "decoder_layer", "prefix", "embed_streams", "moe",
           "kv_rows", "recurrent_state"]

Weights = Mapping[str, np.ndarray]


def prefix(spec: Glm5NextSpec) -> str:
    """Where the text model's tensors live: ``model.language_model.`` (the wrapper) or ``model.``."""
    for p in ("model.language_model.", "model."):         # a GGUF spec's reader renames to HF's "model."
        if p + "embed_tokens.weight" in spec.tensors:
            return p
    raise ValueError("reference.families.glm5next reads HF tensor names; this spec has no "
                     "model[.language_model].embed_tokens")


def head_name(spec: Glm5NextSpec) -> str:
    return prefix(spec) + "embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"


def embed_streams(spec: Glm5NextSpec, ids: Sequence[int]) -> np.ndarray:
    """E(ids) as S copies: [T, S, H]."""
    idx = np.asarray(to_host(ids), dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0 or (idx < 0).any() or (idx >= spec.vocab_size).any():
        raise ValueError(f"ids must be a non-empty 1-D sequence in [0, {spec.vocab_size})")
    e = as_f64(spec).rows(prefix(spec) + "embed_tokens.weight", idx)
    return ns(e).repeat(e[:, None, :], spec.hc.count, axis=1)


def _mhc(spec: Glm5NextSpec, w: Weights, p: str, x: np.ndarray) -> rmhc.MhcWeights:
    """The mHC weights of one sublayer (``p`` ends in "attn_hc." or "ffn_hc.")."""
    return rmhc.mhc_weights(x, w[p + "fn"], w[p + "base"], w[p + "scale"], spec.hc.sinkhorn_iters, spec.hc.eps,
                            spec.layer.rms_eps)


def kda_weights(w: Weights, a: str) -> rkda.KdaWeights:
    """HF's Glm5NextTextLinearAttention tensors under ``a`` (= p + "self_attn.")."""
    conv = w[a + "conv1d.weight"]
    return rkda.KdaWeights(
        q=w[a + "q_proj.weight"], k=w[a + "k_proj.weight"], v=w[a + "v_proj.weight"],
        conv=conv.reshape(conv.shape[0], conv.shape[-1]), f_a=w[a + "forget_gate.f_a_proj.weight"],
        f_b=w[a + "forget_gate.f_b_proj.weight"], dt_bias=w[a + "forget_gate.dt_bias"],
        a_log=w[a + "forget_gate.A_log"], b=w[a + "b_proj.weight"], g_a=w[a + "g_a_proj.weight"],
        g_b=w[a + "g_b_proj.weight"], norm=w[a + "o_norm.weight"], o=w[a + "o_proj.weight"])


def mla_weights(w: Weights, a: str) -> rmla.MlaWeights:
    return rmla.MlaWeights(
        q_a=w[a + "q_a_proj.weight"], q_a_norm=w[a + "q_a_layernorm.weight"], q_b=w[a + "q_b_proj.weight"],
        kv_a=w[a + "kv_a_proj_with_mqa.weight"], kv_a_norm=w[a + "kv_a_layernorm.weight"],
        kv_b=w[a + "kv_b_proj.weight"], o=w[a + "o_proj.weight"])


def indexer_weights(w: Weights, a: str) -> rdsa.IndexerWeights:
    i = a + "indexer."
    return rdsa.IndexerWeights(
        wq_b=w[i + "wq_b.weight"], wk=w[i + "wk.weight"], k_norm_w=w[i + "k_norm.weight"],
        k_norm_b=w[i + "k_norm.bias"], weights_proj=w[i + "weights_proj.weight"],
        gate=w[i + "index_kpool_compress_gate"], ape=w[i + "index_kpool_compress_ape"])


def full_layer_of(spec: Glm5NextSpec, l: int) -> int:
    """The full indexer layer whose choice layer l uses (l itself when full)."""
    types = spec.dsa.types
    if types[l] == "full":
        return l
    j = next((j for j in range(l - 1, -1, -1) if types[j] == "full"), None)
    if types[l] != "shared" or j is None:
        raise ValueError(f"glm5next layer {l} is not an indexed layer with a full layer before it")
    return j


def selection(spec: Glm5NextSpec, w: Weights, l: int, a: np.ndarray) -> np.ndarray:
    """The DSA token mask [T, T] of full layer l on its normed block input a [T, H] (positions 0..T-1)."""
    s, d = prefix(spec) + f"layers.{l}.self_attn.", spec.dsa
    m = mla_weights(w, s)
    qr = rmla.q_resid(a, m, spec.layer.rms_eps)
    sel = rdsa.indexer(a, a, qr, ns(a).arange(len(a)), indexer_weights(w, s), d.num_heads, d.kpool, d.topk,
                       d.select_tail)
    return sel.mask


def attention(spec: Glm5NextSpec, w: Weights, l: int, a: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Layer l's token mixer on normed rows a [T, H] -> [T, H]; ``mask`` the DSA mask (indexed layers)."""
    s, eps = prefix(spec) + f"layers.{l}.self_attn.", spec.layer.rms_eps
    if spec.layer_types[l] == "linear_attention":
        return rkda.kda_attention(a, kda_weights(w, s), spec.kda.num_heads, spec.kda.lower_bound, eps).out
    m = mla_weights(w, s)
    return rmla.mla_attention(rmla.q_resid(a, m, eps), rmla.latent(a, m, eps), mask, m, spec.mla.num_heads,
                              spec.mla.qk_nope_head_dim)


def ffn(spec: Glm5NextSpec, w: Weights, l: int, a: np.ndarray) -> np.ndarray:
    """Layer l's FFN on normed rows a [T, H] -> [T, H]: clamped dense SwiGLU, or clamped MoE + shared expert."""
    m, lim = prefix(spec) + f"layers.{l}.mlp.", spec.swiglu_limit
    if spec.mlp_types[l] == "dense":
        return swiglu_clamped(a, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"], lim)
    return moe(spec, w, m, a)


def moe(spec: Glm5NextSpec, w: Weights, m: str, a: np.ndarray) -> np.ndarray:
    """The sparse FFN under ``m`` (= p + "mlp.", a trunk layer's or the NextN layer's) on normed rows a [T, H]:
    R2 router, clamped routed experts, + the ungated clamped shared expert -> [T, H]."""
    lim = spec.swiglu_limit
    routed = routed_experts_clamped(a, route(spec.moe, w, m, a), w[m + "experts.gate_up_proj"],
                                    w[m + "experts.down_proj"], lim)
    if spec.moe.shared_ff is None:
        return routed
    s = m + "shared_experts."
    return st(routed + swiglu_clamped(a, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                                      w[s + "down_proj.weight"], lim))


def attn_input(spec: Glm5NextSpec, w: Weights, l: int, x: np.ndarray) -> tuple[np.ndarray, rmhc.MhcWeights]:
    """The attention sublayer's normed input a [T, H] and its mHC weights, from the streams x [T, S, H]."""
    p = prefix(spec) + f"layers.{l}."
    hw = _mhc(spec, w, p + "attn_hc.", x)
    return rms_norm(rmhc.mhc_collapse(x, hw.pre), w[p + "input_layernorm.weight"], spec.layer.rms_eps), hw


def decoder_layer(spec: Glm5NextSpec, w: Weights, l: int, x: np.ndarray,
                  mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Layer l over the whole sequence x [T, S, H] -> (x' [T, S, H], the DSA mask this layer used or None).
    ``mask``: for a "shared" indexed layer, the mask of its full layer (required there)."""
    p, eps, x = prefix(spec) + f"layers.{l}.", spec.layer.rms_eps, here(x)
    a, hw = attn_input(spec, w, l, x)
    if spec.layer_types[l] == "indexed_attention":
        if spec.dsa.types[l] == "full":
            mask = selection(spec, w, l, a)
        elif mask is None:
            raise ValueError(f"glm5next layer {l} is a shared indexer layer: pass its full layer's mask")
    else:
        mask = None
    x = rmhc.mhc_expand(attention(spec, w, l, a, mask), x, hw.post, hw.comb)
    fw = _mhc(spec, w, p + "ffn_hc.", x)
    b = rms_norm(rmhc.mhc_collapse(x, fw.pre), w[p + "post_attention_layernorm.weight"], eps)
    return rmhc.mhc_expand(ffn(spec, w, l, b), x, fw.post, fw.comb), mask


def reference_layer(spec: Glm5NextSpec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: input streams h [T, S, H] at positions 0..T-1 -> output streams [T, S, H]. A "shared"
    indexed layer also reads the input streams of its full layer (``taps[full_layer_of(spec, l)]`` [T, S, H], the
    same pass's layer inputs, as ``gates.targets.check_target`` passes them) to redo that layer's choice; without
    ``taps`` a ValueError names the layer."""
    w, h = as_f64(spec), here(h)
    mask = None
    if spec.layer_types[l] == "indexed_attention" and spec.dsa.types[l] == "shared":
        full_input = None if taps is None else taps[full_layer_of(spec, l)]
        if full_input is None:
            raise ValueError(f"glm5next layer {l} (shared indexer) needs its full layer's input streams")
        j = full_layer_of(spec, l)
        mask = selection(spec, w, j, attn_input(spec, w, j, here(full_input))[0])
    return decoder_layer(spec, w, l, h, mask)[0]


def final_norm(spec: Glm5NextSpec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: rms(mean of the streams h [T, S, H], model.norm) -> [T, H]."""
    return rms_norm(rmhc.mhc_head(here(h)), as_f64(spec)[prefix(spec) + "norm.weight"], spec.layer.rms_eps)


def forward(spec: Glm5NextSpec, ids: Sequence[int]) -> RefOut:
    """The whole sequence ids (positions 0..T-1) with every layer's output streams kept."""
    if spec.family != "glm5next":
        raise ValueError(f"reference.families.glm5next.model got a {spec.family!r} spec")
    w = as_f64(spec)
    x = embed_streams(spec, ids)
    hidden, mask = [x], None
    for l in range(spec.num_layers):
        with at_layer(l):
            x, used = decoder_layer(spec, w, l, x, mask)
        mask = used if used is not None else mask
        hidden.append(x)
    final = final_norm(spec, x)
    return RefOut(logits=as_f64(spec).project(head_name(spec), final), hidden=ns(x).stack(hidden), final=final)


def kv_rows(spec: Glm5NextSpec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per MLA layer l, what a fresh run over positions 0..length-1 leaves in the engine's cache: (the latent
    [length, kl], the normed block inputs the indexer's keys are made from [length, H] on a full indexer layer,
    else [length, 0]), from the taps of a run over at least ``length`` ids (causal: later rows do not enter)."""
    w, out = as_f64(spec), {}
    for l, kind in enumerate(spec.layer_types):
        if kind == "indexed_attention":
            a = attn_input(spec, w, l, here(taps.hidden[l])[:length])[0]
            m = mla_weights(w, prefix(spec) + f"layers.{l}.self_attn.")
            out[l] = (rmla.latent(a, m, spec.layer.rms_eps), a if spec.dsa.types[l] == "full" else a[:, :0])
    return out


def recurrent_state(spec: Glm5NextSpec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per KDA layer l, the state a fresh run over positions 0..length-1 ends in: (the conv tail [K-1, 3C]: the
    projected rows at positions length-K+1..length-1, zeros before 0; the KDA state [n, d, d] after position
    length-1), from the taps of a run over at least ``length`` ids (causal)."""
    w, out = as_f64(spec), {}
    for l, kind in enumerate(spec.layer_types):
        if kind == "linear_attention":
            a = attn_input(spec, w, l, here(taps.hidden[l])[:length])[0]
            o = rkda.kda_attention(a, kda_weights(w, prefix(spec) + f"layers.{l}.self_attn."), spec.kda.num_heads,
                                   spec.kda.lower_bound, spec.layer.rms_eps)
            out[l] = (o.tail, o.state)
    return out
