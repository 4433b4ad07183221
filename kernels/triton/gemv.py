"""The decode projection as one Triton kernel: an RMSNorm folded in, the matrix product of a few rows, a
residual epilogue (``proj``; the torch version is ``kernels.graphs.proj``, same signature and rule):

    proj(x [R, K], w [N, K], g32 [K] | None, eps, res [R, N] | None, out [R, N] | None)
        g given: y = rstd(x) * ((x * g) @ w^T), rstd = 1 / sqrt(mean(x^2) + eps), x * g rounded to x's dtype
        g None:  y = x @ w^T
        y (+ res), f32 accumulation, one rounding to the output dtype

RMSNorm(x) @ w^T = rstd * ((x * g) @ w^T) exactly; the rounding point moves (the stored operand is x * g, the
scale by rstd is applied in f32 after the sum), which is why the sum of squares can ride along the K loop and
no pass over the rows precedes the weight stream.

Why: at decode (R = 1..16 rows) a projection is a read of w. cuBLAS reads the wide ones at the copy rate but the
narrow ones (o_proj, down_proj, out_proj: N = H) at 0.55-0.88 of it, through split-K plus a reduce kernel, and
``addmm``'s residual costs a copy kernel before it (``bloomery bench --profile``). Here program i owns BN output
features and reads its [BN, K] slab of w once, streaming K in BK chunks (on Hopper copied by TMA where the tiles
ask for it: the sixth field of ``config``'s tuple); the rows are the narrow side of the
product: acc[BN, RP] += w_tile [BN, BK] @ a_tile^T [BK, RP] on the tensor cores (RP = rows padded to a power of
two >= 16, fixed per engine). K may be cut into a fixed number of splits per shape (split-K: the tile's last split
to arrive adds the partials in the order 0..S-1). Either way each output is one sum in one order, the same for every
R (a verify row equals the plain step's row bit for bit: tests/test_gemv.py), and runs are deterministic.

Which shapes run here: ``config(N, K)`` (cuBLAS keeps the wide ones). Tried and dropped: the MLP's SiLU gate as
a prologue of down_proj (every program recomputed silu over all of K x RP: 58 us against 33 us for the Triton
silu kernel + cuBLAS at 4096x12288 on the H200).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..graphs import rows_pad
from . import interpreting, pdl, pdl_policy

SMALL_N = 8192                          # wider weights stay with cuBLAS (config)
MAX_ROWS = 32                           # wider passes (a prompt) go to cuBLAS: compute-bound there


@triton.jit
def _w_tile(w_ptr, w_desc, sw, n, nmask, kk, row0, col, K: tl.constexpr, TMA: tl.constexpr, EVEN: tl.constexpr):
    """The weight tile w[n, kk] [BN, BK] (zeros past the edges)."""
    if TMA:                             # the tensor memory accelerator copies the tile (zeros past the edges)
        w = w_desc.load([row0, col])
    elif EVEN:
        w = tl.load(w_ptr + n[:, None] * sw + kk[None, :])
    else:
        w = tl.load(w_ptr + n[:, None] * sw + kk[None, :], mask=nmask[:, None] & (kk[None, :] < K), other=0.0)
    return w


@triton.jit
def _acc_tile(acc, ss, w, kk, x_ptr, sx, rows, rmask, g_ptr, K: tl.constexpr, NORM: tl.constexpr,
              F32DOT: tl.constexpr):
    """acc [BN, RP] += w [BN, BK] @ a [BK, RP], a the rows' kk columns (times the gain, the sum of squares into ss
    [RP], with NORM)."""
    xm = rmask[None, :] & (kk[:, None] < K)
    a = tl.load(x_ptr + rows[None, :] * sx + kk[:, None], mask=xm, other=0.0)          # [BK, RP]
    if NORM:                            # rms(x) * g = rstd * (x * g): the sum of squares rides along
        xf = a.to(tl.float32)
        ss += tl.sum(xf * xf, axis=0)
        gk = tl.load(g_ptr + kk, mask=kk < K, other=0.0)
        a = (xf * gk[:, None]).to(x_ptr.dtype.element_ty)
    if F32DOT:                          # f32 engines (and the CPU interpreter): exact f32 products
        acc += tl.dot(w.to(tl.float32), a.to(tl.float32), input_precision="ieee")
    else:
        acc += tl.dot(w, a.to(w.dtype))
    return acc, ss


@triton.jit
def _proj_kernel(x_ptr, sx, w_ptr, w_desc, sw, g_ptr, r_ptr, sr, o_ptr, so, ws_ptr, cnt_ptr, R, N, eps,
                 go_ptr, hg_ptr, ss_ptr,
                 K: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 RP: tl.constexpr, EVEN: tl.constexpr, F32DOT: tl.constexpr, S: tl.constexpr, KS: tl.constexpr,
                 PDL: tl.constexpr, PF: tl.constexpr, TMA: tl.constexpr, GOUT: tl.constexpr):
    pid = tl.program_id(0)
    sid = tl.program_id(1)             # split s of S sums K in [s KS, (s + 1) KS)
    n = pid.to(tl.int64) * BN + tl.arange(0, BN)
    if PF > 0:                          # the head of the slab's rows into L2 while the kernel before runs (pdl.py)
        pdl.prefetch_rows(w_ptr + n * sw + sid * KS, tl.full([BN], PF, tl.int32))
    pdl.enter(PDL)
    rows = tl.arange(0, RP)
    rmask = rows < R
    nmask = n < N
    ss = tl.zeros([RP], tl.float32)
    acc = tl.zeros([BN, RP], tl.float32)
    for k0 in range(0, KS, BK):
        kk = sid * KS + k0 + tl.arange(0, BK)
        w = _w_tile(w_ptr, w_desc, sw, n, nmask, kk, pid * BN, sid * KS + k0, K, TMA, EVEN)
        acc, ss = _acc_tile(acc, ss, w, kk, x_ptr, sx, rows, rmask, g_ptr, K, NORM, F32DOT)
    last = True
    if S > 1:                           # park the partial sums; the tile's last split to arrive adds them all
        nt = tl.num_programs(0)
        tile = ws_ptr + (sid * nt + pid).to(tl.int64) * (RP * (BN + 1))
        pm = rmask[None, :] & nmask[:, None]
        tl.store(tile + rows[None, :] * BN + tl.arange(0, BN)[:, None], acc, mask=pm)
        tl.store(tile + RP * BN + rows, ss, mask=rmask)
        tl.debug_barrier()              # every thread's partials written before the one release below
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        last = arrived == S - 1
        if last:                        # splits added in the order 0..S-1 whichever came last: one order
            acc = tl.zeros([BN, RP], tl.float32)
            ss = tl.zeros([RP], tl.float32)
            for s in tl.static_range(S):
                part = ws_ptr + (s * nt + pid).to(tl.int64) * (RP * (BN + 1))
                acc += tl.load(part + rows[None, :] * BN + tl.arange(0, BN)[:, None], mask=pm, other=0.0,
                               volatile=True)
                ss += tl.load(part + RP * BN + rows, mask=rmask, other=0.0, volatile=True)
            tl.atomic_xchg(cnt_ptr + pid, 0)        # the counter ready for the next call
    if last:
        if NORM:
            acc = acc * tl.rsqrt(ss / K + eps)[None, :]
        omask = nmask[:, None] & rmask[None, :]
        if RES:
            acc += tl.load(r_ptr + rows[None, :] * sr + n[:, None], mask=omask, other=0.0).to(tl.float32)
        y = acc.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + rows[None, :] * so + n[:, None], y, mask=omask)
        if GOUT:                        # the next norm's numerator y * g and this tile's sums of y^2 (ffn_input)
            yf = tl.where(omask, y.to(tl.float32), 0.0)
            gn = tl.load(go_ptr + n, mask=nmask, other=0.0)
            tl.store(hg_ptr + rows[None, :] * so + n[:, None], (yf * gn[:, None]).to(o_ptr.dtype.element_ty),
                     mask=omask)
            tl.store(ss_ptr + pid * RP + rows, tl.sum(yf * yf, axis=0), mask=rmask)


@functools.cache
def _measured() -> dict[str, tuple[int, ...] | None]:
    """``BLOOMERY_GEMV_CONFIGS``: a JSON file {"NxK": [BN, BK, warps, stages(, splits(, tma))]}
    (``bloomery_cli.bench.gemv --write-configs``), read once; empty when unset."""
    path = os.environ.get("BLOOMERY_GEMV_CONFIGS", "")
    return {k: tuple(v) if v else None for k, v in json.loads(Path(path).read_text()).items()} if path else {}


def config(n: int, k: int) -> tuple[int, ...] | None:
    """(BN, BK, num_warps, num_stages[, splits[, tma]]) for an [n, k] weight: ``BLOOMERY_GEMV_CONFIGS``'s entry,
    else the rule; None: cuBLAS (the torch version) runs it (every shape with ``BLOOMERY_GEMV=off``).

    Rule, from the H200 profiles (results/h200/speed/NOTE.md): the shapes measured (``MEASURED``) take their tiles;
    otherwise cuBLAS keeps the wide matrices (N > 8192: gate/up, the head), which it reads at 0.94-0.99 of the copy
    rate, and the narrow ones (N <= 8192: o_proj, down_proj, out_proj, q/k/v; cuBLAS 0.54-0.88 through split-K and
    a reduce kernel) run here in slabs of 64 features, their tiles copied by TMA (``RULE``)."""
    if os.environ.get("BLOOMERY_GEMV") == "off":     # every shape on cuBLAS: the A/B of .ci/device-speed.sh
        return None
    table = _measured()
    if f"{n}x{k}" in table:
        return table[f"{n}x{k}"]
    if (n, k) in MEASURED:
        return MEASURED[(n, k)]
    return None if n > SMALL_N else RULE


# bench_gemv's fastest candidate at R = 1 on the H200, bf16 (within 3% of it at R = 16), from
# results/h200/speed/00f2d64-splitk/gemv-cuda-bf16.json (14 candidates, split-K among them: it won only at
# 4096x12288, by 1%; elsewhere the arrival counter costs more than the extra parallelism gives). The two wide ones
# run here with their RMSNorm folded in: the DeltaNet in-projection and the attention q/g/k/v at 27B (0.97 / 0.94 of
# the copy rate against cuBLAS's 0.91 / 0.94 in-step, and no rms kernel before them); gate/up stay on cuBLAS (0.87
# here against its 0.95-0.99). The sixth field, 1: the weight's tiles copied by TMA, which read 0.5-5% faster at
# every narrow shape (results/h200/speed/cef8619-tma: 4096x4096 0.686 against 0.679 of the copy rate, 6144x4096
# 0.750 / 0.711, 4096x12288 0.859 / 0.849, 5120x6144 0.828 / 0.824, 5120x17408 0.947 / 0.940) and made the 8B
# step 0.8-0.9% faster (chain K=16 230.0 / 230.1 against 228.3 / 228.6 tok/s; 234.8 against 232.7 in another call:
# results/h200/speed/1fe9524-tma/NOTE.md). The wide 27B ones keep pointer loads: TMA there, at the isolated bench's
# best tiles, made the 27B step 1.7x slower. In the 8B step (results/h200/speed/09ceb55-tiles, one engine per
# setting, alternating on one card), 4096x12288 without its split-K is 0.25% shorter (device step 4.222-4.225
# against 4.231-4.234 ms in four pairs): in-step it takes one split too. Also measured in-step there and slower:
# 3 or 2 pipeline stages, K tiles of 128, 2 splits of 4096x4096 or 6144x4096, 3 of 4096x12288.
MEASURED = {(6144, 4096): (64, 256, 4, 4, 1, 1), (4096, 4096): (64, 256, 4, 4, 1, 1),
            (4096, 12288): (64, 256, 4, 4, 1, 1), (5120, 6144): (64, 256, 4, 4, 1, 1),
            (5120, 17408): (64, 256, 4, 4, 1, 1), (16480, 5120): (128, 128, 4, 4, 1),
            (14336, 5120): (128, 128, 4, 4, 1)}
RULE = (64, 256, 4, 4, 1, 1)            # every other narrow weight


def tiles(r: int, rp: int, n: int, k: int) -> tuple[int, ...] | None:
    """``proj``'s tiles for R rows (padded to rp) of an [n, k] weight, or None where it does not take them: a
    prompt (compute-bound) and the shapes cuBLAS reads best (``config`` None). ``TritonOps.proj`` sends those to
    the Triton rms kernel and cuBLAS."""
    return config(n, k) if r <= rp <= MAX_ROWS else None


def proj(x: torch.Tensor, w: torch.Tensor, g32: torch.Tensor | None, eps: float, res: torch.Tensor | None = None,
         out: torch.Tensor | None = None, rp: int | None = None, cfg: tuple[int, ...] | None = None,
         gout: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The module docstring's y, one launch; ``rp`` the padded row count (default ``rows_pad(R)``: an engine passes
    its widest pass's, so that every width runs the same kernel); ``cfg`` the tiles (default ``config``'s).
    Where it runs is ``TritonOps.proj``'s choice (``tiles``).

    ``gout`` (gain [N] f32, hg [R, N] like out, ss [tiles, rp] f32): the next RMSNorm's parts from the epilogue,
    y as stored (rounded) times the gain into hg, rounded, and each tile's per-row sum of y^2 into ss[tile]
    (``TritonOps.ffn_input``: rms(y) g = rstd (y g), rstd from the tiles' sums in one order)."""
    r = x.shape[0]
    n, k = w.shape
    if x.shape[1] != k:
        raise ValueError(f"proj: x of width {x.shape[1]} for a weight [{n}, {k}]")
    rp = rp or rows_pad(r)
    cfg = cfg or config(n, k)
    if r > rp or rp > MAX_ROWS or cfg is None:
        raise ValueError(f"proj: {r} rows (padded to {rp}) of a [{n}, {k}] weight are not a decode projection here "
                         f"(at most {MAX_ROWS} rows, tiles {cfg}): TritonOps.proj runs those on cuBLAS")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("proj: x and w need unit stride along K")
    if gout is not None and (gout[1].stride() != (out.stride() if out is not None else (n, 1))
                             or gout[2].shape != (triton.cdiv(n, cfg[0]), rp)):
        raise ValueError("proj: gout's hg must have out's strides and ss the shape [tiles, rp]")
    if out is None:
        out = torch.empty(r, n, device=x.device, dtype=x.dtype)
    bn, bk, warps, stages = cfg[:4]
    splits = cfg[4] if len(cfg) > 4 else 1
    tma = bool(cfg[5]) if len(cfg) > 5 else False      # a request: taken on Hopper for 16-byte aligned rows
    ks = triton.cdiv(triton.cdiv(k, bk), splits) * bk                 # each split's K span, whole BK chunks
    even = n % bn == 0 and ks * splits == k
    f32dot = interpreting() or w.dtype == torch.float32
    if w.element_size() > 2:            # f32 tiles are twice the bytes: keep them inside shared memory
        stages = min(stages, 2)
    grid = (triton.cdiv(n, bn), splits)
    ws, cnt = _workspace(x.device, grid, rp, bn) if splits > 1 else (out, out)
    mode, budget = pdl_policy.mode(x.device)
    aligned = (w.stride(0) * w.element_size()) % 16 == 0 and w.data_ptr() % 16 == 0
    tma = tma and aligned and (interpreting() or (x.device.type == "cuda" and pdl_policy.hopper(x.device)))
    pf = 0                              # the L2 prefetch: whole rows of 16-byte-aligned weights only
    if budget is not None and even and aligned:
        pf = pdl_policy.row_bytes(budget, n * splits, ks * w.element_size())
    _proj_kernel[grid](
        x, x.stride(0), w, TensorDescriptor.from_tensor(w, [bn, bk]) if tma else w, w.stride(0),
        g32 if g32 is not None else w, res if res is not None else out,
        res.stride(0) if res is not None else 0, out, out.stride(0), ws, cnt, r, n, eps, *(gout or (w, w, w)), K=k,
        NORM=g32 is not None, RES=res is not None, BN=bn, BK=bk, RP=rp, EVEN=even, F32DOT=f32dot, S=splits,
        KS=ks, PDL=mode, PF=pf, TMA=tma, GOUT=gout is not None, num_warps=warps, num_stages=stages,
        **pdl_policy.launch_opts(mode))
    return out


_WORK: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, grid: tuple[int, int], rp: int, bn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K scratch for a (tiles, splits) grid: f32 partial sums [S, tiles, RP, BN + 1] (the + 1: each row's
    partial sum of squares) and the tiles' arrival counters (int32, zero between calls: the last split of a tile
    resets its own). One per shape and device, made on first use: calls of a stream run one after another, so the
    engines' projections of one shape share it. Make it before a CUDA graph capture (the engines' warm-up pass
    does): a buffer made inside a capture would belong to that graph's pool."""
    key = (str(device), grid, rp, bn)
    if key not in _WORK:
        _WORK[key] = (torch.empty(grid[1] * grid[0] * rp * (bn + 1), device=device, dtype=torch.float32),
                      torch.zeros(grid[0], device=device, dtype=torch.int32))
    return _WORK[key]
