"""DeepSeek V4.1 ("deepseek41") trunk, float64 host reference (no cache: every call runs the whole sequence); the
V4.1 deltas over ``reference.families.deepseek4.model`` (docs/V41.md), whose routing and MoE it reuses:

    state    (x [T, S, H], lag [T, S]); x_0 = S copies of E(ids), lag_0 = e_0   (``reference.ops.mhc_lagged``)
    layer l  x, pre = lagged_sublayer(x, lag; attn_hc, f -> attention_l(a = rms(f, input_layernorm)))
             x, lag = lagged_sublayer(x, pre; ffn_hc, f -> moe(rms(f, post_attention_layernorm)))
             each sublayer's mixes from its own input streams, its fold from the previous sublayer's pre
    attention_l  V4's (K = V MQA, interleaved tail rope + its conjugate on the output, sinks, grouped output) with
             NO per-head RMS of q; a "sliding" layer attends its window; a "stream" layer also the entries of its
             kv source that its query sees and its topk source chose (``reference.ops.v41_stream``). A layer first
             does its source duties on its own a (``prime``): pool (kv source), index keys (key owner), choose (topk
             source; the candidate source also its mask, ``spec.candidates``), each kept for the layers after it
             in the pass; a masked index source chooses inside the mask.
    engram   on a site (``spec.engram``), before the attention sublayer: x = engram(x; the site's table rows of
             each token's n-grams, ``bloomery_gates.engram_hash``) (``reference.ops.engram``)
    moe      sqrt-softplus + bias top-k, renormalised x routed_scale, clamped SwiGLU + the ungated shared expert
    final    rms(last_mix(x, lag), model.norm) = rms(sum_s pre_{2L-1}[s] x[s], model.norm); logits = final head^T

Taps: ``hidden`` [L+1, T, S+1, H]: hidden[l] = pack_lag(x, lag) entering layer l (hidden[0] the embedding copies and
the one-hot), ``final`` [T, H], ``logits``. ``reference_layer(l, h, taps)`` rebuilds the sources layer l reads from
their input states taps[src] (their a: the fold by their lag, normed), as glm5next's shared indexer reads its full
layer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bloomery_gates.spec import Deepseek41Spec

from ...ops import engram as reng
from ...ops import mhc as rmhc
from ...ops import mhc_lagged as rlag
from ...ops import v41_stream as rs
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...weights import as_f64
from ...xp import here, ns
from ..deepseek4.model import P, Weights, attn_weights_at, check_ids, embed_streams, ffn, head_name, layer_rope
from ..qwen3.model import RefOut

__all__ = ["RefOut", "forward", "reference_layer", "final_norm", "decoder_layer"]


@dataclass
class Streams:
    """One pass's stream state: pre [n, d] per kv source, keys [n, di] per key owner, chosen [T, k] per topk
    source, the candidate mask [T, n] of the candidate source (layer -> array)."""

    pre: dict[int, np.ndarray] = field(default_factory=dict)
    keys: dict[int, np.ndarray] = field(default_factory=dict)
    chosen: dict[int, np.ndarray] = field(default_factory=dict)
    candidates: dict[int, np.ndarray] = field(default_factory=dict)


def check_supported(spec: Deepseek41Spec) -> None:
    """What this reference runs: lagged mixes, the LastMix collapse, sliding / stream layers, routed MoE."""
    if spec.family != "deepseek41":
        raise ValueError(f"reference.families.deepseek41.model got a {spec.family!r} spec")
    if (spec.hc_mix, spec.collapse) != ("lagged", "last_mix") or not set(spec.layer_types) <= {"sliding", "stream"} \
            or set(spec.mlp_types) != {"moe"}:
        raise ValueError("deepseek41 runs lagged mixes + LastMix on sliding / stream layers with routed MoE "
                         "(docs/V41.md 10)")


def _a(spec: Deepseek41Spec, l: int) -> str:
    return P + f"layers.{l}.self_attn."


def stream_key(l: int) -> str:
    """The name of topk source l's stream choice for ``reference.ops.moe.pinned`` (the gates pin the kernel's)."""
    return f"stream choice of layer {l}"


def candidate_key(l: int) -> str:
    """The name of candidate source l's kept blocks for ``reference.ops.moe.pinned`` (the gates pin the kernel's)."""
    return f"candidate blocks of layer {l}"


def prime(spec: Deepseek41Spec, w: Weights, ss: Streams, l: int, a: np.ndarray) -> None:
    """Layer l's source duties on its normed rows a [T, H] (module docstring)."""
    s, p, eps = spec.stream(l), _a(spec, l), spec.layer.rms_eps
    if s is None:
        return
    rope, at = layer_rope(spec, l), spec.attn
    if s.kv_source == l:
        gate = w.get(p + "compressor.gate_proj.weight")
        ss.pre[l] = rs.pooled(a, rs.StreamWeights(w[p + "compressor.kv_proj.weight"], gate,
                                                  w[p + "compressor.kv_norm.weight"]), s.ratio, eps)
    if s.key_source == l:
        ss.keys[l] = rs.index_keys(ss.pre[l], rs.IndexKeyWeights(w[p + "indexer.k_proj.weight"],
                                                                 w[p + "indexer.k_norm.weight"]), s.ratio, rope, eps)
    if s.topk_source == l:
        iw = rs.IndexerWeights(None, w[p + "indexer.q_b_proj.weight"], w[p + "indexer.weights_proj.weight"])
        keys, aw, cm = ss.keys[s.key_source], attn_weights_at(w, p, "sliding"), spec.candidates
        allow = ss.candidates[cm.source_layer] if spec.masked(l) else None
        ss.chosen[l] = rs.stream_choice(keys, a, aw, iw, at.num_heads, at.index_heads, at.index_topk, s.ratio, rope,
                                        eps, stream_key(l), allow)
        if cm is not None and cm.source_layer == l:
            scores = rs.stream_scores(keys, a, aw, iw, at.num_heads, at.index_heads, s.ratio, rope, eps)
            b = rs.block_scores(scores, rs.entries_seen(len(a), keys.shape[0], s.ratio), cm.block_size)
            blocks = rs.candidate_blocks(b, cm.topk_blocks, candidate_key(l))
            ss.candidates[l] = rs.candidate_mask(blocks, keys.shape[0], cm.block_size)


