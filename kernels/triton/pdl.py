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

    BLOOMERY_PDL = "" | "on" | "on,early" | "on,l2" | "on,early,l2"
      on     the Triton decode kernels launched with PDL; each waits first, then lets its successor launch
      early  each lets its successor launch first, then waits (the chain of launches runs ahead)
      l2     the projection's programs prefetch their weight slab into L2 before the wait
             (``cp.async.bulk.prefetch.L2``, one per slab row)

``mode()`` is read at each launch, so a graph captured under one setting keeps it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

OFF, WAIT_FIRST, LAUNCH_FIRST = 0, 1, 2


def mode(device: torch.device) -> tuple[int, bool]:
    """(the kernels' PDL constexpr, whether the projections prefetch into L2) for a launch on ``device``."""
    flags = {f.strip() for f in os.environ.get("BLOOMERY_PDL", "").split(",") if f.strip()}
    if "on" not in flags or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return OFF, False
    return (LAUNCH_FIRST if "early" in flags else WAIT_FIRST), "l2" in flags


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
