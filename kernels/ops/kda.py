"""KDA linear attention on the device (torch, CPU or CUDA): a sequential scan (the engine's verify and commit) and
a chunked form (prefill, training); the math and the storage points are in ``reference.ops.kda`` (name for name;
docs/FAMILIES_MOE.md section 4.3).

Per head, state S [d, dv], prepared inputs q (l2, / sqrt(d)), k (l2) [.., n, d], v [.., n, dv], per-channel
log-decay g [.., n, d] (in (lb, 0) with the lower bound) and strength b [.., n]:

    S_t = diag(exp(g_t)) S_{t-1} + k_t u_t^T,   u_t = b_t (v_t - (diag(exp(g_t)) S_{t-1})^T k_t),   o_t = S_t^T q_t

Everything in the recurrence is float32. Scan (``kda_scan``): row t reads only S_{t-1} and row t, so a row's numbers
do not depend on how many rows share the call, and ``keep=True`` returns the state after every row: the state to
roll back to after k kept rows is states[k-1], bit for bit the state of a scan over those k rows alone.

Chunked (``kda_chunked``, C rows a chunk, entry state S0), with per-channel cumulative log-decay G_t = sum_{s<=t} g_s
([C, d], Gamma_t = exp(G_t)) and D_ts = exp(G_t - G_s) for s <= t (per channel, <= 1, never overflows):

    A[t, s] = b_t sum_c k_t[c] k_s[c] D_ts[c]  (s < t),   M[t, s] = sum_c q_t[c] k_s[c] D_ts[c]  (s <= t)
    (I + A) U = diag(b) V - diag(b) (K o Gamma) S0                              one unit-triangular solve
    O   = (Q o Gamma) S0 + M U
    S_C = diag(Gamma_C) S0 + (K o exp(G_C - G))^T U

G is summed in float64 and each exp(.) rounded once to float32: G_t - G_s of two float32 running sums loses
|G| u (|G| reaches 5 C with the lower bound -5), which exp turns into a relative error of every decay; in float64
the decays are correctly rounded float32 values, as the scan's exp(g_t) products are to within its own rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .causal_conv import causal_conv, with_tail
from .gated_deltanet import l2norm

T = torch.Tensor


@dataclass
class KdaWeights:
    """One KDA layer's weights in HF's roles (``reference.ops.kda``); conv [3C, K] over [q | k | v]."""

    q: T
    k: T
    v: T
    conv: T
    f_a: T
    f_b: T
    dt_bias: T
    a_log: T
    b: T
    g_a: T
    g_b: T
    norm: T
    o: T


@dataclass
class KdaOut:
    """out [N, H] (x's dtype); core [N, n, d] float32; state [n, d, d] after the last row, or after every row
    [N, n, d, d] with keep; buf [K-1+N, 3C] (the conv input with its tail: the tail after row r is buf[r+1:r+K])."""

    out: T
    core: T
    state: T
    buf: T


def forget_gate(f: T, dt_bias: T, a_log: T, d: int, lower_bound: float | None) -> T:
    """f [N, n*d], dt_bias [n*d], a_log [n] -> g [N, n, d] float32: lb sigmoid(exp(A_log) z), or without a bound
    -exp(A_log) softplus(z), z = f + dt_bias."""
    z = (f.float() + dt_bias.float()).unflatten(-1, (-1, d))
    rate = a_log.float().exp()[:, None]
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(rate * z)
    return -rate * F.softplus(z)


def kda_step(s: T, q: T, k: T, v: T, g: T, b: T) -> tuple[T, T]:
    """One row: s [n, d, dv], q/k/g [n, d], v [n, dv], b [n] -> (o [n, dv], s')."""
    s = s * g.exp()[..., None]
    u = b[..., None] * (v - torch.einsum("...kv,...k->...v", s, k))
    s = s + k[..., :, None] * u[..., None, :]
    return torch.einsum("...kv,...k->...v", s, q), s


def kda_scan(q: T, k: T, v: T, g: T, b: T, state: T | None = None, keep: bool = False) -> tuple[T, T]:
    """q/k/g [N, n, d], v [N, n, dv], b [N, n], state [n, d, dv] or None -> (o [N, n, dv], the last state, or every
    row's state [N, n, d, dv] with ``keep``), float32."""
    n, d, dv = k.shape[-2], k.shape[-1], v.shape[-1]
    s = q.new_zeros(n, d, dv, dtype=torch.float32) if state is None else state.float()
    q, k, v, g, b = q.float(), k.float(), v.float(), g.float(), b.float()
    outs, states = [], []
    for t in range(q.shape[0]):
        o, s = kda_step(s, q[t], k[t], v[t], g[t], b[t])
        outs.append(o)
        if keep:
            states.append(s)
    return torch.stack(outs), (torch.stack(states) if keep else s)


def kda_chunked(q: T, k: T, v: T, g: T, b: T, state: T | None = None, chunk: int = 64) -> tuple[T, T]:
    """The same inputs and outputs as ``kda_scan`` (the last state), chunk by chunk (module docstring)."""
    with torch.autocast(q.device.type, enabled=False):
        return _chunked(q, k, v, g, b, state, chunk)


def _chunked(q: T, k: T, v: T, g: T, b: T, state: T | None, chunk: int) -> tuple[T, T]:
    t, n, d = k.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    q, k, v, g = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)).transpose(0, 1) for x in (q, k, v, g))   # [n, Tp, d]
    b = F.pad(b.float(), (0, 0, 0, pad)).transpose(0, 1)                                         # [n, Tp]
    s = q.new_zeros(n, d, dv) if state is None else state.float()
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(chunk, device=q.device)
    outs = []
    for c0 in range(0, t + pad, chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, bc = q[:, sl], k[:, sl], v[:, sl], b[:, sl]
        cum = g[:, sl].double().cumsum(1)                                                   # G_t [n, C, d]
        diff = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(~tri[None, :, :, None], float("-inf"))
        dec = diff.exp().float()                                                            # D_ts [n, C, C, d]
        a = (bc[:, :, None] * torch.einsum("ntc,nsc,ntsc->nts", kc, kc, dec)).tril(-1)
        m = torch.einsum("ntc,nsc,ntsc->nts", qc, kc, dec)
        gam = cum.exp().float()
        rhs = bc[..., None] * (vc - (kc * gam) @ s)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append((qc * gam) @ s + m @ u)
        last = cum[:, -1:, :]                                                               # G_C [n, 1, d]
        s = last.exp().float().transpose(1, 2) * s + (kc * (last - cum).exp().float()).transpose(1, 2) @ u
    return torch.cat(outs, dim=1)[:, :t].transpose(0, 1), s


def gated_norm(x: T, w: T, z: T, eps: float, dtype: torch.dtype) -> T:
    """x, z [..., d], w [d] -> (x / sqrt(mean x^2 + eps) * w * sigmoid(z)) in float32, rounded once to ``dtype``."""
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float() * torch.sigmoid(z.float())).to(dtype)


