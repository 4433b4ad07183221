"""The in-file MTP block of a deepseek4 (DeepSeek V4) target, float64 host reference (no cache: every call runs
the rows from position 0). docs/FAMILIES_MOE.md 4.4 "In-file MTP (V4)" and "The llama.cpp MTP graph"; tensors
``mtp.0.*`` (``bloomery_cli.families.deepseek4.reader_mtp``).

Row q (position q, its rope position) reads the 4 RAW residual streams h_q [S, H] (the target's last layer output
BEFORE its trained HC head, or the MTP's own recycled output) and the token s_{q+1}, and predicts s_{q+2}:

    hn_s = rms(h_{q,s}, hnorm)                              per stream                                    [S, H]
    en   = rms(E(s_{q+1}), enorm)                           repeated S times                              [S, H]
    u_s  = eh_proj [en ; hn_s],  eh_proj = [e_proj | h_proj] [H, 2H]        EMBEDDING FIRST               [S, H]
    y    = the trunk's mHC block on u (``model.hc_block``, prefix mtp.0.): a SLIDING attention (window W, the main
           rope) over the MTP's own rows, a sqrt-softplus + bias top-k MoE (never a hash layer)            [S, H]
    g    = rms(hyper_head(y; mtp.0.hc_head), mtp.0.norm)    the MTP's own HC head, then shared_head.norm      [H]
    logits = g head^T                                       the TARGET's head                                 [V]

A draft window after a context of T tokens s_0..s_{T-1} with anchor a = s_T: rows q = 0..T-1 read the target's
streams h_q and s_{q+1} (real rows); d_1 = argmax of row T-1. Chained row T+k-1 (k = 1..W-1) reads the block's own
output streams y of row T+k-2 (recycled) and d_k, and gives d_{k+1}; its attention sees its window of the rows
before it (real rows and the chain's own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import Deepseek4MTPSpec, Deepseek4Spec

from ...ops import mhc as rmhc
from ...ops import v4_attention as rv4
from ...ops.moe import at_layer
from ...ops.norm import rms_norm
from ...rounding import linear
from ...weights import as_f64
from ...xp import here, ns
from . import model as trunk

P = "mtp.0."


@dataclass(frozen=True)
class MTPRows:
    """Rows 0..n-1: y (output streams) [n, S, H], g (head input) [n, H], logits [n, V]."""

    y: np.ndarray
    g: np.ndarray
    logits: np.ndarray


def eh_input(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, toks: Sequence[int], hid: np.ndarray) -> np.ndarray:
    """u [n, S, H] of rows reading tokens ``toks`` [n] (s_{q+1}) and streams hid [n, S, H]."""
    w, eps = as_f64(mtp), target.layer.rms_eps
    e = rms_norm(as_f64(target).rows(trunk.P + "embed_tokens.weight", np.asarray(list(toks), dtype=np.int64)),
                 w[P + "enorm.weight"], eps)
    h = rms_norm(here(hid), w[P + "hnorm.weight"], eps)
    xp = ns(h)
    e = xp.repeat(e[:, None, :], h.shape[1], axis=1)
    eh = xp.concatenate([w[P + "e_proj.weight"], w[P + "h_proj.weight"]], 1)
    return linear(xp.concatenate([e, h], -1), eh)


def block(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, u: np.ndarray) -> np.ndarray:
    """The MTP's mHC block on rows u [n, S, H] at positions 0..n-1 -> y [n, S, H]."""
    w, a, eps = as_f64(mtp), target.attn, target.layer.rms_eps
    aw = trunk.attn_weights_at(w, P + "self_attn.", "sliding")
    rope = rv4.Rope(a.rope_theta, a.rope_dim)
    none = ns(u).zeros(len(u), dtype=np.int64)

    def attend(x: np.ndarray) -> np.ndarray:
        return rv4.v4_attention(x, aw, "sliding", a.num_heads, a.window, rope, eps, groups=a.o_groups)[0]

    def moe(b: np.ndarray) -> np.ndarray:
        return trunk.ffn_at(target, w, P + "mlp.", trunk.route_at(target, w, P + "mlp.", "moe", b, none), b)

    return trunk.hc_block(target, w, P, u, attend, moe)


