"""``Joined``: a file's tensors with some groups of them presented as one tensor each (a GGUF that stores one HF
tensor in parts: an indexer's q / k projections, KDA's q / k / v convolutions, MLA's k_b / v_b), made on first
access; every other tensor passes through. A missing part is a named ``BadTensor``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from bloomery_gates.errors import BadTensor

from .lazy import LazyTensors

Join = Callable[[list[torch.Tensor]], torch.Tensor]


class Joined(LazyTensors):
    """``joins``: new name -> (its parts' names, the function joining the parts' tensors)."""

    def __init__(self, inner: LazyTensors, joins: dict[str, tuple[Sequence[str], Join]]):
        super().__init__()
        self.inner = inner
        self.joins = {k: (tuple(p), f) for k, (p, f) in joins.items() if p[0] in inner}
        used = {x for parts, _ in self.joins.values() for x in parts}
        self.names = [n for n in inner if n not in used] + list(self.joins)

    def _names(self) -> list[str]:
        return self.names

    def _src(self, name: str) -> str:
        return self.joins[name][0][0] if name in self.joins else name

    def _parts(self, name: str) -> tuple[str, ...]:
        parts = self.joins[name][0]
        for p in parts:
            if p not in self.inner:
                raise BadTensor(f"{self.inner.file_of(parts[0])}: tensor {p}", f"missing; expected beside {parts[0]}")
        return parts

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self.joins:
            return self.inner.shape_of(name)
        parts, fn = self._parts(name), self.joins[name][1]
        return tuple(fn([torch.empty(self.inner.shape_of(p), device="meta") for p in parts]).shape)

    def dtype_of(self, name: str) -> str:
        return self.inner.dtype_of(self._src(name))

    def file_of(self, name: str) -> Path:
        return self.inner.file_of(self._src(name))

    def label(self, name: str) -> str:
        if name not in self.joins:
            return self.inner.label(name)
        return self.inner.label(self._src(name)) + f" (+ {', '.join(self.joins[name][0][1:])})"

    def check_dtype(self, name: str) -> None:
        for x in self.joins[name][0] if name in self.joins else (name,):
            self.inner.check_dtype(x)

    def _load(self, name: str) -> torch.Tensor:
        if name not in self.joins:
            return self.inner[name]
        parts, fn = self._parts(name), self.joins[name][1]
        return fn([self.inner[p] for p in parts])
