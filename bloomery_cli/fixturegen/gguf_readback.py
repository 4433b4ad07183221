"""The read-back checks the families' GGUF exports (``bloomery_cli/families/<family>/fixture_gguf.py``) share: the
file, read through the harness's GGUF reader, against the HF fixture it was written from.

    same_tensors  names(got) == names(want); per tensor the same shape and |want - got| <= bound(name, want)
                  elementwise in float64 (bound None: torch.equal, exactly equal)
    same_fields   getattr(got, f) == getattr(spec, f) for each spec field f named
Each difference is a RuntimeError naming the file and the tensor or field."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch


def same_tensors(path: Path, got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor],
                 bound: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> None:
    """``got`` (the read-back tensors) against ``want`` (the HF fixture's, by the reader's names)."""
    if set(got) != set(want):
        raise RuntimeError(f"{path}: tensor set differs from the HF fixture: {sorted(set(got) ^ set(want))}")
    for n in sorted(want):
        if bound is None:
            ok = torch.equal(got[n].float(), want[n].float())
        else:
            a, b = want[n].double(), got[n].double()
            ok = a.shape == b.shape and not bool(((a - b).abs() > bound(n, a)).any())
        if not ok:
            raise RuntimeError(f"{path}: {n} does not read back equal to the HF fixture")


def same_fields(path: Path, got: Any, spec: Any, fields: Iterable[str]) -> None:
    """The read-back spec ``got`` states each of ``fields`` as ``spec`` does."""
    for f in fields:
        if getattr(got, f) != getattr(spec, f):
            raise RuntimeError(f"{path}: {f} read back {getattr(got, f)}; expected {getattr(spec, f)}")
