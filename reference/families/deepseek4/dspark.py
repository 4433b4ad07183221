"""llama.cpp's DSV4 DSpark block draft (GGUF arch "dflash", docs/FAMILIES_MOE.md 5.1; ``src/models/dflash.cpp``
``graph_dsv4`` and ``build_dspark_markov_head``), float64 host reference. No cache: one call = one block.

Context (the "embedding batch"), positions p = 0..s-1, taps[l] the target's S streams entering layer l:

    feat_p = concat_l mean_s taps[l + 1][p, s]     l in target_layer_ids (GGUF dflash.target_layers = l + 1)  [n H]
             s < S only (``target_streams``: a deepseek41 tap [S+1, H] carries its lag row last, dropped)
    u_p    = rms(feat_p fc^T, enc_norm)                                                                      [H]
    ctx_i[p] = rope(rms(u_p Wkv_i^T, kv_norm_i), p)      stage i's K = V (no input norm: llama.cpp's inject)  [d]

Block (the "token batch") y = [x_s, m x (B-1)] at positions s..s+B-1 (m = tokenizer.ggml.mask_token_id):

    x = E(y) repeated into S streams                                                                   [B, S, H]
    stage i (STAGE[hc_mix], prefix layers.{i}.): "own" = the trunk's mHC block (``model.hc_block``); "lagged"
        (V4.1, FAMILIES_MOE.md 5.2) = two ``reference.ops.mhc_lagged.lagged_sublayer``s on the packed state
        [B, S+1, H] = (streams, lag) (``pack_lag``, stored): x_0 = S copies, lag_0 = e_0 (``streams_in``), the
        attention folds by the lag, the MoE by the attention's pre, the state carries the MoE's pre out:
        attention (``window_attention``): V4's shared-KV MQA of the normed rows a (``reference.ops.v4_attention``:
            q_heads (the per-head q norm iff q_head_norm; V4.1 none), the interleaved tail rope, sinks, the
            conjugate rope on the output, the grouped output) over
            keys [ctx_i[j] for j < s ; the block rows' own K = V], a key at p_k seen by the query at p_q iff
            p_q - p_k < W (llama.cpp's non-causal SWA: block keys ahead of the query are seen)
        MoE: sqrt-softplus + bias top-k (never hashed), renormalised x routed_scale, + the ungated shared expert
    g      = COLLAPSE[collapse](x)      "hc_head": hyper_head(x; hc_head) (V4's trained head, output_hc_*)  [B, H]
                                        "last_mix": sum_s lag[s] x[s] of the packed state (V4.1, no head)
    base   = rms(g, norm) head^T        head: the file's ``output`` if any, else the target's               [B, V]
    logits_k = st(base_k + st(W2 W1[prev_k])), prev_0 = x_s, prev_k = argmax logits_{k-1} (greedy chain)  [B, V]
    z_k    = proj . [g_k ; W1[prev_k]] + b,  c_k = sigmoid(z_k)        the PRE-norm collapse g (t_embd); b = 0
                                                                       when the file has none (V4.1's conf_proj)

Row k predicts the token at s+k+1 (anchor-first: B drafts). The Markov / cut helpers are the dense DSpark's
(``reference.drafts.dspark``): ``markov_decode`` (the chain or the teacher-forced rows), ``cut_length``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bloomery_gates.spec import Deepseek4DSparkSpec, Deepseek4Spec

from ...drafts.dspark import DSparkRefOut, block_context, markov_decode
from ...ops import mhc as rmhc
from ...ops import mhc_lagged as rlag
from ...ops import v4_attention as rv4
from ...ops.attention import sink_attention
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns
from . import model as trunk

Weights = trunk.Weights


def hc_head_collapse(spec: Deepseek4DSparkSpec, w: Weights, x: np.ndarray) -> np.ndarray:
    """V4's trained HC head: x [N, S, H] -> [N, H]."""
    return rmhc.hyper_head(x, w["hc_head.hc_fn"], w["hc_head.hc_base"], w["hc_head.hc_scale"], spec.hc.eps,
                           spec.layer.rms_eps)


def last_mix_collapse(spec: Deepseek4DSparkSpec, w: Weights, x: np.ndarray) -> np.ndarray:
    """V4.1's LastMix: the packed state x [N, S+1, H] -> sum_s lag[s] x[s] [N, H]."""
    return rlag.last_mix(*rlag.unpack_lag(x))


COLLAPSE: dict[str, Callable[[Deepseek4DSparkSpec, Weights, np.ndarray], np.ndarray]] = {
    "hc_head": hc_head_collapse, "last_mix": last_mix_collapse}


def target_streams(hidden: np.ndarray, streams: int) -> np.ndarray:
    """hidden [L+1, T, S (+1), H] -> the S hc streams [L+1, T, S, H] (a deepseek41 tap's lag row dropped)."""
    return hidden[:, :, :streams]


