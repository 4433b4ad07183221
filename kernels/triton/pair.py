"""Two decode projections in one persistent launch, a grid-wide barrier between them (issue 27's lever after
every one-launch change was measured: docs/SPEED.md, "What is left for issue 27's 8B criteria"):

    pair(x [R, KA], wa [NA, KA], res [R, NA], gb [NA] f32, wb [NB, NA], eps)
        phase A (``proj`` with RES and GOUT):  h = x @ wa^T + res                              [R, NA]
                                               hg = h * gb (h as stored, rounded)               [R, NA]
                                               ss[t, r] = sum_{n in tile t} h[r, n]^2           [TA, RP]
        barrier: every program has stored its phase-A tiles
        phase B (``proj`` with NORM):          z = rstd * (hg @ wb^T), rstd = 1 / sqrt(sum_t ss[t] / NA + eps)
        returns (h, z); z = rms(h, gb, eps) @ wb^T as ``proj`` folds it, the sum of squares taken over A's tiles
        in the order 0..TA-1 (``ffn_input``'s rule) instead of along B's K loop

At 8B this is a layer's down_proj (4096 x 12288, with the residual) and the next layer's q/k/v (6144 x 4096, with
its input norm). Why: in isolation each narrow projection costs ~3.5 us more than its bytes whatever its size, a
fixed cost a launch (ramp, tail, the grid's completion before the next may read). Here the G programs (G <= the
SMs: every one resident at once, or the barrier never opens) take phase A's tiles t = pid, pid + G, ..., arrive at
an arrival counter, spin until all G have arrived, and take phase B's tiles the same way; a program with no tile
in phase A asks L2 for the head of its phase-B slab's rows (``pdl.prefetch_rows``) before it spins. The last
program to leave resets the counters for the next launch (stream order: that launch starts after this grid ends).

Rows are independent and each sum has one order for every R, so a verify row equals the plain step's row bit for
bit, as with ``proj``. The CPU interpreter runs programs one after another, so it runs G = 1 only (the barrier
then opens at once); only the card tests G > 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import interpreting, pdl, pdl_policy
from .gemv import _acc_tile, _w_tile


@triton.jit
def _spin_read(ptr, SPIN: tl.constexpr):
    """The arrival counter, read with acquire: 0 an atomic add of 0 (a read-modify-write at L2), 1 a load
    (ld.acquire.gpu), 2 a load after a 100 ns sleep."""
    if SPIN == 0:
        v = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    elif SPIN == 1:
        v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        v = tl.inline_asm_elementwise("nanosleep.u32 100; ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                      dtype=tl.int32, is_pure=False, pack=1)
    return v


@triton.jit
def _pair_kernel(x_ptr, sx, wa_ptr, wa_desc, swa, r_ptr, sr, h_ptr, hg_ptr, sh, ss_ptr, gb_ptr,
                 wb_ptr, wb_desc, swb, z_ptr, sz, bar_ptr, R, eps,
                 KA: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 RP: tl.constexpr, TA: tl.constexpr, TB: tl.constexpr, BT: tl.constexpr, G: tl.constexpr,
                 PF: tl.constexpr, SPIN: tl.constexpr, F32DOT: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    pdl.enter(PDL)
    rows = tl.arange(0, RP)
    rmask = rows < R
    cols = tl.arange(0, BN)
    ss0 = tl.zeros([RP], tl.float32)
    for t in range(pid, TA, G):                         # phase A: h = x wa^T + res, its norm's parts
        n = (cols + t * BN).to(tl.int64)
        nmask = n < NA
        acc = tl.zeros([BN, RP], tl.float32)
        for k0 in range(0, KA, BK):
            kk = k0 + tl.arange(0, BK)
            w = _w_tile(wa_ptr, wa_desc, swa, n, nmask, kk, t * BN, k0, KA, TMA, False)
            acc, _ = _acc_tile(acc, ss0, w, kk, x_ptr, sx, rows, rmask, gb_ptr, KA, False, F32DOT)
        omask = nmask[:, None] & rmask[None, :]
        acc += tl.load(r_ptr + rows[None, :] * sr + n[:, None], mask=omask, other=0.0).to(tl.float32)
        y = acc.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rows[None, :] * sh + n[:, None], y, mask=omask)
        yf = tl.where(omask, y.to(tl.float32), 0.0)
        gn = tl.load(gb_ptr + n, mask=nmask, other=0.0)
        tl.store(hg_ptr + rows[None, :] * sh + n[:, None], (yf * gn[:, None]).to(h_ptr.dtype.element_ty),
                 mask=omask)
        tl.store(ss_ptr + t * RP + rows, tl.sum(yf * yf, axis=0), mask=rmask)
    if PF > 0:  # noqa: SIM102 (a constexpr: compiled out at 0). No phase-A tile: the phase-B slab's row heads into L2
        if (pid >= TA) & (pid < TB):
            pdl.prefetch_rows(wb_ptr + (pid.to(tl.int64) * BN + cols) * swb, tl.full([BN], PF, tl.int32))
    tl.debug_barrier()                                  # every thread's stores issued before the one release
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = _spin_read(bar_ptr, SPIN)
    while seen < G:
        seen = _spin_read(bar_ptr, SPIN)
    tl.debug_barrier()
    ti = tl.arange(0, BT)                               # rstd from phase A's tiles, in the order 0..TA-1
    sst = tl.load(ss_ptr + ti[:, None] * RP + rows[None, :], mask=(ti[:, None] < TA) & rmask[None, :], other=0.0,
                  cache_modifier=".cg")
    rstd = tl.rsqrt(tl.sum(sst, axis=0) / NA + eps)
    for t in range(pid, TB, G):                         # phase B: z = rstd (hg wb^T)
        n = (cols + t * BN).to(tl.int64)
        nmask = n < NB
        acc = tl.zeros([BN, RP], tl.float32)
        for k0 in range(0, NA, BK):
            kk = k0 + tl.arange(0, BK)
            w = _w_tile(wb_ptr, wb_desc, swb, n, nmask, kk, t * BN, k0, NA, TMA, False)
            a = tl.load(hg_ptr + rows[None, :] * sh + kk[:, None], mask=rmask[None, :] & (kk[:, None] < NA),
                        other=0.0, cache_modifier=".cg")
            if F32DOT:
                acc += tl.dot(w.to(tl.float32), a.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(w, a.to(w.dtype))
        omask = nmask[:, None] & rmask[None, :]
        tl.store(z_ptr + rows[None, :] * sz + n[:, None], (acc * rstd[None, :]).to(z_ptr.dtype.element_ty),
                 mask=omask)
    left = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if left == G - 1:                                   # the last to leave: the counters ready for the next launch
        tl.atomic_xchg(bar_ptr, 0)
        tl.atomic_xchg(bar_ptr + 1, 0)


_BAR: dict[str, torch.Tensor] = {}


def programs(device: torch.device, ta: int, tb: int) -> int:
    """The grid: one program per tile of the wider phase, at most one per SM (every one resident at once);
    1 in the interpreter (programs there run one after another)."""
    if interpreting() or device.type != "cuda":
        return 1
    return min(max(ta, tb), torch.cuda.get_device_properties(device).multi_processor_count)


def pair(x: torch.Tensor, wa: torch.Tensor, res: torch.Tensor, gb: torch.Tensor, wb: torch.Tensor, eps: float,
         rp: int, cfg: tuple[int, ...] = (64, 256, 4, 4), grid: int | None = None, pf: int = 0, spin: int = 0,
         out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The module docstring's (h, z), one launch; ``cfg`` (BN, BK, warps, stages) for both phases, ``grid`` the
    program count (default ``programs``), ``pf`` bytes of each phase-B row an idle phase-A program prefetches."""
    r, ka = x.shape
    na, nb = wa.shape[0], wb.shape[0]
    bn, bk, warps, stages = cfg[:4]
    if wb.shape[1] != na or wa.shape[1] != ka or res.shape != (r, na) or na % bn or nb % bn or ka % bk or na % bk:
        raise ValueError(f"pair: x {tuple(x.shape)}, wa {tuple(wa.shape)}, wb {tuple(wb.shape)}, res "
                         f"{tuple(res.shape)} do not chain in tiles {bn}x{bk}")
    ta, tb = na // bn, nb // bn
    g = grid or programs(x.device, ta, tb)
    if interpreting() and g != 1:
        raise ValueError("pair: the interpreter runs one program (its programs run one after another)")
    h, z = out if out is not None else (torch.empty(r, na, device=x.device, dtype=x.dtype),
                                        torch.empty(r, nb, device=x.device, dtype=x.dtype))
    hg = torch.empty_like(h)
    ss = torch.empty(ta, rp, device=x.device, dtype=torch.float32)
    key = str(x.device)
    if key not in _BAR:                  # made before a graph capture (the engines' warm-up pass calls first)
        _BAR[key] = torch.zeros(2, device=x.device, dtype=torch.int32)
    tma = interpreting() or (x.device.type == "cuda" and pdl_policy.hopper(x.device))
    f32dot = interpreting() or wa.dtype == torch.float32
    if wa.element_size() > 2:
        stages = min(stages, 2)
    mode = pdl_policy.mode(x.device)[0]
    _pair_kernel[(g,)](
        x, x.stride(0), wa, TensorDescriptor.from_tensor(wa, [bn, bk]) if tma else wa, wa.stride(0), res,
        res.stride(0), h, hg, h.stride(0), ss, gb, wb, TensorDescriptor.from_tensor(wb, [bn, bk]) if tma else wb,
        wb.stride(0), z, z.stride(0), _BAR[key], r, eps, KA=ka, NA=na, NB=nb, BN=bn, BK=bk, RP=rp, TA=ta, TB=tb,
        BT=triton.next_power_of_2(ta), G=g, PF=pf, SPIN=0 if interpreting() else spin, F32DOT=f32dot, TMA=tma,
        PDL=mode, num_warps=warps, num_stages=stages, **pdl_policy.launch_opts(mode))
    return h, z
