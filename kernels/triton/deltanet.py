"""The gated delta rule's sequential recurrence as one Triton launch (the hybrid engine's verify and commit).

Per (sequence n, value head h, value block vb) one program holds its state block S [dk, BV] (float32) in
registers and walks the T rows in order, the same arithmetic as ``ops.gated_deltanet.delta_step``:

    S <- exp(g_t) S;   u = b_t (v_t - S^T k_t);   S <- S + k_t u^T;   o_t = S^T q_t

A column block of S only ever reads its own columns (S^T k and S^T q are per column), so blocks over dv are
independent programs. Inputs q, k [N, T, nv, dk], v [N, T, nv, dv], g, b [N, T, nv] (float32; each sequence's
rows contiguous, TS rows from one sequence's start to the next: the engine's [layers, W, ...] buffers are read in
place); the state [N, nv, dk, dv] is read once and the state after the last row walked written once to ``s_out``
(which may be the input state: each program reads and writes only its own block). Outputs o [N, T, nv, dv].

Three uses, one loop body: a verify (o written, the state not: the commit replays it), a commit (the state only,
the walk bounded by the kept rows read on the device: one launch for every linear layer of the engine, graph-safe),
and a chained plain step (both: its one row is always kept, so its state is committed in the same launch).

Why this is the engine's fast path and not the chunked form: the loop body does not depend on T or on any
other row, and T is not specialised (``do_not_specialize``), so one compiled kernel gives row t the same bits
whether it runs in a pass of 1 row or of 16 and whether its state is carried in registers (verify) or
re-read after a commit (replay). That is what keeps the drafted run's ids identical to the plain run's. The
chunked (UT / WY) form sums the same terms in another order: equal to float32 rounding, not bit-equal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .limits import delta_dims_ok


@triton.jit(do_not_specialize=["T", "TS"])
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, o_ptr, s_out_ptr, T, TS, t_ptr,
                      NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                      TDEV: tl.constexpr, OUT: tl.constexpr, SOUT: tl.constexpr):
    nh = tl.program_id(0).to(tl.int64)              # n * NV + h
    vb = tl.program_id(1)
    n = nh // NV
    h = nh % NV
    kk = tl.arange(0, DK)
    vv = vb * BV + tl.arange(0, BV)
    blk = nh * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(s_ptr + blk)
    walk = T
    if TDEV:                                        # a commit: the rows kept, read on the device
        walk = tl.load(t_ptr).to(tl.int32)
    for t in range(walk):
        row = (n * TS + t) * NV + h                 # the inputs: TS rows a sequence apart (a buffer's width)
        q = tl.load(q_ptr + row * DK + kk)
        k = tl.load(k_ptr + row * DK + kk)
        v = tl.load(v_ptr + row * DV + vv)
        g = tl.load(g_ptr + row)
        b = tl.load(b_ptr + row)
        s = s * tl.exp(g)
        u = b * (v - tl.sum(s * k[:, None], axis=0))
        s = s + k[:, None] * u[None, :]
        if OUT:
            tl.store(o_ptr + ((n * T + t) * NV + h) * DV + vv, tl.sum(s * q[:, None], axis=0))
    if SOUT:
        tl.store(s_out_ptr + blk, s)


def block_v(dv: int) -> int:
    return min(dv, 32)


def recurrent_warps(dk: int, bv: int) -> int:
    """Warps for a [dk, bv] state block: no more threads than elements. A block smaller than the program's threads
    is held twice over (replicated layout), and on the H200 that made the rows' results depend on how many rows one
    launch walks (dk = dv = 8 at 4 warps: T rows at once != one row a launch, .ci/diag_kernels.py); the real shapes
    (dk 128, bv 32: 4 warps) are unchanged."""
    return max(1, min(4, dk * bv // 128))


def _row_stride(xs: tuple[torch.Tensor, ...], t: int) -> int | None:
    """The rows between two sequences' starts shared by xs [N, T, ...] (float32, each sequence's [T, ...] contiguous:
    a slice of a wider [N, W, ...] buffer has W), or None when they do not share one."""
    if any(x.dtype != torch.float32 or not x[0].is_contiguous() for x in xs):
        return None
    if xs[0].shape[0] == 1:                         # one sequence: its start is the only one read
        return t
    strides = set()
    for x in xs:
        inner = max(x[0].numel() // max(t, 1), 1)   # one row's elements
        if x.stride(0) % inner:
            return None
        strides.add(x.stride(0) // inner)
    return strides.pop() if len(strides) == 1 and min(strides) >= t else None


def delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                    state: torch.Tensor, s_out: torch.Tensor | None = None, *, rows: torch.Tensor | None = None,
                    outputs: bool = True, store: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """q/k [N, T, nv, dk], v [N, T, nv, dv], g/b [N, T, nv], state [N, nv, dk, dv] (float32)
    -> (o [N, T, nv, dv], the state after row T-1, written into ``s_out`` when given, else a new tensor).

    The N sequences may be slices of wider buffers ([N, W, ...][:, :T]: read in place, nothing copied). ``rows``
    (a device tensor [1], a commit's kept rows <= T): only rows 0..rows-1 are walked, so the state is the one after
    row rows-1 (graph-safe: the bound is read on the device). ``outputs`` False: o is not written (None; a commit),
    ``store`` False: the state is not written (None; a verify, whose state the commit replays)."""
    n, t, nv, dk = k.shape
    dv = v.shape[-1]
    if not delta_dims_ok(dk, dv):
        raise ValueError(f"the Triton delta rule needs power-of-two head dims, got dk={dk} dv={dv}")
    if rows is not None and outputs:
        raise ValueError("delta_recurrent: rows= (a commit) writes the state only: outputs=False")
    ts = _row_stride((q, k, v, g, b), t)
    if ts is None:
        q, k, v, g, b = (x.float().contiguous() for x in (q, k, v, g, b))
        ts = t
    state = state.float().contiguous()
    if store:
        s_out = torch.empty_like(state) if s_out is None else s_out
        if not s_out.is_contiguous() or s_out.dtype != torch.float32:
            raise ValueError("s_out must be a contiguous float32 tensor")
    o = torch.empty(n, t, nv, dv, device=q.device, dtype=torch.float32) if outputs else None
    bv = block_v(dv)
    _recurrent_kernel[(n * nv, dv // bv)](q, k, v, g, b, state, o if outputs else state, s_out if store else state,
                                          t, ts, rows if rows is not None else state, NV=nv, DK=dk, DV=dv, BV=bv,
                                          TDEV=rows is not None, OUT=outputs, SOUT=store,
                                          num_warps=recurrent_warps(dk, bv))
    return o, (s_out if store else None)