def kda_attention(x: T, w: KdaWeights, heads: int, lower_bound: float | None, eps: float, tail: T | None = None,
                  state: T | None = None, form: str = "scan", keep: bool = False) -> KdaOut:
    """The layer on rows x [N, H] after a conv tail [K-1, 3C] (None: zeros) and a state (None: zeros);
    ``form`` 'scan' or 'chunked' (no per-row states)."""
    n_rows, c = x.shape[0], w.q.shape[0]
    d = c // heads
    pre = torch.cat([F.linear(x, w.q), F.linear(x, w.k), F.linear(x, w.v)], dim=-1)
    buf = with_tail(pre, w.conv.shape[-1], tail)
    conv = F.silu(causal_conv(buf, w.conv))
    q = l2norm(conv[:, :c].unflatten(-1, (heads, d))) * d ** -0.5
    k = l2norm(conv[:, c:2 * c].unflatten(-1, (heads, d)))
    v = conv[:, 2 * c:].unflatten(-1, (heads, d))
    g = forget_gate(F.linear(F.linear(x, w.f_a), w.f_b), w.dt_bias, w.a_log, d, lower_bound)
    b = torch.sigmoid(F.linear(x, w.b).float())
    if form == "chunked":
        core, s = kda_chunked(q, k, v, g, b, state)
    else:
        core, s = kda_scan(q, k, v, g, b, state, keep)
    z = F.linear(F.linear(x, w.g_a), w.g_b).unflatten(-1, (heads, d))
    out = F.linear(gated_norm(core, w.norm, z, eps, x.dtype).reshape(n_rows, c), w.o)
    return KdaOut(out, core, s, buf)
