"""Grouped-query attention with an explicit boolean mask, in float64."""

from __future__ import annotations

import numpy as np

from ..rounding import st
from ..xp import common, ns


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum exp(x - max) along ``axis``; entries equal to -inf get weight 0."""
    xp = ns(x)
    m = xp.max(x, axis=axis, keepdims=True)
    e = xp.exp(x - m)
    return e / xp.sum(e, axis=axis, keepdims=True)


def causal_mask(t: int, xp=np) -> np.ndarray:
    """mask[i, j] = (j <= i): row i may attend to rows 0..i. Returns bool [T, T] (in namespace ``xp``)."""
    return xp.tril(xp.ones((t, t), dtype=bool))


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """[S, nkv, d] -> [S, nkv * n_rep, d]: query head i reads kv head i // n_rep."""
    return ns(x).repeat(x, n_rep, axis=1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention, GQA.

        scores[h, t, s] = q[t, h] . k[s, h // r] / sqrt(d)       (r = nh / nkv)
        p[h, t, :]      = softmax over s of scores, masked entries (mask[t, s] False) get 0
        out[t, h]       = sum_s p[h, t, s] * v[s, h // r]

    q: [T, nh, d]; k, v: [S, nkv, d]; mask: bool [T, S] (True = may attend), every row needs at
    least one True. Returns [T, nh, d].
    """
    xp, q, k, v, mask = common(q, k, v, mask)
    t, nh, d = q.shape
    s, nkv, _ = k.shape
    if nh % nkv:
        raise ValueError(f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    if mask.shape != (t, s) or not bool(mask.any(axis=1).all()):
        raise ValueError(f"mask must be bool [{t}, {s}] with a True in every row")
    kk = repeat_kv(k, nh // nkv)
    vv = repeat_kv(v, nh // nkv)
    scores = st(xp.einsum("thd,shd->hts", q, kk)) / np.sqrt(d)
    scores = xp.where(mask[None, :, :], scores, -np.inf)
    p = st(softmax(scores, axis=-1))
    return st(xp.einsum("hts,shd->thd", p, vv))


def anchored_mask(pos_q: np.ndarray, pos_kv: np.ndarray, s: int, window: int, causal: bool) -> np.ndarray:
    """speculators' window (``create_anchor_block_mask_mod``), for a block at s..s+B-1 after context 0..s-1:

        mask[t, j] = s - window <= pos_kv[j] < s                              (W context keys, every row)
                     or pos_kv[j] >= s and (not causal or pos_kv[j] <= pos_q[t])   (the block)

    Returns bool [T, S]."""
    xp, pos_q, pos_kv = common(pos_q, pos_kv)
    q, k = pos_q[:, None], pos_kv[None, :]
    block = (k >= s) & ((k <= q) if causal else True)
    return xp.broadcast_to(((k < s) & (k >= s - window)) | block, (q.shape[0], k.shape[1])).copy()


def sliding_mask(pos_q: np.ndarray, pos_kv: np.ndarray, window: int) -> np.ndarray:
    """A causal sliding window over absolute positions (vLLM's, ``formats.sliding``):

        mask[t, s] = pos_q[t] - window < pos_kv[s] <= pos_q[t]          (window keys, the query's own included)

    pos_q [T], pos_kv [S] integers; returns bool [T, S]."""
    _, pos_q, pos_kv = common(pos_q, pos_kv)
    q, k = pos_q[:, None], pos_kv[None, :]
    return (k <= q) & (k > q - window)


def window_mask(pos_q: np.ndarray, pos_k: np.ndarray, window: int | None) -> np.ndarray:
    """mask[t, j] = pos_k[j] <= pos_q[t] and (window is None or pos_q[t] - pos_k[j] < window): causal, and a
    sliding window of ``window`` keys counting the query's own position (HF's ``sliding_window``). bool [T, S]."""
    if window is not None:
        return sliding_mask(pos_q, pos_k, window)
    _, pos_q, pos_k = common(pos_q, pos_k)
    return pos_k[None, :] <= pos_q[:, None]


def sink_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                   sinks: np.ndarray | None) -> np.ndarray:
    """GQA attention with per-head attention sinks and a value width of its own.

        scores[h, t, s] = q[t, h] . k[s, h // r] / sqrt(d)     masked entries -inf
        p[h, t, :]      = softmax over [scores[h, t, :] ; sinks[h]], the sink column dropped (it takes mass only)
        out[t, h]       = sum_s p[h, t, s] v[s, h // r]

    q [T, nh, d], k [S, nkv, d], v [S, nkv, dv], mask bool [T, S], sinks [nh] or None (plain softmax).
    Returns [T, nh, dv]."""
    xp, q, k, v, mask, sinks = common(q, k, v, mask, sinks)
    t, nh, d = q.shape
    s, nkv, _ = k.shape
    if nh % nkv:
        raise ValueError(f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    if mask.shape != (t, s) or not bool(mask.any(axis=1).all()):
        raise ValueError(f"mask must be bool [{t}, {s}] with a True in every row")
    kk, vv = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    scores = st(xp.einsum("thd,shd->hts", q, kk)) / np.sqrt(d)
    scores = xp.where(mask[None, :, :], scores, -np.inf)
    if sinks is not None:
        scores = xp.concatenate([scores, xp.broadcast_to(sinks[:, None, None], (nh, t, 1))], axis=-1)
    p = st(softmax(scores, axis=-1))
    if sinks is not None:
        p = p[..., :-1]
    return st(xp.einsum("hts,shd->thd", p, vv))
