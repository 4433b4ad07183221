"""The NextN layer of a glm5next (GLM-5.3) target, float64 host reference (docs/FAMILIES_MOE.md 4.3 "NextN in the
checkpoint", DRAFTERS.md section 1). No cache: every call runs all of its rows.

The layer lives in the target's file as ``<prefix>layers.{n}.*`` (n = num_hidden_layers, the first NextN block). It
is a plain-residual block (no mHC): MLA without RoPE whose mask comes from its own FULL DSA indexer, then the trunk's
sparse FFN (R2 router with bias, clamped routed experts, the clamped shared expert). Its row at NextN position r
reads the token at r+1 and the target's hidden row at r, and predicts the token at r+2:

    h_r = rms(mean_s x_{L,r,s}, model.norm)          the target's POST-norm row: the norm of the MEAN of the S
                                                      streams of the last layer (what the target's head reads)
    u   = eh_proj( [ rms(E(tok_{r+1}), enorm) ; rms(h_r, hnorm) ] )        [R, 2H] -> [R, H]   EMBEDDING FIRST
    a   = rms(u, input_layernorm)                                                               [R, H]
    mask = DSA(keys a_0..a_{R-1}, queries a, q_resid(a), positions 0..R-1)   full indexer, the tail rule
    y   = u + MLA(q_resid(a), latent(a), mask)                              (``ops.mla``, ``ops.dsa``)
    z   = y + moe(rms(y, post_attention_layernorm))                         (``model.moe``)
    g   = rms(z, shared_head.norm);  logits = g head^T     head = shared_head.head when shipped, else the target's

E is the target's embedding (a copy shipped as ``layers.{n}.embed_tokens`` is not read). Chained drafts (width > 1)
feed g back as the hidden with E(drafted id): the row after the anchor's reads (d_1, g of the anchor's row), and so
on; a chained row attends over (and its indexer keys include) every row before it, real and chained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import Glm5NextSpec

from ...ops import dsa as rdsa
from ...ops import mla as rmla
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns, to_host
from . import model as trunk


def nextn_prefix(spec: Glm5NextSpec) -> str:
    """``<prefix>layers.{n}.``: the first NextN block (ValueError when the file ships none)."""
    if spec.nextn_layers < 1:
        raise ValueError("this glm5next checkpoint ships no NextN layer (num_nextn_predict_layers 0)")
    return trunk.prefix(spec) + f"layers.{spec.num_layers}."


def head_name(spec: Glm5NextSpec) -> str:
    own = nextn_prefix(spec) + "shared_head.head.weight"
    return own if own in spec.tensors else trunk.head_name(spec)


@dataclass(frozen=True)
class NextNOut:
    """Per row: layer_out [R, H] (z, before shared_head.norm), g [R, H] (after it), logits [R, V], ids [R] (argmax,
    lowest index on ties), a [R, H] (the normed block input: the indexer's keys) and latent [R, kl]."""

    layer_out: np.ndarray
    g: np.ndarray
    logits: np.ndarray
    ids: np.ndarray
    a: np.ndarray
    latent: np.ndarray


def embed(spec: Glm5NextSpec, ids: Sequence[int]) -> np.ndarray:
    idx = np.asarray(to_host(ids), dtype=np.int64).reshape(-1)
    return as_f64(spec).rows(trunk.prefix(spec) + "embed_tokens.weight", idx)


def nextn_input(spec: Glm5NextSpec, emb: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """u = eh_proj([rms(emb, enorm) ; rms(hidden, hnorm)]): [R, H] each -> [R, H]."""
    w, eps, p = as_f64(spec), spec.layer.rms_eps, nextn_prefix(spec)
    e = rms_norm(emb, w[p + "enorm.weight"], eps)
    return linear(ns(e).concatenate([e, rms_norm(here(hidden), w[p + "hnorm.weight"], eps)], axis=-1),
                  w[p + "eh_proj.weight"])


def rows(spec: Glm5NextSpec, emb: np.ndarray, hidden: np.ndarray, select_tail: bool | None = None) -> NextNOut:
    """The NextN rows (emb_r = E(tok_{r+1}), hidden_r = h_r) at NextN positions 0..R-1, causal among themselves
    through the indexer's mask. ``select_tail``: the DSA tail rule (default: the spec's)."""
    w, eps, p, d = as_f64(spec), spec.layer.rms_eps, nextn_prefix(spec), spec.dsa
    u = nextn_input(spec, emb, hidden)
    a = rms_norm(u, w[p + "input_layernorm.weight"], eps)
    m = trunk.mla_weights(w, p + "self_attn.")
    qr, c = rmla.q_resid(a, m, eps), rmla.latent(a, m, eps)
    tail = d.select_tail if select_tail is None else select_tail
    mask = rdsa.indexer(a, a, qr, ns(a).arange(len(a)), trunk.indexer_weights(w, p + "self_attn."), d.num_heads,
                        d.kpool, d.topk, tail).mask
    y = st(u + rmla.mla_attention(qr, c, mask, m, spec.mla.num_heads, spec.mla.qk_nope_head_dim))
    z = st(y + trunk.moe(spec, w, p + "mlp.", rms_norm(y, w[p + "post_attention_layernorm.weight"], eps)))
    g = rms_norm(z, w[p + "shared_head.norm.weight"], eps)
    logits = as_f64(spec).project(head_name(spec), g)
    return NextNOut(z, g, logits, ns(logits).argmax(logits, axis=-1), a, c)


def teacher_forced(spec: Glm5NextSpec, ids: Sequence[int], final: np.ndarray) -> NextNOut:
    """Every row r = 0..T-2 of a sequence: reads (ids[r+1], final[r]) and predicts ids[r+2]. final [T, H]: the
    target's post-norm rows over ``ids``."""
    return rows(spec, embed(spec, list(ids)[1:]), here(final)[:len(ids) - 1])


def draft(spec: Glm5NextSpec, ids: Sequence[int], final: np.ndarray, anchor: int, width: int,
          chain_ids: Sequence[int] | None = None) -> NextNOut:
    """``width`` chained drafts after a context of T = len(ids) positions: final [T, H] the target's post-norm rows
    over ``ids``, ``anchor`` the id at position T. Row T-1 reads (anchor, final[T-1]) and drafts d_1; chained row
    T-1+i reads (d_i, g of row T-2+i). d_i is the previous row's argmax, or ``chain_ids[i-1]`` when given (so a
    check can follow another engine's drafts). Returns the ``width`` drafted rows only."""
    t = len(ids)
    toks = list(ids)[1:] + [int(anchor)]
    final = here(final)
    xp, hid = ns(final), list(final[:t])
    for i in range(width):
        with at_layer(i):                  # chained row i's router is choice (ROUTER, i) in a layered pin
            out = rows(spec, embed(spec, toks), xp.stack(hid))
        if i + 1 < width:
            toks.append(int(out.ids[-1]) if chain_ids is None else int(chain_ids[i]))
            hid.append(out.g[-1])
    k = slice(t - 1, t - 1 + width)
    return NextNOut(out.layer_out[k], out.g[k], out.logits[k], out.ids[k], out.a[k], out.latent[k])


def store_rows(spec: Glm5NextSpec, ids: Sequence[int], final: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the draft's store keeps for good for the real rows r = 0..T-2 of a sequence ids [T] (row r reads ids[r+1]
    and final[r]): (the latent [T-1, kl], the normed block inputs a [T-1, H] the indexer's keys are made from)."""
    w, eps, p = as_f64(spec), spec.layer.rms_eps, nextn_prefix(spec)
    u = nextn_input(spec, embed(spec, list(ids)[1:]), here(final)[:len(ids) - 1])
    a = rms_norm(u, w[p + "input_layernorm.weight"], eps)
    return rmla.latent(a, trunk.mla_weights(w, p + "self_attn."), eps), a