def attention(spec: Deepseek41Spec, w: Weights, l: int, a: np.ndarray, ss: Streams) -> np.ndarray:
    """Layer l's attention on its normed rows a [T, H] (positions 0..T-1), its sources' state in ``ss``."""
    s, at, rope = spec.stream(l), spec.attn, layer_rope(spec, l)
    entries = rs.stream_entries(ss.pre[s.kv_source], s.ratio, rope) if s is not None else None
    return rs.stream_attention(a, attn_weights_at(w, _a(spec, l), "sliding"), at.num_heads, at.window, rope,
                               spec.layer.rms_eps, at.o_groups, entries, s.ratio if s else 0,
                               ss.chosen[s.topk_source] if s is not None else None)


def input_rows(spec: Deepseek41Spec, w: Weights, l: int, state: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Layer l's attention input from its input state [T, S+1, H]: rms(fold of the (engram-gated) streams by the
    lag, input_layernorm)."""
    x, lag = rlag.unpack_lag(state)
    x = engram_site(spec, w, l, x, ids)
    return rms_norm(rmhc.mhc_collapse(x, lag), w[P + f"layers.{l}.input_layernorm.weight"], spec.layer.rms_eps)


def engram_site(spec: Deepseek41Spec, w: Weights, l: int, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Layer l's engram site on the streams x [T, S, H] (``reference.ops.engram``; x itself off a site)."""
    e = spec.engram
    site = e.site(l) if e is not None else None
    if site is None:
        return x
    p = P + f"layers.{l}.engram."
    idx = ns(x).asarray(e.rows(site, [int(i) for i in ids]), dtype=np.int64)
    emb = w.rows(p + "embed.weight", idx.reshape(-1)).reshape(len(ids), -1)
    return reng.engram(x, emb, w[p + "wkv.weight"], w[p + "k_norm.weight"], w[p + "q_norm.weight"],
                       spec.layer.rms_eps)


