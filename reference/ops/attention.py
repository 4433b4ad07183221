"""Grouped-query attention with an explicit boolean mask, in float64."""

from __future__ import annotations

import numpy as np

from ..rounding import st


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum exp(x - max) along ``axis``; entries equal to -inf get weight 0."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_mask(t: int) -> np.ndarray:
    """mask[i, j] = (j <= i): row i may attend to rows 0..i. Returns bool [T, T]."""
    return np.tril(np.ones((t, t), dtype=bool))


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """[S, nkv, d] -> [S, nkv * n_rep, d]: query head i reads kv head i // n_rep."""
    return np.repeat(x, n_rep, axis=1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention, GQA.

        scores[h, t, s] = q[t, h] . k[s, h // r] / sqrt(d)       (r = nh / nkv)
        p[h, t, :]      = softmax over s of scores, masked entries (mask[t, s] False) get 0
        out[t, h]       = sum_s p[h, t, s] * v[s, h // r]

    q: [T, nh, d]; k, v: [S, nkv, d]; mask: bool [T, S] (True = may attend), every row needs at
    least one True. Returns [T, nh, d].
    """
    t, nh, d = q.shape
    s, nkv, _ = k.shape
    if nh % nkv:
        raise ValueError(f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    if mask.shape != (t, s) or not mask.any(axis=1).all():
        raise ValueError(f"mask must be bool [{t}, {s}] with a True in every row")
    kk = repeat_kv(k, nh // nkv)
    vv = repeat_kv(v, nh // nkv)
    scores = st(np.einsum("thd,shd->hts", q, kk)) / np.sqrt(d)
    scores = np.where(mask[None, :, :], scores, -np.inf)
    p = st(softmax(scores, axis=-1))
    return st(np.einsum("hts,shd->thd", p, vv))


def anchored_mask(pos_q: np.ndarray, pos_kv: np.ndarray, s: int, window: int, causal: bool) -> np.ndarray:
    """speculators' window (``create_anchor_block_mask_mod``), for a block at s..s+B-1 after context 0..s-1:

        mask[t, j] = s - window <= pos_kv[j] < s                              (W context keys, every row)
                     or pos_kv[j] >= s and (not causal or pos_kv[j] <= pos_q[t])   (the block)

    Returns bool [T, S]."""
    q, k = np.asarray(pos_q)[:, None], np.asarray(pos_kv)[None, :]
    block = (k >= s) & ((k <= q) if causal else True)
    return np.broadcast_to(((k < s) & (k >= s - window)) | block, (q.shape[0], k.shape[1])).copy()


def sliding_mask(pos_q: np.ndarray, pos_kv: np.ndarray, window: int) -> np.ndarray:
    """A causal sliding window over absolute positions (vLLM's, ``formats.sliding``):

        mask[t, s] = pos_q[t] - window < pos_kv[s] <= pos_q[t]          (window keys, the query's own included)

    pos_q [T], pos_kv [S] integers; returns bool [T, S]."""
    q, k = np.asarray(pos_q)[:, None], np.asarray(pos_kv)[None, :]
    return (k <= q) & (k > q - window)


def window_mask(pos_q: np.ndarray, pos_k: np.ndarray, window: int | None) -> np.ndarray:
    """mask[t, j] = pos_k[j] <= pos_q[t] and (window is None or pos_q[t] - pos_k[j] < window): causal, and a
    sliding window of ``window`` keys counting the query's own position (HF's ``sliding_window``). bool [T, S]."""
    if window is not None:
        return sliding_mask(pos_q, pos_k, window)
    return np.asarray(pos_k)[None, :] <= np.asarray(pos_q)[:, None]


def sink_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                   sinks: np.ndarray | None) -> np.ndarray:
    """GQA attention with per-head attention sinks and a value width of its own.

        scores[h, t, s] = q[t, h] . k[s, h // r] / sqrt(d)     masked entries -inf
        p[h, t, :]      = softmax over [scores[h, t, :] ; sinks[h]], the sink column dropped (it takes mass only)
        out[t, h]       = sum_s p[h, t, s] v[s, h // r]

    q [T, nh, d], k [S, nkv, d], v [S, nkv, dv], mask bool [T, S], sinks [nh] or None (plain softmax).
    Returns [T, nh, dv]."""
    t, nh, d = q.shape
    s, nkv, _ = k.shape
    if nh % nkv:
        raise ValueError(f"num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    if mask.shape != (t, s) or not mask.any(axis=1).all():
        raise ValueError(f"mask must be bool [{t}, {s}] with a True in every row")
    kk, vv = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    scores = st(np.einsum("thd,shd->hts", q, kk)) / np.sqrt(d)
    scores = np.where(mask[None, :, :], scores, -np.inf)
    if sinks is not None:
        scores = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (nh, t, 1))], axis=-1)
    p = st(softmax(scores, axis=-1))
    if sinks is not None:
        p = p[..., :-1]
    return st(np.einsum("hts,shd->thd", p, vv))
