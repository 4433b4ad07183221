"""A verify at the engine's fixed row count R: the rows padded to R (one shape per pass, so the same bits whatever
the number of real rows, and one CUDA graph per R), the pass trimmed back to the real rows after it ran."""

from __future__ import annotations

from typing import Any


def pad_rows(ids: list[int], rows: int | None) -> list[int]:
    """ids [r] -> [R] (zeros after the real rows) when the engine has a fixed R and r < R; else ids."""
    return ids + [0] * (rows - len(ids)) if rows and len(ids) < rows else ids


def trim_rows(out: Any, real: int) -> Any:
    """A pass over padded rows -> the same pass over the first ``real`` rows (argmax, taps [L+1, R, ...], logits
    and, where the pass has it, final)."""
    out.argmax, out.taps = out.argmax[:real], out.taps[:, :real]
    if getattr(out, "final", None) is not None:
        out.final = out.final[:real]
    out.logits = out.logits[:real] if out.logits is not None else None
    return out
