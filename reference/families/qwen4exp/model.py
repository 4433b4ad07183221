"""Qwen3.8-Flash-Next ("qwen4exp"), float64 host reference (no cache: every call runs the whole sequence). HF
model_type ``qwen4_exp`` (text config); weights [out, in], y = x W^T (docs/FAMILIES_MOE.md 4.5).

The residual is S = hc.count streams side by side, x [T, S*H]; the embedding enters as S copies. There are no block
norms: every sublayer is wrapped in a gated residual (``reference.ops.gated_hc``; weights under
``model.layers.{l}.{attn,mlp}_hyper_connection.``: hc_norm [S*H], input_mix_weight_down [R, S*H],
input_mix_weight_up [S*H, R], block_inject_weight [S, S*H]):

    x = repeat_streams(E(ids), S)                                                                     [T, S*H]
    layer l:
        x = ple(x, ids)                          only on the PLE layer (``ple.layers``; ``reference.ops.ple``)
        (b, g) = gated_residual(x, attn_hyper_connection)                         b [T, H], g [T, S]
        x = x + g (x) mixer_l(b)      linear_attention -> gated_deltanet(b) (qwen38's), full -> qsa_attention(b)
        (b, g) = gated_residual(x, mlp_hyper_connection)
        x = x + g (x) moe(b)          R1: softmax top-k renormalised, sigmoid-gated shared expert (qwen35moe's)
    final = gated_residual(x, model.hyper_connection_mixer, no inject).block_in                       [T, H]
    logits = final head^T                                 (no final norm; head = lm_head, or embed when tied)

(g (x) y)[t, s*H + c] = g[t, s] y[t, c]. qsa_attention(b) is qwen38's gated attention (q/gate interleaved per head,
zero-centred q/k norms, partial rope) whose causal mask is ANDed with the QSA selection made from the same rows b
(``reference.ops.qsa.qsa_select``: ``self_attn.indexer.{index_qk_proj, q_layernorm, k_layernorm}``).

PLE (on layer p = ple.layers[i]): hashed ids from the n-gram tables of PLE index i (``ple.ngram_tables``, HF's
hashing inputs: vocab, ngram_size, heads_per_ngram, ngram_vocab_size_base, seed), segments split at eos, the
sequence preceded by N-1 eos; weights ``model.layers.{p}.ple.{ple_embedding.ngram_embedding, key_proj, value_proj,
norm_key, norm_query, norm_conv, conv1d}``.

Taps (``RefOut``): hidden [L+1, T, S*H] the streams (hidden[0] the repeated embedding, hidden[l+1] layer l's
output), final [T, H] the mixer's output (the head's input), logits [T, V].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bloomery_gates import ple_hash
from bloomery_gates.spec import Qwen4ExpSpec

from ...ops import gated_hc as hc
from ...ops import ple as rple
from ...ops import qsa as rqsa
from ...ops.attention import causal_mask
from ...ops.causal_conv import conv_tail
from ...ops.gated_deltanet import delta_rule, sigmoid
from ...ops.mlp import silu
from ...ops.moe import at_layer
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns
from ..ffn import ffn_for
from ..qwen3.model import RefOut, Weights, embed, head
from ..qwen38.model import deltanet_inputs, gated_attention, project_kv

__all__ = ["RefOut", "forward", "reference_layer", "final_norm", "decoder_layer", "hashed_ids", "qsa_mask", "kv_rows",
           "recurrent_state"]


def check_spec(spec: Qwen4ExpSpec) -> None:
    """What this reference computes, refused by name otherwise (fails closed, never a silently different model)."""
    if spec.family != "qwen4exp":
        raise ValueError(f"reference.families.qwen4exp.model got a {spec.family!r} spec")
    if spec.output_gate not in GATES:
        raise ValueError(f"qwen4exp reference: GDN output gate {spec.output_gate!r} unknown (expected one of "
                         f"{sorted(GATES)}; a GGUF spec does not record it)")
    if not spec.moe.norm_topk:
        raise ValueError("qwen4exp reference: norm_topk_prob false (un-renormalised top-k) is not implemented")
    if spec.ple is not None and not spec.ple.hashing_known:
        raise ValueError("qwen4exp reference: PLE needs its hashing tables (HF: ngram_vocab_size_base and seed; "
                         "GGUF: ple.layer_multipliers, head_offsets, head_vocab_sizes) and eos_token_id")


GATES = {"silu": silu, "sigmoid": sigmoid}


def gated_deltanet(spec: Qwen4ExpSpec, w: Weights, prefix: str, a: np.ndarray) -> np.ndarray:
    """qwen38's Gated DeltaNet (``reference.families.qwen38.model``) on rows a [T, H] -> [T, H], its output norm
    gated by ``spec.output_gate``: o = rms(o) * w * act(z), act = silu or sigmoid (HF ``output_gate_type``)."""
    hy, t = spec.hybrid, len(a)
    nv, dv = hy.linear_num_value_heads, hy.linear_value_head_dim
    _, q, k, v, g, b = deltanet_inputs(spec, w, prefix, a)
    o, _ = delta_rule(q, k, v, g, b)
    z = linear(a, w[prefix + "in_proj_z.weight"]).reshape(t, nv, dv)
    xp = ns(o)
    o = st(o / xp.sqrt(xp.mean(o * o, axis=-1, keepdims=True) + spec.layer.rms_eps) * w[prefix + "norm.weight"]
           * GATES[spec.output_gate](z))
    return linear(o.reshape(t, nv * dv), w[prefix + "out_proj.weight"])


def residual(w: Weights, prefix: str, x: np.ndarray, streams: int, eps: float, inject: bool = True) -> hc.HcIn:
    """The gated residual whose tensors sit under ``prefix`` (ends in "_hyper_connection." or "mixer.")."""
    return hc.gated_residual(x, w[prefix + "hc_norm.weight"], w[prefix + "input_mix_weight_down.weight"],
                             w[prefix + "input_mix_weight_up.weight"],
                             w[prefix + "block_inject_weight.weight"] if inject else None, streams, eps)


def hashed_ids(spec: Qwen4ExpSpec, ids: np.ndarray) -> np.ndarray:
    """The PLE layer's hashed n-gram ids [T, (N-1) hpn] for ids [T] at the start of a sequence (exact integers)."""
    p = spec.ple
    if p.multipliers:                           # a GGUF stores the tables (ple.*); HF's are derived from base, seed
        tables = rple.NgramTables(*(np.array(v, dtype=np.int64) for v in ple_hash.spec_tables(p, spec.vocab_size)))
    else:
        tables = rple.ngram_tables(spec.vocab_size, p.ngram_size, p.heads_per_ngram, p.vocab_base, 0, p.seed)
    context = np.full(p.ngram_size - 1, p.eos_token_id, dtype=np.int64)
    return rple.ngram_ids(ids, context, tables, p.eos_token_id, p.heads_per_ngram)


