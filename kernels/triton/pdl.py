"""The device side of programmatic dependent launch (``pdl_policy``, the host side, says when, and documents it):
the griddepcontrol entry every PDL-launched decode kernel runs first, and the L2 prefetch of a projection's
weight."""

from __future__ import annotations

import triton
import triton.language as tl


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
