"""What the Triton kernels take, asked without importing triton (the package's dispatch and the kernels both ask)."""

from __future__ import annotations


def delta_dims_ok(dk: int, dv: int) -> bool:
    """Whether the Triton delta rule takes these head dims (powers of two: its aranges; every Qwen3.5/3.8
    checkpoint has 128)."""
    return all(n > 0 and n & (n - 1) == 0 for n in (dk, dv))