def features(hidden: np.ndarray, layer_ids: Sequence[int]) -> np.ndarray:
    """hidden [L+1, T, S, H] -> [T, n H]: the stream means entering layer l + 1 for l in layer_ids."""
    xp = ns(hidden)
    return xp.concatenate([rmhc.mhc_head(hidden[l + 1]) for l in layer_ids], axis=-1)


def encode(w: Weights, feats: np.ndarray, eps: float) -> np.ndarray:
    return rms_norm(linear(feats, w["fc.weight"]), w["enc_norm.weight"], eps)


def rope_of(spec: Deepseek4DSparkSpec) -> rv4.Rope:
    return rv4.Rope(spec.attn.rope_theta, spec.attn.rope_dim)


def context_kv(spec: Deepseek4DSparkSpec, w: Weights, i: int, u: np.ndarray, pos: np.ndarray) -> np.ndarray:
    aw = trunk.attn_weights_at(w, f"layers.{i}.self_attn.", "sliding")
    return rv4.tail_rope(rv4.kv_rows(u, aw, spec.layer.rms_eps), pos, rope_of(spec))


def window_allowed(pos_q: np.ndarray, pos_k: np.ndarray, key_ok: np.ndarray, window: int) -> np.ndarray:
    return key_ok & ((pos_q[:, None] - pos_k[None, :]) < window)


def window_attention(spec: Deepseek4DSparkSpec, w: Weights, i: int, a: np.ndarray, pos: np.ndarray,
                     ctx: np.ndarray, ctx_pos: np.ndarray, ctx_ok: np.ndarray, blk_ok: np.ndarray) -> np.ndarray:
    """Stage i's attention of rows a [R, H] at pos [R] over [ctx [C, d] ; their own K = V] -> [R, H]."""
    s, eps, rope = spec.attn, spec.layer.rms_eps, rope_of(spec)
    xp = ns(a)
    aw = trunk.attn_weights_at(w, f"layers.{i}.self_attn.", "sliding")
    _, q = rv4.q_heads(a, aw, s.num_heads, eps, spec.q_head_norm)
    q = rv4.tail_rope(q, pos, rope)
    own = rv4.tail_rope(rv4.kv_rows(a, aw, eps), pos, rope)
    keys = xp.concatenate([ctx, own])[:, None, :]
    allowed = window_allowed(pos, xp.concatenate([ctx_pos, pos]), xp.concatenate([ctx_ok, blk_ok], axis=1),
                             s.window)
    o = rv4.tail_rope(sink_attention(q, keys, keys, allowed, aw.sinks), pos, rope, conjugate=True)
    return rv4.grouped_output(o.reshape(a.shape[0], -1), aw.o_a, aw.o_b, s.o_groups)


def moe_of(spec: Deepseek4DSparkSpec, w: Weights, i: int) -> Callable[[np.ndarray], np.ndarray]:
    """Stage i's MoE on normed rows b [R, H]: sqrt-softplus + bias top-k (never hashed) + the shared expert."""
    m = f"layers.{i}.mlp."

    def moe(b: np.ndarray) -> np.ndarray:
        none = ns(b).zeros(len(b), dtype=np.int64)
        return trunk.ffn_at(spec, w, m, trunk.route_at(spec, w, m, "moe", b, none), b)
    return moe


