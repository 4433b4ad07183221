"""The gated delta rule (Gated DeltaNet, Yang et al. 2024) as Qwen3.5 uses it, in float64.

Per value head (nv heads; q/k already expanded so value head j reads key head j // (nv / nk)), with
state S [dk, dv] (zeros at the start of a sequence), for t = 0..T-1:

    q_t = l2(q_t) / sqrt(dk),  k_t = l2(k_t)           l2(x) = x / sqrt(sum x^2 + 1e-6)
    a_t = exp(g_t),  g_t = -exp(A_log) * softplus(alpha_t + dt_bias)   (decay in (0, 1])
    b_t = sigmoid(beta_t)                                               (write strength)
    S   = a_t S                                        decay
    u_t = b_t (v_t - S^T k_t)                          delta: what the decayed state gets wrong
    S   = S + k_t u_t^T                                write
    o_t = S^T q_t                                      read   [dv]

i.e. S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T. The output is then normed per head with
a plain gated RMSNorm: rms(o) * w * silu(z) (w NOT zero-centred).
"""

from __future__ import annotations

import numpy as np

from ..rounding import st
from ..xp import common, ns
from .mlp import silu

L2_EPS = 1e-6


def l2norm(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
    """x / sqrt(sum over the last axis of x^2 + eps)."""
    xp = ns(x)
    return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + eps)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), overflow-free."""
    return ns(x).logaddexp(0.0, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + ns(x).tanh(0.5 * x))


def gates(alpha: np.ndarray, beta: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """alpha, beta [T, nv] (the a / b projections), a_log, dt_bias [nv] -> (g log-decay, b strength) [T, nv]."""
    xp, alpha, beta, a_log, dt_bias = common(alpha, beta, a_log, dt_bias)
    return -xp.exp(a_log) * softplus(alpha + dt_bias), sigmoid(beta)


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, b: np.ndarray,
               state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """q, k [T, nv, dk] (normed and scaled), v [T, nv, dv], g, b [T, nv], state [nv, dk, dv] or None
    -> (o [T, nv, dv], the state after the last row [nv, dk, dv]). Sequential, one row at a time."""
    xp, q, k, v, g, b, state = common(q, k, v, g, b, state)
    t, nv, dk = k.shape
    s = xp.zeros((nv, dk, v.shape[-1])) if state is None else state.copy()
    out = xp.empty_like(v)
    for i in range(t):
        s = s * xp.exp(g[i])[:, None, None]
        u = b[i][:, None] * (v[i] - xp.einsum("hkv,hk->hv", s, k[i]))
        s = s + k[i][:, :, None] * u[:, None, :]
        out[i] = xp.einsum("hkv,hk->hv", s, q[i])
    return out, s


def gated_rms_norm(x: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """x, z [..., dv], w [dv] -> x / sqrt(mean x^2 + eps) * w * silu(z)."""
    xp, x, w, z = common(x, w, z)
    return st(x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * w * silu(z))
