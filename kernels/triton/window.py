"""The drafted window's bookkeeping (``kernels.accept``) in two Triton launches instead of ~18 torch ones.

In a window graph every torch op is its own kernel: the acceptance decision (compare, cast, cumprod, sum, + 1, the
live test, cast, product) and the tail (three copies into ``out``, the anchor's index, clamp, gather, its copy,
three counter adds) are ~18 launches of a few elements each, ~2-3 us apiece on the H200, all on the critical path.
Here they are two (the commit and the draft's accept sit between them and need ``kept``):

    kept   ids [1 + R-1] (anchor, proposals), a [R] (the target's argmax), cnt, n [1]
           kept = (1 + the first r < R-1 with ids[1 + r] != a[r], or R-1 when none) * (cnt < n)
    tail   out[0] = kept, out[1:1+R] = a, out[1+R:2R] = ids[1:R], ids[0] = a[max(kept-1, 0)],
           p0 += kept, cnt += kept, w += 1

Integers only: the same values as ``kept_dev`` / ``next_anchor`` and the torch tail (tests/test_accept.py
compares them on random windows)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kept_kernel(ids_ptr, a_ptr, cnt_ptr, n_ptr, kept_ptr, M: tl.constexpr, MP: tl.constexpr):
    i = tl.arange(0, MP)
    m = i < M
    d = tl.load(ids_ptr + 1 + i, mask=m, other=0)
    a = tl.load(a_ptr + i, mask=m, other=0)
    first = tl.min(tl.where(m & (d != a), i, M), axis=0)             # the first miss, or M
    live = (tl.load(cnt_ptr) < tl.load(n_ptr)).to(tl.int64)
    tl.store(kept_ptr, (first + 1).to(tl.int64) * live)


@triton.jit
def _tail_kernel(ids_ptr, a_ptr, kept_ptr, out_ptr, p0_ptr, cnt_ptr, w_ptr, R: tl.constexpr, RP: tl.constexpr):
    i = tl.arange(0, RP)
    kept = tl.load(kept_ptr)
    a = tl.load(a_ptr + i, mask=i < R, other=0)
    d = tl.load(ids_ptr + 1 + i, mask=i < R - 1, other=0)
    anchor = tl.load(a_ptr + tl.maximum(kept - 1, 0))
    p0, cnt, w = tl.load(p0_ptr), tl.load(cnt_ptr), tl.load(w_ptr)
    tl.debug_barrier()                                               # every read before any write
    tl.store(out_ptr + 1 + i, a, mask=i < R)
    tl.store(out_ptr + 1 + R + i, d, mask=i < R - 1)
    tl.store(out_ptr, kept)
    tl.store(ids_ptr, anchor)
    tl.store(p0_ptr, p0 + kept)
    tl.store(cnt_ptr, cnt + kept)
    tl.store(w_ptr, w + 1)


def _pow2(m: int) -> int:
    return max(2, triton.next_power_of_2(m))


def kept(ids: torch.Tensor, a: torch.Tensor, cnt: torch.Tensor, n: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """ids [>= R] (anchor, proposals), a [R] (the target's argmax), cnt, n, out [1] (long) -> out: the window's kept
    rows (module docstring; the R - 1 proposals compared)."""
    m = a.shape[0] - 1
    _kept_kernel[(1,)](ids, a, cnt, n, out, M=m, MP=_pow2(m), num_warps=1)
    return out


def tail(ids: torch.Tensor, a: torch.Tensor, kept_: torch.Tensor, out: torch.Tensor, p0: torch.Tensor,
         cnt: torch.Tensor, w: torch.Tensor) -> None:
    """The window's out row, next anchor and counters (module docstring), R = a's length."""
    r = a.shape[0]
    _tail_kernel[(1,)](ids, a, kept_, out, p0, cnt, w, R=r, RP=_pow2(r), num_warps=1)
