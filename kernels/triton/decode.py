"""Fused Triton kernels for graph-captured decode passes (same signatures and rules as the torch ops in
``kernels.graphs``): one launch each for the RMSNorm, the q/k norm + RoPE + KV-cache store, the SiLU gate,
and a split-key (flash-decoding) attention of two launches.

Attention over the static cache [nkv, cap, d]: the query rows of one kv head are folded (row m = r*g + i for
query head kv*g + i, position p0 + r); program (kv, split, m-block) scores the keys of its split against a
BM-row tile with an online softmax (max initialised to -1e30, so a fully masked chunk leaves its state
unchanged) and writes (max, sum, acc) per row; the combine program rescales and sums the splits. Chunk
bounds depend only on cap, never on R, so a row's numbers do not depend on how many rows share its pass.
Forward only.

Tried and dropped on the H200 (8B chained decode, one card each: results/h200/speed/e360aaa-fuse, 62b2948-ab): the
split kernel's last program of each kv head combining the splits itself (an arrival counter, one launch fewer),
224.7 against 235.3 tok/s: a serial tail after the atomic, where the combine launch costs ~1.3 us a layer under
PDL; the combine loading every split's partials at once instead of its loop, and V's tile loaded beside K's, 235.5
and 235.5 against 235.6: no change.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import graphs
from . import gemv, interpreting, pdl, pdl_policy

BM, BN, SPLITS = 64, 64, 16


@triton.jit
def _rms_kernel(x_ptr, w_ptr, out_ptr, H, eps, BH: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BH)
    m = c < H
    x = tl.load(x_ptr + r * H + c, mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + c, mask=m, other=0.0)
    tl.store(out_ptr + r * H + c, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _qk_rope_kernel(qkv_ptr, stride_r, qn_ptr, kn_ptr, cos_ptr, sin_ptr, p0_ptr, kc_ptr, vc_ptr, cap, eps,
                    NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    r = tl.program_id(0)
    hd = tl.program_id(1)
    half = tl.arange(0, D // 2)
    p = tl.load(p0_ptr) + r
    row = qkv_ptr + r.to(tl.int64) * stride_r + hd * D
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + D // 2 + half).to(tl.float32)
    if hd < NQ + NKV:
        rstd = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
        if hd < NQ:
            w1 = tl.load(qn_ptr + half)
            w2 = tl.load(qn_ptr + D // 2 + half)
        else:
            w1 = tl.load(kn_ptr + half)
            w2 = tl.load(kn_ptr + D // 2 + half)
        dt = qkv_ptr.dtype.element_ty
        y1 = (x1 * rstd * w1).to(dt).to(tl.float32)         # the normed head is rounded once, as in eager
        y2 = (x2 * rstd * w2).to(dt).to(tl.float32)
        c1 = tl.load(cos_ptr + p * D + half)
        s1 = tl.load(sin_ptr + p * D + half)
        c2 = tl.load(cos_ptr + p * D + D // 2 + half)
        s2 = tl.load(sin_ptr + p * D + D // 2 + half)
        o1 = (y1 * c1 - y2 * s1).to(dt)
        o2 = (y2 * c2 + y1 * s2).to(dt)
        if hd < NQ:
            tl.store(row + half, o1)
            tl.store(row + D // 2 + half, o2)
        else:
            dst = kc_ptr + ((hd - NQ) * cap + p) * D
            tl.store(dst + half, o1)
            tl.store(dst + D // 2 + half, o2)
    else:
        dst = vc_ptr + ((hd - NQ - NKV) * cap + p) * D
        tl.store(dst + half, x1.to(vc_ptr.dtype.element_ty))
        tl.store(dst + D // 2 + half, x2.to(vc_ptr.dtype.element_ty))


@triton.jit
def _attn_split_kernel(q_ptr, stride_r, kc_ptr, vc_ptr, p0_ptr, R, cap, first, scale, m_ptr, l_ptr, o_ptr, RG_PAD,
                       NKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr, F32DOT: tl.constexpr,
                       PDL: tl.constexpr):
    pdl.enter(PDL)
    kv = tl.program_id(0)
    sp = tl.program_id(1)
    mb = tl.program_id(2)
    p0 = tl.load(p0_ptr)
    rows = mb * BM + tl.arange(0, BM)
    rmask = rows < R * G
    r = rows // G
    d = tl.arange(0, D)
    if CAUSAL:  # noqa: SIM108  (a constexpr branch: one side is compiled)
        lim = p0 + r
    else:
        lim = p0 + R - 1 + r * 0
    q = tl.load(q_ptr + r.to(tl.int64)[:, None] * stride_r + (kv * G + rows % G)[:, None] * D + d[None, :],
                mask=rmask[:, None], other=0.0)
    m_i = tl.full([BM], -1e30, tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    top = p0 + R - 1
    kbase = kv.to(tl.int64) * cap
    for i in range(NB):                 # the split's NB blocks (constexpr bounds: the CPU interpreter takes no tensor
        start = sp * (NB * BN) + i * BN  # bounds with numpy 2); the last split's tail past cap is skipped
        if (start <= top) & (start < cap):
            keys = start + tl.arange(0, BN)
            kmask = keys < cap
            k = tl.load(kc_ptr + (kbase + keys)[:, None] * D + d[None, :], mask=kmask[:, None], other=0.0)
            if F32DOT:                     # the CPU interpreter's bf16 dot is wrong; compiled kernels use bf16
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32))) * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            ok = (keys[None, :] <= lim[:, None]) & (keys[None, :] >= first) & kmask[None, :]
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            pr = tl.exp(s - m_new[:, None])
            v = tl.load(vc_ptr + (kbase + keys)[:, None] * D + d[None, :], mask=kmask[:, None], other=0.0)
            l_i = l_i * alpha + tl.sum(pr, 1)
            if F32DOT:  # noqa: SIM108
                pv = tl.dot(pr.to(v.dtype).to(tl.float32), v.to(tl.float32))
            else:
                pv = tl.dot(pr.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    part = (sp * NKV + kv).to(tl.int64) * RG_PAD + rows
    tl.store(m_ptr + part, m_i, mask=rmask)
    tl.store(l_ptr + part, l_i, mask=rmask)
    tl.store(o_ptr + part[:, None] * D + d[None, :], acc, mask=rmask[:, None])


@triton.jit
def _attn_combine_kernel(m_ptr, l_ptr, o_ptr, out_ptr, g_ptr, sgr, sgh, RG_PAD, NS: tl.constexpr,
                         NKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, GATE: tl.constexpr,
                         PDL: tl.constexpr):
    pdl.enter(PDL)
    row = tl.program_id(0)
    kv = tl.program_id(1)
    d = tl.arange(0, D)
    first = kv.to(tl.int64) * RG_PAD + row
    mx = tl.load(m_ptr + first)
    for sp in range(1, NS):
        mx = tl.maximum(mx, tl.load(m_ptr + (sp * NKV + kv).to(tl.int64) * RG_PAD + row))
    w = tl.exp(tl.load(m_ptr + first) - mx)
    den = w * tl.load(l_ptr + first)
    acc = w * tl.load(o_ptr + first * D + d)
    for sp in range(1, NS):
        part = (sp * NKV + kv).to(tl.int64) * RG_PAD + row
        w = tl.exp(tl.load(m_ptr + part) - mx)
        den += w * tl.load(l_ptr + part)
        acc += w * tl.load(o_ptr + part * D + d)
    r = row // G
    dst = out_ptr + r.to(tl.int64) * (NKV * G * D) + (kv * G + row % G) * D + d
    dt = out_ptr.dtype.element_ty
    o = (acc / den).to(dt)
    if GATE:                            # o * sigmoid(gate), each rounded as torch's bf16 ops round them
        gt = tl.load(g_ptr + r.to(tl.int64) * sgr + (kv * G + row % G) * sgh + d).to(tl.float32)
        o = (o.to(tl.float32) * tl.sigmoid(gt).to(dt).to(tl.float32)).to(dt)
    tl.store(dst, o)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@triton.jit
def _norm_rope_kernel(x_ptr, sxr, sxh, w_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, sor, soh, v_ptr, svr, svh, vc_ptr,
                      eps, D: tl.constexpr, ROT: tl.constexpr, BD: tl.constexpr, AT_POS: tl.constexpr,
                      V: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    r = tl.program_id(0)
    hd = tl.program_id(1)
    src = x_ptr + r.to(tl.int64) * sxr + hd * sxh
    c = tl.arange(0, BD)
    half = tl.arange(0, ROT // 2)
    xf = tl.load(src + c, mask=c < D, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    dt = x_ptr.dtype.element_ty
    y = (xf * rstd * tl.load(w_ptr + c, mask=c < D, other=0.0)).to(dt)            # the normed head, rounded once
    y1 = (tl.load(src + half).to(tl.float32) * rstd * tl.load(w_ptr + half)).to(dt).to(tl.float32)
    y2 = (tl.load(src + ROT // 2 + half).to(tl.float32) * rstd * tl.load(w_ptr + ROT // 2 + half)).to(dt)
    y2 = y2.to(tl.float32)
    c1 = tl.load(cos_ptr + r * ROT + half)
    s1 = tl.load(sin_ptr + r * ROT + half)
    c2 = tl.load(cos_ptr + r * ROT + ROT // 2 + half)
    s2 = tl.load(sin_ptr + r * ROT + ROT // 2 + half)
    row = tl.load(pos_ptr + r) if AT_POS else r
    dst = out_ptr + row.to(tl.int64) * sor + hd * soh
    tl.store(dst + c, y, mask=(c >= ROT) & (c < D))                                # channels past rot: as normed
    tl.store(dst + half, (y1 * c1 - y2 * s1).to(out_ptr.dtype.element_ty))
    tl.store(dst + ROT // 2 + half, (y2 * c2 + y1 * s2).to(out_ptr.dtype.element_ty))
    if V:                               # the row's V head beside its K head (the same cache layout)
        vv = tl.load(v_ptr + r.to(tl.int64) * svr + hd * svh + c, mask=c < D, other=0.0)
        tl.store(vc_ptr + row.to(tl.int64) * sor + hd * soh + c, vv, mask=c < D)


class TritonOps:
    name = "triton"

    @staticmethod
    def proj(x: torch.Tensor, w: torch.Tensor, g32: torch.Tensor | None, eps: float, res: torch.Tensor | None = None,
             out: torch.Tensor | None = None, rp: int | None = None) -> torch.Tensor:
        """``kernels.graphs.proj``'s y: one launch of ``gemv.proj`` where it takes the rows (``gemv.tiles``: decode
        widths, the shapes with tiles), else the Triton rms kernel and cuBLAS (a prompt; gate/up and the head)."""
        rp = rp or graphs.rows_pad(x.shape[0])
        cfg = gemv.tiles(x.shape[0], rp, *w.shape)
        if cfg is not None:
            return gemv.proj(x, w, g32, eps, res, out, rp, cfg)
        return graphs.proj(x if g32 is None else TritonOps.rms(x, g32, eps), w, None, eps, res, out)

    @staticmethod
    def norm_rope(x, w32, eps, cos, sin, kc=None, pos=None, v=None, vc=None):
        """``kernels.graphs.norm_rope`` in one launch: per (row, head) the RMSNorm, the partial RoPE, and the store
        (into a new [R, heads, d] tensor, or the cache kc [heads, cap, d] at pos[r]; with v [R, heads, d] and vc
        like kc, the V heads stored at the same places)."""
        r, heads, d = x.shape
        rot = cos.shape[-1]
        if (x.stride(2) != 1 or rot % 2 or rot & (rot - 1) or rot > d
                or (v is not None and (v.stride(2) != 1 or vc.stride() != kc.stride()))):
            return graphs.norm_rope(x, w32, eps, cos, sin, kc, pos, v, vc)
        c, s = cos.reshape(r, rot).contiguous(), sin.reshape(r, rot).contiguous()
        if kc is None:
            out = torch.empty(r, heads, d, device=x.device, dtype=x.dtype)
            sor, soh, at_pos = out.stride(0), out.stride(1), False
        else:
            out, sor, soh, at_pos = kc, kc.stride(1), kc.stride(0), True
        vs = (v, v.stride(0), v.stride(1), vc) if v is not None and at_pos else (x, 0, 0, out)
        m = pdl_policy.mode(x.device)[0]
        _norm_rope_kernel[(r, heads)](x, x.stride(0), x.stride(1), w32, c, s, pos if at_pos else c, out, sor, soh,
                                      *vs, eps, D=d, ROT=rot, BD=_pow2(d), AT_POS=at_pos, V=v is not None and at_pos,
                                      PDL=m, num_warps=1, **pdl_policy.launch_opts(m))
        return None if at_pos else out

    @staticmethod
    def rms(x: torch.Tensor, w32: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        r, h = x.shape
        out = torch.empty_like(x)
        m = pdl_policy.mode(x.device)[0]
        _rms_kernel[(r,)](x, w32, out, h, eps, BH=_pow2(h), PDL=m, num_warps=8 if h >= 2048 else 4,
                          **pdl_policy.launch_opts(m))
        return out

    @staticmethod
    def qk_rope_store(qkv, nq, nkv, d, qn32, kn32, cos, sin, p0, kc, vc, eps) -> None:
        r = qkv.shape[0]
        m = pdl_policy.mode(qkv.device)[0]
        _qk_rope_kernel[(r, nq + 2 * nkv)](qkv, qkv.stride(0), qn32 if qn32 is not None else kn32, kn32, cos, sin,
                                            p0, kc, vc, kc.shape[1], eps, NQ=nq, NKV=nkv, D=d, PDL=m, num_warps=1,
                                            **pdl_policy.launch_opts(m))

    @staticmethod
    def attention(qkv, nq, nkv, d, kc, vc, p0, causal: bool = True, gate: torch.Tensor | None = None,
                  first: int = 0) -> torch.Tensor:
        r, g, cap = qkv.shape[0], nq // nkv, kc.shape[1]
        rg = r * g
        chunk = triton.cdiv(triton.cdiv(cap, SPLITS), BN) * BN
        n_split = triton.cdiv(cap, chunk)
        dev = qkv.device
        pm = pdl_policy.mode(dev)[0]
        m = torch.empty(n_split * nkv * rg, dtype=torch.float32, device=dev)
        l = torch.empty_like(m)
        o = torch.empty(n_split * nkv * rg * d, dtype=torch.float32, device=dev)
        _attn_split_kernel[(nkv, n_split, triton.cdiv(rg, BM))](
            qkv, qkv.stride(0), kc, vc, p0, r, cap, first, 1.0 / math.sqrt(d), m, l, o, rg,
            NKV=nkv, G=g, D=d, CAUSAL=causal, BM=BM, BN=BN, NB=chunk // BN, F32DOT=interpreting(), PDL=pm, num_warps=4,
            **pdl_policy.launch_opts(pm))
        out = torch.empty(r, nq * d, dtype=qkv.dtype, device=dev)
        if gate is not None and gate.stride(2) != 1:
            gate = gate.contiguous()
        _attn_combine_kernel[(rg, nkv)](m, l, o, out, gate if gate is not None else out,
                                        gate.stride(0) if gate is not None else 0,
                                        gate.stride(1) if gate is not None else 0, rg, NS=n_split, NKV=nkv, G=g, D=d,
                                        GATE=gate is not None, PDL=pm, num_warps=1, **pdl_policy.launch_opts(pm))
        return out

    @staticmethod
    def silu_mul(gu: torch.Tensor, ss: torch.Tensor | None = None, h: int = 1, eps: float = 0.0) -> torch.Tensor:
        """silu(g) u of gu = [g | u] [R, 2I]; with ``ss`` [T, >= R] (``ffn_input``'s sums of squares of rows of
        width ``h``, row r in column r) both halves are first scaled by rstd = 1 / sqrt(sum_t ss[t, r] / h + eps), the
        tiles summed in one order."""
        gu = gu.contiguous()
        r, i2 = gu.shape
        i = i2 // 2
        out = torch.empty(r, i, dtype=gu.dtype, device=gu.device)
        m = pdl_policy.mode(gu.device)[0]
        t, rp = (ss.shape[0], ss.stride(0)) if ss is not None else (1, 1)
        _silu_kernel[(r, triton.cdiv(i, 1024))](gu, out, ss if ss is not None else gu, i, h, eps, BI=1024, T=t, RP=rp,
                                                BT=_pow2(t), RSTD=ss is not None, PDL=m, num_warps=4,
                                                **pdl_policy.launch_opts(m))
        return out

    @staticmethod
    def ffn_input(o: torch.Tensor, wo: torch.Tensor, h: torch.Tensor, g32: torch.Tensor, wgu: torch.Tensor,
                  eps: float, rp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``kernels.graphs.ffn_input``: (h2 = o wo^T + h, silu(g) u of rms(h2, g32) wgu^T). Where the output
        projection runs in ``gemv.proj`` and gate/up on cuBLAS, the norm between them is deferred: proj's epilogue
        stores h2 g (rounded) and its tiles' sums of h2^2, cuBLAS reads h2 g, and the SiLU kernel scales gate and up
        by rstd (rms(h2) g wgu^T = rstd (h2 g) wgu^T: the rounding point moves, as in proj's folded norm). No rms
        launch between the two projections: the 8B chain 0.4-0.6% faster in two calls (results/h200/speed/
        62b2948-ab: 235.6 against 234.6 tok/s; e360aaa-fuse: 235.3 against 233.9). Not in f16: gate/up's
        outputs before the scaling are RMS(h2) times the normed ones, past f16's range where a residual stream
        carries large activations (bf16 and f32 have f32's exponent)."""
        r, n = o.shape[0], wo.shape[0]
        cfg = gemv.tiles(r, rp, n, wo.shape[1])
        if cfg is None or gemv.tiles(r, rp, *wgu.shape) is not None or o.dtype == torch.float16:
            return graphs.ffn_input_of(TritonOps, o, wo, h, g32, wgu, eps, rp)
        h2 = torch.empty(r, n, device=o.device, dtype=o.dtype)
        hg = torch.empty_like(h2)
        ss = torch.empty(triton.cdiv(n, cfg[0]), rp, device=o.device, dtype=torch.float32)
        gemv.proj(o, wo, None, eps, h, h2, rp, cfg, gout=(g32, hg, ss))
        return h2, TritonOps.silu_mul(torch.mm(hg, wgu.t()), ss, n, eps)


@triton.jit
def _silu_kernel(gu_ptr, out_ptr, ss_ptr, I, H, eps, BI: tl.constexpr, T: tl.constexpr, RP: tl.constexpr,
                 BT: tl.constexpr, RSTD: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BI + tl.arange(0, BI)
    m = c < I
    g = tl.load(gu_ptr + r * 2 * I + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + r * 2 * I + I + c, mask=m, other=0.0).to(tl.float32)
    if RSTD:                            # the deferred norm (ffn_input): rstd from the tiles' sums of squares
        t = tl.arange(0, BT)
        rstd = tl.rsqrt(tl.sum(tl.load(ss_ptr + t * RP + r, mask=t < T, other=0.0), axis=0) / H + eps)
        g = g * rstd
        u = u * rstd
    tl.store(out_ptr + r * I + c, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=m)
