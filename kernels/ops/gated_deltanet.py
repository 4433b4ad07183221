"""The gated delta rule on the device: a sequential scan (the engine) and a chunked form (training).

Per value head, state S [dk, dv], inputs already prepared (q = l2(q)/sqrt(dk), k = l2(k), q/k expanded to
the nv value heads), decay a_t = exp(g_t) and strength b_t (see ``gates``):

    S_t = a_t S_{t-1} + k_t u_t^T,   u_t = b_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t

Everything here is float32 whatever the storage dtype (the state always is), outputs are float32.

Scan (``delta_scan``): one row at a time; row t's arithmetic reads only S_{t-1} and row t, so a row gives
the same numbers however many rows share the call. ``keep=True`` also returns the state after every row
([..., T, nv, dk, dv]; tests). ``delta_recurrent`` is the scan as the engine's verify and commit call it
(outputs and the last state only): the commit replays the kept rows through it and gets the verify's bits
(kernels/families/qwen38/model.py; its Triton twin is kernels/triton/deltanet.py).

Chunked (``delta_chunked``, chunks of C rows, differentiable; training and the engine's prefill): inside a
chunk with entry state S0 and
cumulative log-decay G_t = sum_{s<=t} g_s (gamma_t = exp(G_t)), unrolling the recurrence gives

    u_t = b_t v_t - b_t gamma_t S0^T k_t - sum_{s<t} b_t exp(G_t - G_s) (k_t . k_s) u_s
    =>  (I + A) U = diag(b) V - diag(b gamma) K S0,     A[t, s] = b_t exp(G_t - G_s) k_t . k_s  (s < t)
    O   = diag(gamma) Q S0 + (M o Q K^T) U,              M[t, s] = exp(G_t - G_s)  (s <= t, else 0)
    S_C = gamma_C S0 + (K o exp(G_C - G))^T U

(I + A) is unit lower-triangular: one triangular solve per chunk; chunks run in order. Autocast is switched
off inside (the products stay float32 under a bf16 training autocast).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """float32 x / sqrt(sum x^2 + eps) over the last axis."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gates(alpha: torch.Tensor, beta: torch.Tensor, a_log: torch.Tensor,
          dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """alpha, beta [..., nv], a_log, dt_bias [nv] -> (g = -exp(A_log) softplus(alpha + dt_bias), sigmoid(beta)), f32."""
    g = -a_log.float().exp() * F.softplus(alpha.float() + dt_bias.float())
    return g, torch.sigmoid(beta.float())