def head_rows(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g [n, H], logits [n, V]) of output streams y [n, S, H]: the MTP's hc_head, its norm, the target's head."""
    w, eps = as_f64(mtp), target.layer.rms_eps
    x = rmhc.hyper_head(y, w[P + "hc_head.hc_fn"], w[P + "hc_head.hc_base"], w[P + "hc_head.hc_scale"],
                        target.hc.eps, eps)
    g = rms_norm(x, w[P + "norm.weight"], eps)
    return g, as_f64(target).project(trunk.head_name(target), g)


def rows(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, toks: Sequence[int], hid: np.ndarray) -> MTPRows:
    """Rows 0..n-1 reading tokens ``toks`` [n] and streams hid [n, S, H] (teacher-forced: every row's hidden is
    given)."""
    y = block(mtp, target, eh_input(mtp, target, toks, hid))
    return MTPRows(y, *head_rows(mtp, target, y))


@dataclass(frozen=True)
class DraftOut:
    """The ``width`` drafted rows: y [W, S, H] (row T+k-1's output streams), logits [W, V], ids [W]."""

    y: np.ndarray
    logits: np.ndarray
    ids: np.ndarray


def draft(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, ids: Sequence[int], streams: np.ndarray, anchor: int,
          width: int, chain_ids: Sequence[int] | None = None) -> DraftOut:
    """One window after a context ``ids`` of T tokens: streams [T, S, H] the target's raw last-layer streams at
    0..T-1, ``anchor`` the token at T. Draft k+1 comes from row T-1+k; it follows ``chain_ids[k]`` when given (so
    a check tracks another engine's drafts)."""
    t = len(ids)
    toks = list(ids[1:]) + [int(anchor)]
    hid = here(streams)[:t]
    xp = ns(hid)
    ys, logits, out = [], [], []
    for k in range(width):
        with at_layer(k):                  # chained row k's router is choice (ROUTER, k) in a layered pin
            run = rows(mtp, target, toks, hid)
        ys.append(run.y[-1])
        logits.append(run.logits[-1])
        out.append(int(xp.argmax(run.logits[-1])))
        toks.append(out[-1] if chain_ids is None else int(chain_ids[k]))
        hid = xp.concatenate([hid, run.y[-1:]])                     # the recycled streams
    return DraftOut(xp.stack(ys), xp.stack(logits), np.asarray(out))


def store_rows(mtp: Deepseek4MTPSpec, target: Deepseek4Spec, seq: Sequence[int], streams: np.ndarray
               ) -> np.ndarray:
    """The MTP's window KV (roped K = V head) [n, d] for good after a window's real rows: seq = the committed
    tokens and the anchor (n + 1 tokens), streams the target's raw streams at 0..n-1."""
    w, a, eps = as_f64(mtp), target.attn, target.layer.rms_eps
    n = len(seq) - 1
    u = eh_input(mtp, target, seq[1:], here(streams)[:n])
    hw = rmhc.mhc_weights(u, w[P + "attn_hc.fn"], w[P + "attn_hc.base"], w[P + "attn_hc.scale"],
                          target.hc.sinkhorn_iters, target.hc.eps, eps)
    x = rms_norm(rmhc.mhc_collapse(u, hw.pre), w[P + "input_layernorm.weight"], eps)
    aw = trunk.attn_weights_at(w, P + "self_attn.", "sliding")
    pos = ns(x).arange(n)
    return rv4.tail_rope(rv4.kv_rows(x, aw, eps), pos, rv4.Rope(a.rope_theta, a.rope_dim))
