"""DeepSeek V4.1's engram site, in float64 (docs/V41.md 7; ik's ``ds4_build_engram``; the seed's ``glue.rs``): it
runs on the streams x [T, S, H] before the site layer's attention sublayer (the attention's HC_PRE and fold then
read the gated streams). Per token, emb [n_cols key_len] the site's table rows (``bloomery_gates.engram_hash``):

    [key | v] = emb Wkv^T                          key [S, H] (one per stream), v [H] (shared)     Wkv [(S+1) H, .]
    k_s = rms(key_s) g^k_s,   q_s = rms(x_s) g^q_s                 unweighted RMS over H, gains [S, H]
    z_s = (k_s . q_s) / sqrt(H);   gate_s = sigmoid(sgn(z_s) sqrt(max(|z_s|, 1e-6)))
    x'_s = x_s + gate_s v

Storage points (``st``): the projection [key | v] and x'; the norms and the gate are float32 on the device.
"""

from __future__ import annotations

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .moe import sigmoid


def engram(x: np.ndarray, emb: np.ndarray, wkv: np.ndarray, k_gain: np.ndarray, q_gain: np.ndarray,
           eps: float) -> np.ndarray:
    """x [T, S, H], emb [T, n_cols key_len], wkv [(S+1) H, n_cols key_len], k_gain / q_gain [S, H] -> x'."""
    xp, x, emb, k_gain, q_gain = common(x, emb, k_gain, q_gain)
    t, s, h = x.shape
    kv = linear(emb, wkv)
    key, v = kv[:, :s * h].reshape(t, s, h), kv[:, s * h:]

    def rms(a):
        return a / xp.sqrt(xp.mean(a * a, axis=-1, keepdims=True) + eps)

    z = xp.sum(rms(key) * k_gain * rms(x) * q_gain, axis=-1) / np.sqrt(h)
    gate = sigmoid(xp.sign(z) * xp.sqrt(xp.maximum(xp.abs(z), 1e-6)))
    return st(x + gate[:, :, None] * v[:, None, :])