def prepare_qk(q: torch.Tensor, k: torch.Tensor, nv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., nk, dk] -> l2-normed f32 [..., nv, dk] (value head j reads key head j // (nv/nk)), q / sqrt(dk)."""
    rep = nv // q.shape[-2]
    q = l2norm(q).repeat_interleave(rep, dim=-2) * (q.shape[-1] ** -0.5)
    return q, l2norm(k).repeat_interleave(rep, dim=-2)


def prepare_torch(buf: torch.Tensor, conv_w: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                  a_log: torch.Tensor, dt_bias: torch.Tensor, nk: int, dk: int, dv: int) -> tuple[torch.Tensor, ...]:
    """The layer's inputs to the delta rule from its conv buffer buf [N, K-1+R, C] (C = 2 nk dk + nv dv) and the
    a / b projections alpha, beta [N, R, nv]: conv, SiLU, split, ``prepare_qk``, ``gates`` ->
    (q, k [N, R, nv, dk], v [N, R, nv, dv], g, b [N, R, nv]), float32 but v (buf's dtype)."""
    from .causal_conv import causal_conv

    n, nv = buf.shape[0], alpha.shape[-1]
    x = F.silu(causal_conv(buf, conv_w))
    r, kd = x.shape[1], nk * dk
    q, k = prepare_qk(x[..., :kd].reshape(n, r, nk, dk), x[..., kd:2 * kd].reshape(n, r, nk, dk), nv)
    g, b = gates(alpha, beta, a_log, dt_bias)
    return q, k, x[..., 2 * kd:].reshape(n, r, nv, dv), g, b


def delta_step(s: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: s [..., nv, dk, dv], q/k [..., nv, dk], v [..., nv, dv], g/b [..., nv] -> (o [..., nv, dv], s')."""
    s = s * g.exp()[..., None, None]
    u = b[..., None] * (v - torch.einsum("...kv,...k->...v", s, k))
    s = s + k[..., :, None] * u[..., None, :]
    return torch.einsum("...kv,...k->...v", s, q), s


def delta_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
               state: torch.Tensor, keep: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k [..., T, nv, dk], v [..., T, nv, dv], g/b [..., T, nv], state [..., nv, dk, dv]
    -> (o [..., T, nv, dv], states [..., T, nv, dk, dv] if keep else the last state [..., nv, dk, dv])."""
    q, k, v, s = q.float(), k.float(), v.float(), state.float()
    outs, states = [], []
    for t in range(q.shape[-3]):
        o, s = delta_step(s, q[..., t, :, :], k[..., t, :, :], v[..., t, :, :], g[..., t, :], b[..., t, :])
        outs.append(o)
        if keep:
            states.append(s)
    return torch.stack(outs, dim=-3), (torch.stack(states, dim=-4) if keep else s)


def delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                    state: torch.Tensor, s_out: torch.Tensor | None = None, *, rows: torch.Tensor | None = None,
                    outputs: bool = True, store: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``delta_scan`` without the per-row states: (o [..., T, nv, dv], the state after row T-1, copied into
    ``s_out`` when given). The torch twin of ``kernels.triton.deltanet.delta_recurrent`` (same signature): ``rows``
    (a device tensor [1], a commit's kept rows) makes the rows past it identity updates, g = b = 0 (S <- exp(0) S +
    k (0 (v - S^T k))^T is S itself, signed zeros aside), where the Triton kernel stops walking; ``outputs`` /
    ``store`` False give None for o / the state."""
    if q.dim() == 4 and q.shape[0] > 1:         # one sequence a scan: the einsums' shapes, and so their bits, as a
        parts = [delta_recurrent(*(x[i:i + 1] for x in (q, k, v, g, b, state)), rows=rows)   # one-layer call's (a
                 for i in range(q.shape[0])]                                  # CPU BLAS may sum a batch another way)
        o, s = torch.cat([x[0] for x in parts]), torch.cat([x[1] for x in parts])
    else:
        if rows is not None:
            live = (torch.arange(g.shape[-2], device=g.device) < rows)[:, None]      # [T, 1]
            g, b = torch.where(live, g, 0.0), torch.where(live, b, 0.0)
        o, s = delta_scan(q, k, v, g, b, state)
    if store and s_out is not None:
        s = s_out.copy_(s)
    return (o if outputs else None), (s if store else None)


def delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                  state: torch.Tensor | None = None, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Same inputs as ``delta_scan`` with leading axes [N] -> (o [N, T, nv, dv], last state). Differentiable."""
    with torch.autocast(q.device.type, enabled=False):
        return _chunked(q, k, v, g, b, state, chunk)


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
             state: torch.Tensor | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, t, nv, dk = k.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    q, k, v = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))   # [N, nv, Tp, d]
    g, b = (F.pad(x.float(), (0, 0, 0, pad)).transpose(1, 2) for x in (g, b))                # [N, nv, Tp]
    s = q.new_zeros(n, nv, dk, dv) if state is None else state.float()
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(chunk, device=q.device)
    outs = []
    for c0 in range(0, t + pad, chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], b[:, :, sl]
        cum = g[:, :, sl].cumsum(-1)                                                      # G_t
        diff = (cum[..., :, None] - cum[..., None, :]).masked_fill(~tri, float("-inf"))
        m = diff.exp()                                                                     # M (s <= t)
        a = (bc[..., :, None] * m * (kc @ kc.transpose(-1, -2))).tril(-1)
        rhs = bc[..., None] * (vc - cum.exp()[..., None] * (kc @ s))
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append(cum.exp()[..., None] * (qc @ s) + (m * (qc @ kc.transpose(-1, -2))) @ u)
        last = cum[..., -1:]
        s = last.exp()[..., None] * s + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    o = torch.cat(outs, dim=2)[:, :, :t].transpose(1, 2)
    return o, s


def gated_rms_norm(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """x, z [..., dv], w [dv] -> (x / sqrt(mean x^2 + eps) * w * silu(z)) in float32, rounded once to ``dtype``."""
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return (y * F.silu(z.float())).to(dtype)
