"""Fused Triton kernels around the Gated DeltaNet's recurrence (the hybrid engine's Triton path): one launch for
conv + SiLU + q/k l2 norm + the gates, one for the gated output norm. The torch composition they replace is
``ops.gated_deltanet.prepare_torch`` / ``gated_rms_norm``; both kernels are row-local (row r reads only its own
conv window buf[r : r+K] and its own projections), so a row's bits never depend on how many rows share a pass.

prep, program (row n*R + r, value head h), key head h // (nv / nk):
    y_c   = round_dtype( sum_{j<K} w[c, j] buf[n, r+j, c] )  (float32 taps, j = 0..K-1)   conv
    x_c   = round_dtype( y_c sigmoid(y_c) )                                                  SiLU
    q     = x_q / sqrt(sum x_q^2 + 1e-6) / sqrt(dk),   k = x_k / sqrt(sum x_k^2 + 1e-6),   v = x_v   [f32]
    g     = -exp(A_log_h) softplus(alpha_h + dt_bias_h),   b = sigmoid(beta_h)                        [f32]
out norm, program (row, head):   out = round_dtype( x / sqrt(mean x^2 + eps) w silu(z) )
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_round(y, DT: tl.constexpr):
    y = y.to(DT).to(tl.float32)                       # the conv output is stored in the run dtype
    return (y * tl.sigmoid(y)).to(DT).to(tl.float32)  # and so is the SiLU's


@triton.jit
def _conv(buf_ptr, w_ptr, base, ch, SR, KT: tl.constexpr, DT: tl.constexpr):
    acc = tl.load(w_ptr + ch * KT).to(tl.float32) * tl.load(buf_ptr + base + ch).to(tl.float32)
    for j in tl.static_range(1, KT):
        acc = acc + tl.load(w_ptr + ch * KT + j).to(tl.float32) * tl.load(buf_ptr + base + j * SR + ch).to(tl.float32)
    return _silu_round(acc, DT)


@triton.jit
def _prep_kernel(buf_ptr, w_ptr, al_ptr, be_ptr, alog_ptr, dtb_ptr, q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, R, SN, SR, scale,
                 NV: tl.constexpr, REP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KT: tl.constexpr,
                 KD: tl.constexpr, DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)               # n * R + r
    h = tl.program_id(1)
    n = row // R
    r = row % R
    base = n * SN + r * SR                            # buf[n, r, 0] (strides SN, SR; channels contiguous)
    kh = h // REP
    dk = tl.arange(0, DK)
    dv = tl.arange(0, DV)
    xq = _conv(buf_ptr, w_ptr, base, kh * DK + dk, SR, KT, DT)
    xk = _conv(buf_ptr, w_ptr, base, KD + kh * DK + dk, SR, KT, DT)
    xv = _conv(buf_ptr, w_ptr, base, 2 * KD + h * DV + dv, SR, KT, DT)
    qn = xq * tl.rsqrt(tl.sum(xq * xq, axis=0) + 1e-6) * scale
    kn = xk * tl.rsqrt(tl.sum(xk * xk, axis=0) + 1e-6)
    o = row * NV + h
    tl.store(q_ptr + o * DK + dk, qn)
    tl.store(k_ptr + o * DK + dk, kn)
    tl.store(v_ptr + o * DV + dv, xv)
    x = tl.load(al_ptr + o).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    tl.store(g_ptr + o, -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * sp)
    tl.store(b_ptr + o, tl.sigmoid(tl.load(be_ptr + o).to(tl.float32)))


@triton.jit
def _out_norm_kernel(x_ptr, w_ptr, z_ptr, out_ptr, eps, DV: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)                 # (row, head)
    c = tl.arange(0, DV)
    x = tl.load(x_ptr + i * DV + c)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / DV + eps) * tl.load(w_ptr + c).to(tl.float32)
    z = tl.load(z_ptr + i * DV + c).to(tl.float32)
    tl.store(out_ptr + i * DV + c, (y * (z * tl.sigmoid(z))).to(out_ptr.dtype.element_ty))


_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def prepare(buf: torch.Tensor, conv_w: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, a_log: torch.Tensor,
            dt_bias: torch.Tensor, nk: int, dk: int, dv: int,
            out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """buf [N, K-1+R, C], conv_w [C, K], alpha/beta [N, R, nv], a_log/dt_bias [nv] -> (q, k [N, R, nv, dk],
    v [N, R, nv, dv], g, b [N, R, nv]) float32, as ``ops.gated_deltanet.prepare_torch``. ``buf`` may be a row-strided
    view (channels contiguous: e.g. the first C columns of a wider projection buffer); ``out``: five contiguous float32
    tensors of those shapes to write into (the graphed engine's static buffers), else new ones."""
    n, rows_k, c = buf.shape
    kt = conv_w.shape[-1]
    r, nv = rows_k - (kt - 1), alpha.shape[-1]
    if buf.stride(-1) != 1:
        buf = buf.contiguous()
    conv_w = conv_w.contiguous()
    alpha, beta = alpha.contiguous(), beta.contiguous()
    dev, f32 = buf.device, torch.float32
    shapes = ((n, r, nv, dk), (n, r, nv, dk), (n, r, nv, dv), (n, r, nv), (n, r, nv))
    if out is None:
        out = tuple(torch.empty(s, device=dev, dtype=f32) for s in shapes)
    elif any(tuple(o.shape) != s or o.dtype != f32 or not o.is_contiguous() for o, s in zip(out, shapes, strict=True)):
        raise ValueError(f"prepare out=: expected contiguous float32 tensors of shapes {shapes}")
    q, k, v, g, b = out
    _prep_kernel[(n * r, nv)](buf, conv_w, alpha, beta, a_log.contiguous(), dt_bias.contiguous(), q, k, v, g, b,
                              r, buf.stride(0), buf.stride(1), dk ** -0.5, NV=nv, REP=nv // nk, DK=dk, DV=dv, KT=kt,
                              KD=nk * dk, DT=_TL[buf.dtype], num_warps=1)
    return q, k, v, g, b


def gated_rms_norm(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """As ``ops.gated_deltanet.gated_rms_norm``: x (float32), z [..., dv], w [dv] -> ``dtype``."""
    dv = x.shape[-1]
    x, z = x.float().contiguous(), z.contiguous()
    out = torch.empty(x.shape, device=x.device, dtype=dtype)
    _out_norm_kernel[(x.numel() // dv,)](x, w.contiguous(), z, out, eps, DV=dv, num_warps=1)
    return out