def own_stage(spec: Deepseek4DSparkSpec, w: Weights, i: int, x: np.ndarray,
              attend: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """V4: the trunk's mHC block on streams x [R, S, H]."""
    return trunk.hc_block(spec, w, f"layers.{i}.", x, attend, moe_of(spec, w, i))


def lagged_stage(spec: Deepseek4DSparkSpec, w: Weights, i: int, x: np.ndarray,
                 attend: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """V4.1: two lagged sublayers on the packed state x [R, S+1, H] -> the packed (streams, the MoE's pre)."""
    p, hc, eps = f"layers.{i}.", spec.hc, spec.layer.rms_eps
    moe = moe_of(spec, w, i)
    y, lag = rlag.unpack_lag(x)
    y, pre = rlag.lagged_sublayer(y, lag, w[p + "attn_hc.fn"], w[p + "attn_hc.base"], w[p + "attn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda f: attend(rms_norm(f, w[p + "input_layernorm.weight"], eps)))
    y, lag = rlag.lagged_sublayer(y, pre, w[p + "ffn_hc.fn"], w[p + "ffn_hc.base"], w[p + "ffn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda f: moe(rms_norm(f, w[p + "post_attention_layernorm.weight"], eps)))
    return rlag.pack_lag(y, lag)


STAGE: dict[str, Callable[..., np.ndarray]] = {"own": own_stage, "lagged": lagged_stage}


def stage(spec: Deepseek4DSparkSpec, w: Weights, i: int, x: np.ndarray,
          attend: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Stage i of the spec's HC mix (``STAGE``)."""
    return STAGE[spec.hc_mix](spec, w, i, x, attend)


def streams_in(spec: Deepseek4DSparkSpec, h: np.ndarray) -> np.ndarray:
    """Embedded rows h [R, H] -> S copies [R, S, H] ("own") or packed with lag_0 [R, S+1, H] ("lagged")."""
    x = ns(h).repeat(h[:, None, :], spec.hc.count, axis=1)
    return rlag.pack_lag(x, rlag.lag_init(x)) if spec.hc_mix == "lagged" else x


def draft_embed(draft: Deepseek4DSparkSpec, target: Deepseek4Spec, ids: Sequence[int]) -> np.ndarray:
    idx = np.asarray(list(ids), dtype=np.int64)
    if "embed_tokens.weight" in draft.tensors:
        return as_f64(draft).rows("embed_tokens.weight", idx)
    return as_f64(target).rows(trunk.P + "embed_tokens.weight", idx)


def draft_head(draft: Deepseek4DSparkSpec, target: Deepseek4Spec, x: np.ndarray) -> np.ndarray:
    if "lm_head.weight" in draft.tensors:
        return as_f64(draft).project("lm_head.weight", x)
    return as_f64(target).project(trunk.head_name(target), x)


def context_rows(draft: Deepseek4DSparkSpec, hidden: np.ndarray, s: int) -> list[np.ndarray]:
    """Each stage's context K = V [s, d] of the target's taps hidden [L+1, >= s, S, H] (positions 0..s-1)."""
    w = as_f64(draft)
    h = target_streams(here(hidden)[:, :s], draft.hc.count)
    u = encode(w, features(h, draft.target_layer_ids), draft.layer.rms_eps)
    pos = ns(u).arange(s)
    return [context_kv(draft, w, i, u, pos) for i in range(draft.num_layers)]


def backbone(draft: Deepseek4DSparkSpec, target: Deepseek4Spec, ctx: list[np.ndarray], anchor_id: int
             ) -> np.ndarray:
    """The B block rows through every stage after a context of s = len(ctx[0]) positions -> [n_layers, B, S, H]
    ([n_layers, B, S+1, H] packed with the lag when "lagged")."""
    w, b, s = as_f64(draft), draft.block_size, len(ctx[0])
    h = draft_embed(draft, target, [anchor_id] + [draft.mask_token_id] * (b - 1))
    xp = ns(h)
    x = streams_in(draft, h)
    pos, ctx_pos = xp.arange(s, s + b), xp.arange(s)
    ctx_ok, blk_ok = xp.ones((b, s), dtype=bool), xp.ones((b, b), dtype=bool)
    out = []
    for i in range(draft.num_layers):
        with at_layer(i):                  # stage i's router is choice (ROUTER, i) in a layered pin
            x = stage(draft, w, i, x, lambda a, i=i: window_attention(draft, w, i, a, pos, ctx[i], ctx_pos, ctx_ok,
                                                                      blk_ok))
        out.append(x)
    return xp.stack(out)


def forward(draft: Deepseek4DSparkSpec, target: Deepseek4Spec, taps, anchor_id: int, s: int | None = None,
            prev: Sequence[int] | None = None) -> DSparkRefOut:
    """Draft one block after context positions 0..s-1 (s defaults to all rows of ``taps``, the target's RefOut
    with hidden [L+1, T, S, H]); ``prev`` None runs the greedy chain, a list of B ids (the anchor first)
    teacher-forces the Markov inputs. ``final`` is the pre-norm collapse g, ``layer_out`` [n_layers, B, S, H]."""
    s = block_context(draft, taps, anchor_id, s, prev)
    b, w = draft.block_size, as_f64(draft)
    ctx = context_rows(draft, taps.hidden, s)
    layer_out = backbone(draft, target, ctx, anchor_id)
    xp = ns(layer_out)
    g = COLLAPSE[draft.collapse](draft, w, layer_out[-1])
    base = draft_head(draft, target, rms_norm(g, w["norm.weight"], draft.layer.rms_eps))
    logits, prev, e = markov_decode(draft, base, anchor_id, prev)
    conf_logits, confidence = None, xp.ones(b)
    if draft.confidence:
        z = xp.concatenate([g, e], axis=-1) @ w["confidence_head.proj.weight"][0]
        b0 = w["confidence_head.proj.bias"][0] if "confidence_head.proj.bias" in draft.tensors else 0.0
        conf_logits = st(z + b0)                                  # the V4.1 DSpark's conf_proj has no bias
        confidence = 1.0 / (1.0 + xp.exp(-conf_logits))
    return DSparkRefOut(logits=logits, base=base, layer_out=layer_out, ids=xp.argmax(logits, axis=-1), prev=prev,
                        confidence=confidence, conf_logits=conf_logits, u=ctx[0], final=g)