def ple(spec: Qwen4ExpSpec, w: Weights, l: int, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """x [T, S*H] -> x + ple(x) on the PLE layer l (module docstring)."""
    p, pre, sh = spec.ple, f"model.layers.{l}.ple.", x.shape[-1]
    if p.layers.index(l) != 0:
        raise ValueError("qwen4exp reference: more than one PLE layer is not implemented (HF's hashing offsets)")
    pw = rple.PleWeights(w[pre + "ple_embedding.ngram_embedding.weight"], w[pre + "key_proj.weight"],
                         w[pre + "value_proj.weight"], w[pre + "norm_key.weight"], w[pre + "norm_query.weight"],
                         w[pre + "norm_conv.weight"], w[pre + "conv1d.weight"].reshape(sh, p.conv_kernel))
    return rple.ple_layer(x, hashed_ids(spec, ids), pw, spec.hc.count, p.ngram_size, spec.layer.rms_eps)


def qsa_mask(spec: Qwen4ExpSpec, w: Weights, l: int, b: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The QSA selection [T, T] bool of full layer l from its block input rows b [T, H] at positions 0..T-1."""
    q, pre = spec.qsa, f"model.layers.{l}.self_attn.indexer."
    weights = rqsa.QsaWeights(w[pre + "index_qk_proj.weight"], w[pre + "q_layernorm.weight"],
                              w[pre + "k_layernorm.weight"])
    return rqsa.qsa_select(b, b, positions, weights, q.num_heads, q.compress_ratio, q.budget, spec.layer.rms_eps,
                           spec.hybrid.rotary_dim, spec.layer.rope_theta).mask


def decoder_layer(spec: Qwen4ExpSpec, w: Weights, l: int, x: np.ndarray, ids: np.ndarray | None,
                  positions: np.ndarray, causal: np.ndarray) -> np.ndarray:
    """Layer l over the whole sequence: streams x [T, S*H] (ids [T] for the PLE layer) -> [T, S*H]."""
    p, s, eps, x = f"model.layers.{l}.", spec.hc.count, spec.layer.rms_eps, here(x)
    if spec.ple is not None and l in spec.ple.layers:
        if ids is None:
            raise ValueError(f"qwen4exp reference: layer {l} carries PLE and needs the token ids")
        x = ple(spec, w, l, x, ids)
    a = residual(w, p + "attn_hyper_connection.", x, s, eps)
    if spec.hybrid.is_linear(l):
        y = gated_deltanet(spec, w, p + "linear_attn.", a.block_in)
    else:
        mask = causal & qsa_mask(spec, w, l, a.block_in, positions)
        y = gated_attention(spec, w, p + "self_attn.", a.block_in, positions, mask)
    x = hc.hc_inject(x, y, a.inject)
    m = residual(w, p + "mlp_hyper_connection.", x, s, eps)
    return hc.hc_inject(x, ffn_for(spec)(spec, w, p, m.block_in), m.inject)


def reference_layer(spec: Qwen4ExpSpec, l: int, h: np.ndarray, taps=None,
                    ids: Sequence[int] | None = None) -> np.ndarray:
    """Layer l on its own: input streams h [T, S*H] at positions 0..T-1 -> output [T, S*H]. The PLE layer also
    needs the sequence's ids [T] (a ValueError names it otherwise)."""
    check_spec(spec)
    h = here(h)
    xp, t = ns(h), len(h)
    tok = None if ids is None else np.asarray([int(i) for i in ids], dtype=np.int64)
    return decoder_layer(spec, as_f64(spec), l, h, tok, xp.arange(t), causal_mask(t, xp))


def final_norm(spec: Qwen4ExpSpec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: the hyper-connection mixer's collapse of the streams h [T, S*H] -> [T, H]
    (qwen4exp has no final RMSNorm; the mixer's grouped norm plays its part)."""
    return st(residual(as_f64(spec), "model.hyper_connection_mixer.", here(h), spec.hc.count, spec.layer.rms_eps,
                       inject=False).block_in)


def forward(spec: Qwen4ExpSpec, ids: Sequence[int]) -> RefOut:
    """Run the whole sequence ids (positions 0..T-1, causal) and keep every layer's streams."""
    check_spec(spec)
    w = as_f64(spec)
    e = embed(spec, ids)
    xp, t = ns(e), len(e)
    tok = np.asarray([int(i) for i in ids], dtype=np.int64)
    positions, causal = xp.arange(t), causal_mask(t, xp)
    x = hc.repeat_streams(e, spec.hc.count)
    hidden = [x]
    for l in range(spec.num_layers):
        with at_layer(l):
            x = decoder_layer(spec, w, l, x, tok, positions, causal)
        hidden.append(x)
    final = final_norm(spec, x)
    return RefOut(logits=head(spec, final), hidden=xp.stack(hidden), final=final)


def kv_rows(spec: Qwen4ExpSpec, taps: RefOut, length: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per full-attention layer l, the K/V rows a fresh run leaves for positions 0..length-1 ((k, v), each
    [length, nkv, d]: k after k_norm and partial rope), from the streams of a run over at least ``length`` ids
    (the block input b of layer l's attention residual, projected as qwen38's ``project_kv``)."""
    w, s, eps = as_f64(spec), spec.hc.count, spec.layer.rms_eps
    out = {}
    for l in range(spec.num_layers):
        if not spec.hybrid.is_linear(l):
            p = f"model.layers.{l}."
            b = residual(w, p + "attn_hyper_connection.", taps.hidden[l, :length], s, eps).block_in
            out[l] = project_kv(spec, w, p + "self_attn.", b, ns(b).arange(length))
    return out


def recurrent_state(spec: Qwen4ExpSpec, taps: RefOut, length: int,
                    ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per linear-attention layer l, the state a fresh run over positions 0..length-1 ends in: (the conv tail
    [K-1, C], the delta-rule state [nv, dk, dv] after position length-1), from the streams of a run over at least
    ``length`` ids and those ids (the PLE layer's input needs them)."""
    w, s, eps, k = as_f64(spec), spec.hc.count, spec.layer.rms_eps, spec.hybrid.linear_conv_kernel_dim
    tok = np.asarray([int(i) for i in ids][:length], dtype=np.int64)
    out = {}
    for l in range(spec.num_layers):
        if spec.hybrid.is_linear(l):
            p, x = f"model.layers.{l}.", here(taps.hidden[l, :length])
            if spec.ple is not None and l in spec.ple.layers:
                x = ple(spec, w, l, x, tok)
            b = residual(w, p + "attn_hyper_connection.", x, s, eps).block_in
            proj, q, kk, v, g, beta = deltanet_inputs(spec, w, p + "linear_attn.", b)
            out[l] = (conv_tail(proj, k), delta_rule(q, kk, v, g, beta)[1])
    return out
