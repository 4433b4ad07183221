"""The bad-input promise, asserted: exit code 2, one line naming the thing, no traceback, nothing left behind."""

from __future__ import annotations

from pathlib import Path


def assert_one_line_exit2(result, *needles: str, root: Path | None = None) -> str:
    out = result.output
    lines = out.strip().splitlines()
    assert result.exit_code == 2, out
    assert "Traceback" not in out, out
    assert len(lines) == 1, out
    for needle in needles:
        assert needle in lines[0], (needle, out)
    if root is not None:
        assert not list(root.glob("rec.json*")), "a record (or its temp file) was left behind"
    return lines[0]
