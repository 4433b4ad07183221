"""KDA linear attention (Kimi Delta Attention) as GLM-5.3 uses it, in float64 (docs/FAMILIES_MOE.md section 4.3:
``linear_{head_dim, num_heads, conv_kernel_dim, lower_bound}``; GGUF ``ssm_conv1d_{q,k,v}``, ``ssm_f_a/f_b``,
``ssm_beta``, ``ssm_a``, ``ssm_dt.bias``, ``ssm_g_a/g_b``, ``ssm_norm``; section 8.1 "KDA linear attention").

n heads of width d (keys and values alike, d = linear_head_dim), C = n d; the layer on rows x [T, H] with weights
Wq, Wk, Wv [C, H], conv w [3C, K], f_a [d, H], f_b [C, d], dt_bias [C], A_log [n], Wb [n, H], g_a [d, H],
g_b [C, d], norm w [d], Wo [H, C]:

    [q | k | v] = silu( causal_conv( [x Wq^T | x Wk^T | x Wv^T] ) )      short conv over the 3C channels  [T, 3C]
    q = l2(q_h) / sqrt(d),  k = l2(k_h)                                    per head h                       [T, n, d]
    g = lb * sigmoid( exp(A_log_h) * (f_b f_a x + dt_bias) )               per head AND key channel         [T, n, d]
        (the gate lower bound lb = linear_lower_bound, -5: g in (lb, 0), so no channel decays by more than
         e^lb a row; without a bound g = -exp(A_log_h) softplus(f_b f_a x + dt_bias), unbounded below)
    b = sigmoid(x Wb^T)                                                                                     [T, n]

and per head, with state S [d, d] (keys x values; zeros at the start), for t = 0..T-1:

    S   = diag(exp(g_t)) S                 decay, one rate per key channel (GDN's is one per head)
    u_t = b_t (v_t - S^T k_t)
    S   = S + k_t u_t^T
    o_t = S^T q_t

    out = ( rms(o_h) * w * sigmoid(g_b g_a x)_h ) Wo^T      the gated norm's gate is a SIGMOID (GDN's is silu)

Row t's arithmetic reads only S after row t-1 and row t, so the state after row k of a verify is the state a run
of only the first k rows ends in: rolling back a reject is taking that row's state and the conv tail
buf[k : k+K-1] (``causal_conv``), exact by construction (``kernels.ops.kda`` keeps the per-row states).

Storage points (``st``, as ``kernels.ops.kda`` stores them): the q / k / v, f_a, f_b, b, g_a, g_b projections, the
conv output, its silu, the gated norm's output and Wo. The l2 norms, the gates g and b, the recurrence and its
state are float32 on the device and carry no ``st``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .causal_conv import causal_conv, conv_tail
from .gated_deltanet import l2norm, softplus
from .mlp import silu
from .moe import sigmoid


@dataclass
class KdaWeights:
    """One KDA layer's weights in HF's roles (module docstring); conv [3C, K] over [q | k | v]."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    conv: np.ndarray
    f_a: np.ndarray
    f_b: np.ndarray
    dt_bias: np.ndarray
    a_log: np.ndarray
    b: np.ndarray
    g_a: np.ndarray
    g_b: np.ndarray
    norm: np.ndarray
    o: np.ndarray


@dataclass
class KdaOut:
    """out [T, H]; core [T, n, d] (the recurrence's o, before the gated norm); state [n, d, d] after the last row;
    tail [K-1, 3C] (the conv inputs the next block reads first)."""

    out: np.ndarray
    core: np.ndarray
    state: np.ndarray
    tail: np.ndarray


def forget_gate(f: np.ndarray, dt_bias: np.ndarray, a_log: np.ndarray, d: int,
                lower_bound: float | None) -> np.ndarray:
    """f [T, n*d] (f_b f_a x), dt_bias [n*d], a_log [n] -> g [T, n, d] (module docstring)."""
    xp, f, dt_bias, a_log = common(f, dt_bias, a_log)
    z = (f + dt_bias).reshape(f.shape[0], -1, d)
    rate = xp.exp(a_log)[:, None]
    if lower_bound is not None:
        return lower_bound * sigmoid(rate * z)
    return -rate * softplus(z)


def kda_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, b: np.ndarray,
             state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """q, k [T, n, d] (normed; q scaled), v [T, n, dv], g [T, n, d], b [T, n], state [n, d, dv] or None
    -> (o [T, n, dv], the state after the last row). Sequential, one row at a time."""
    xp, q, k, v, g, b, state = common(q, k, v, g, b, state)
    t, n, d = k.shape
    s = xp.zeros((n, d, v.shape[-1])) if state is None else state.copy()
    out = xp.empty_like(v)
    for i in range(t):
        s = s * xp.exp(g[i])[:, :, None]
        u = b[i][:, None] * (v[i] - xp.einsum("hkv,hk->hv", s, k[i]))
        s = s + k[i][:, :, None] * u[:, None, :]
        out[i] = xp.einsum("hkv,hk->hv", s, q[i])
    return out, s


def gated_norm(x: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """x, z [..., d], w [d] -> x / sqrt(mean x^2 + eps) * w * sigmoid(z)."""
    xp, x, w, z = common(x, w, z)
    return st(x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * w * sigmoid(z))


def kda_attention(x: np.ndarray, w: KdaWeights, heads: int, lower_bound: float | None, eps: float,
                  tail: np.ndarray | None = None, state: np.ndarray | None = None) -> KdaOut:
    """The layer on rows x [T, H] after a conv tail [K-1, 3C] and a state [n, d, d] (None: a fresh sequence)."""
    xp, x = common(x)
    t = x.shape[0]
    c = w.q.shape[0]
    d = c // heads
    pre = xp.concatenate([linear(x, w.q), linear(x, w.k), linear(x, w.v)], axis=-1)
    conv = st(silu(causal_conv(pre, w.conv, tail)))
    q = l2norm(conv[:, :c].reshape(t, heads, d)) * d ** -0.5
    k = l2norm(conv[:, c:2 * c].reshape(t, heads, d))
    v = conv[:, 2 * c:].reshape(t, heads, d)
    g = forget_gate(linear(linear(x, w.f_a), w.f_b), w.dt_bias, w.a_log, d, lower_bound)
    b = sigmoid(linear(x, w.b))
    core, s = kda_rule(q, k, v, g, b, state)
    z = linear(linear(x, w.g_a), w.g_b).reshape(t, heads, d)
    out = linear(gated_norm(core, w.norm, z, eps).reshape(t, c), w.o)
    return KdaOut(out, core, s, conv_tail(pre, w.conv.shape[-1], tail))