def decoder_layer(spec: Deepseek41Spec, w: Weights, l: int, state: np.ndarray, ids: np.ndarray,
                  ss: Streams) -> np.ndarray:
    """Layer l over the whole sequence: state [T, S+1, H] (streams + lag) -> the next [T, S+1, H]; an engram site
    gates the streams first (its attention's mixes and fold read the gated streams)."""
    hc, eps, p = spec.hc, spec.layer.rms_eps, P + f"layers.{l}."

    def attend(f: np.ndarray) -> np.ndarray:
        a = rms_norm(f, w[p + "input_layernorm.weight"], eps)
        prime(spec, w, ss, l, a)
        return attention(spec, w, l, a, ss)

    x, lag = rlag.unpack_lag(state)
    x = engram_site(spec, w, l, x, ids)
    x, pre = rlag.lagged_sublayer(x, lag, w[p + "attn_hc.fn"], w[p + "attn_hc.base"], w[p + "attn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps, attend)
    x, lag = rlag.lagged_sublayer(x, pre, w[p + "ffn_hc.fn"], w[p + "ffn_hc.base"], w[p + "ffn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda f: ffn(spec, w, l, rms_norm(f, w[p + "post_attention_layernorm.weight"],
                                                                     eps), ids))
    return rlag.pack_lag(x, lag)


def sources(spec: Deepseek41Spec, l: int) -> list[int]:
    """The earlier layers whose source duties layer l reads (its kv and topk sources, the topk source's key
    owner; the candidate source and its key owner where that choice is masked), in layer order."""
    s = spec.stream(l)
    if s is None:
        return []
    t = spec.stream(s.topk_source)
    need = {s.kv_source, s.topk_source, t.key_source if t else s.key_source}
    if spec.masked(s.topk_source):                    # its choice reads the candidate source's mask
        c = spec.candidates.source_layer
        need |= {c, spec.stream(c).key_source}
    return sorted(need - {l})


def reference_layer(spec: Deepseek41Spec, l: int, h: np.ndarray, taps=None, ids=None) -> np.ndarray:
    """Layer l on its own: its input state h [T, S+1, H] at positions 0..T-1 -> [T, S+1, H]; a stream layer's
    sources from their input states ``taps[src]``, an engram site's rows from the token ids (each required where
    read: a ValueError names the layer)."""
    check_supported(spec)
    w, ss = as_f64(spec), Streams()
    need = sources(spec, l)
    if need and taps is None:
        raise ValueError(f"deepseek41 layer {l} reads the streams of layers {need}: pass the pass's taps")
    if ids is None and spec.engram is not None and any(spec.engram.site(j) is not None for j in [*need, l]):
        raise ValueError(f"deepseek41 layer {l} reads an engram site: pass the rows' token ids")
    tok = check_ids(spec, ids) if ids is not None else ns(here(h)).zeros(len(h), dtype=np.int64)
    for src in need:
        prime(spec, w, ss, src, input_rows(spec, w, src, here(taps[src]), tok))
    return decoder_layer(spec, w, l, here(h), tok, ss)


def final_norm(spec: Deepseek41Spec, h: np.ndarray) -> np.ndarray:
    """The rows that enter the head: rms(last_mix(streams, lag), model.norm) from the state h [T, S+1, H]."""
    x, lag = rlag.unpack_lag(here(h))
    return rms_norm(rlag.last_mix(x, lag), as_f64(spec)[P + "norm.weight"], spec.layer.rms_eps)


def forward(spec: Deepseek41Spec, ids: Sequence[int]) -> RefOut:
    """The whole sequence ids (positions 0..T-1) with every layer's input state kept."""
    check_supported(spec)
    w, tok, ss = as_f64(spec), check_ids(spec, ids), Streams()
    x = embed_streams(spec, tok)
    state = rlag.pack_lag(x, rlag.lag_init(x))
    hidden = [state]
    for l in range(spec.num_layers):
        with at_layer(l):
            state = decoder_layer(spec, w, l, state, tok, ss)
        hidden.append(state)
    final = final_norm(spec, state)
    return RefOut(logits=w.project(head_name(spec), final), hidden=ns(state).stack(hidden), final=final)
