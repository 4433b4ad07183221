"""The passes of a target engine over rows. A verify at the engine's fixed row count R: the rows padded to R (one
shape per pass, so the same bits whatever the number of real rows, and one CUDA graph per R), the pass trimmed
back to the real rows after it ran; ``RowPasses``, the prefill / verify / commit of a target that commits by
position."""

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


class RowPasses:
    """prefill / verify / commit / reset over ``self._run(ids, want_logits) -> Pass`` and ``self.length``: the pass
    logic of every target whose commit is by position only (qwen3 in one process or rank 0 of a split one, mimo2,
    deepseek4; those whose commit also restores a recurrent state write their own)."""

    rows: int | None
    length: int

    def _run(self, ids: list[int], want_logits: bool) -> Any:
        raise NotImplementedError

    def reset(self) -> None:
        self.length = 0

    def prefill(self, ids: list[int], logits: bool = False) -> Any:
        """Run the prompt from position 0 (``reset``) and commit it whole."""
        self.reset()
        out = self._run(ids, logits)
        self.commit(len(ids))
        return out

    def verify(self, ids: list[int], logits: bool = False) -> Any:
        """Run rows ids at positions length..length+R-1 (KV written, nothing committed); padded to ``rows``."""
        return trim_rows(self._run(pad_rows(ids, self.rows), logits), len(ids))

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last verify; later KV slots are dead (masked by position)."""
        self.length += kept
