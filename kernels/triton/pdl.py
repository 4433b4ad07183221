"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels: an experiment of
issue 27, off unless ``BLOOMERY_PDL`` asks for it.

A decode step is ~330 kernels in a row; each boundary drains one kernel and fills the next, and the latency-bound
ones (attention, rope, rms, silu: ~12 us a layer at 8B) leave HBM idle. With PDL a kernel may be launched while
the one before it still runs: its programs start, do what does not depend on the kernel before (here: ask L2 for
their slab of the weight, which no kernel writes), then ``griddepcontrol.wait`` until the kernel before has
finished and its writes are visible. Every kernel launched so waits before it reads or writes an activation, and
before it ends, so "finished" stays transitive along the chain and the step's numbers are unchanged (the
projections' sums keep their order). A kernel not launched with PDL (cuBLAS, torch ops) runs after the one
before it has finished, as without PDL.

    BLOOMERY_PDL = "" | "on" | "on,early" | "on,l2=MB" | "on,early,l2=MB"
      on     the Triton decode kernels launched with PDL; each waits first, then lets its successor launch
      early  each lets its successor launch first, then waits (the chain of launches runs ahead)
      l2=MB  the projection's programs prefetch the head of each row of their weight slab into L2 before the
             wait (``cp.async.bulk.prefetch.L2``, one per row), MB MiB a projection in all ("l2": the whole
             slab; measured at 500f780: 0.8 ms a step slower at 8B, the 100 MB down_proj evicting its own
             prefetched lines before they are read)

``mode()`` is read at each launch, so a graph captured under one setting keeps it. Only the launches of a
``GraphSet``'s warm-up and capture take PDL (``graphs.graphing``; the warm-up compiles the variant the capture
launches): launched one by one from the host (a prompt, an eager draft), the 27B MTP bench ran 9%
slower with it (results/h200/speed/c5d9074-pdl), its graphed chain 2% faster.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import graphs

OFF, WAIT_FIRST, LAUNCH_FIRST = 0, 1, 2


def mode(device: torch.device) -> tuple[int, int | None]:
    """(the kernels' PDL constexpr, the bytes a projection prefetches into L2: None none, 0 all of its weight)
    for a launch on ``device``."""
    flags = {f.strip() for f in os.environ.get("BLOOMERY_PDL", "").split(",") if f.strip()}
    if ("on" not in flags or device.type != "cuda" or not graphs.graphing()
            or torch.cuda.get_device_capability(device)[0] < 9):
        return OFF, None
    l2 = next((f for f in flags if f.split("=")[0] == "l2"), None)
    budget = None if l2 is None else (int(float(l2.split("=")[1]) * (1 << 20)) if "=" in l2 else 0)
    return (LAUNCH_FIRST if "early" in flags else WAIT_FIRST), budget


def row_bytes(budget: int | None, rows: int, row_span: int) -> int:
    """Bytes prefetched from the head of each of ``rows`` rows of ``row_span`` bytes for an L2 budget (``mode``):
    whole 128-byte lines, at most the span; 0: none."""
    if budget is None:
        return 0
    per = row_span if budget == 0 else min(row_span, budget // rows // 128 * 128)
    return per if per % 16 == 0 else 0


def launch_opts(pdl: int) -> dict:
    """The launch keyword of a kernel compiled with ``PDL=pdl``."""
    return {"launch_pdl": True} if pdl != OFF else {}


@triton.jit
def _launch_dependents():
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _wait():
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def enter(PDL: tl.constexpr):
    """A kernel's first statement (after any prefetch): nothing with PDL off."""
    if PDL == 2:
        _launch_dependents()
    if PDL != 0:
        _wait()
    if PDL == 1:
        _launch_dependents()


@triton.jit
def prefetch_rows(ptrs, nbytes):
    """Ask L2 for ``nbytes`` from each of ``ptrs`` (16-byte aligned, nbytes a multiple of 16): a hint, no data
    returned to the program."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; // $0", "=r,l,r", [ptrs, nbytes],
                              dtype=tl.int32, is_pure=False, pack=1)
