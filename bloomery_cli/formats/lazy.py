"""A read-only, lazy name -> tensor mapping shared by the checkpoint readers.

Readers know every tensor's name, shape and dtype from the file header without reading the data;
the data is read (and for GGUF, dequantized) on ``__getitem__`` and kept in a store bounded by
``BLOOMERY_TENSOR_CACHE_BYTES`` (default 1 GiB; ``bloomery_gates.lru``): a bundled fixture stays whole
in memory, while a real checkpoint is read again from its file (the page cache) rather than held
twice beside the engine's own copy. ``nbytes()`` is the stored size from the headers. ``check_shapes``
validates a set of expected shapes from the headers alone, so a bad checkpoint fails before any
weight byte is touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import BadTensor
from bloomery_gates.lru import ByteLRU

DEFAULT_CACHE_BYTES = 1 << 30
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                 "F8_E8M0": 1}


def cache_budget() -> int:
    """``BLOOMERY_TENSOR_CACHE_BYTES`` (bytes) or 1 GiB."""
    raw = os.environ.get("BLOOMERY_TENSOR_CACHE_BYTES", "")
    return int(raw) if raw.isdigit() else DEFAULT_CACHE_BYTES


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class LazyTensors(Mapping[str, torch.Tensor]):
    """Base class: subclasses implement ``_names``, ``_load``, ``shape_of``, ``dtype_of``, ``file_of``."""

    def __init__(self) -> None:
        self._cache: ByteLRU[torch.Tensor] = ByteLRU(cache_budget(), _tensor_bytes)

    # -- subclass hooks ------------------------------------------------------------------------
    def _names(self) -> list[str]:
        raise NotImplementedError

    def _load(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def shape_of(self, name: str) -> tuple[int, ...]:
        """Logical (numpy/torch order) shape of ``name``, from the header only."""
        raise NotImplementedError

    def dtype_of(self, name: str) -> str:
        """Stored dtype as the file spells it (safetensors ``BF16``, GGUF ``Q8_0``)."""
        raise NotImplementedError

    def file_of(self, name: str) -> Path:
        """The file holding ``name``."""
        raise NotImplementedError

    def label(self, name: str) -> str:
        """How an error message names the tensor: ``<file>: <name as stored>``."""
        return f"{self.file_of(name)}: tensor {name}"

    def check_dtype(self, name: str) -> None:
        """Raise ``BadTensor`` if ``name``'s stored dtype cannot be read."""

    def element_bytes(self, name: str) -> int:
        """Bytes per element of ``name`` as loaded (a dequantizing reader overrides: float32, 4)."""
        return ELEMENT_BYTES.get(self.dtype_of(name), 4)

    def nbytes(self, name: str) -> int:
        """Bytes of ``name`` as loaded, from the header alone."""
        n = 1
        for d in self.shape_of(name):
            n *= d
        return n * self.element_bytes(name)

    # -- Mapping -------------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __getitem__(self, name: str) -> torch.Tensor:
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        if name not in self:
            raise KeyError(name)
        self.check_dtype(name)
        tensor = self._load(name)
        self._cache.put(name, tensor)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def clear_cache(self) -> None:
        """Forget the tensors read so far (the next access reads the file again)."""
        self._cache.clear()


def stored_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of all tensors as stored: from the headers for a lazy mapping (nothing read), else counted."""
    if isinstance(tensors, LazyTensors):
        return sum(tensors.nbytes(n) for n in tensors)
    return sum(_tensor_bytes(t) for t in tensors.values())


def _shape_and_label(tensors: Mapping[str, torch.Tensor], name: str) -> tuple[tuple[int, ...], str]:
    if isinstance(tensors, LazyTensors):
        return tensors.shape_of(name), tensors.label(name)
    return tuple(tensors[name].shape), f"tensor {name}"


Shapes = Mapping[str, tuple[tuple[int, ...], str]]


def check_shapes(tensors: Mapping[str, torch.Tensor], expected: Shapes, where: str | Path) -> None:
    """Check that every ``name -> (shape, why)`` in ``expected`` is present with exactly that shape.

    ``why`` spells the shape in config terms (``"[num_heads*head_dim, hidden_size]"``) for the message.
    Raises ``BadTensor`` naming the tensor (and its file) with expected vs got. For lazy mappings the
    dtype is checked too; nothing is read beyond the headers.
    """
    for name, (shape, why) in expected.items():
        if name not in tensors:
            raise BadTensor(f"{where}: tensor {name}", f"missing; expected shape {list(shape)} {why}")
        got, label = _shape_and_label(tensors, name)
        if tuple(got) != tuple(shape):
            raise BadTensor(label, f"shape {list(got)}, expected {list(shape)} {why}")
        if isinstance(tensors, LazyTensors):
            tensors.check_dtype(name)


def stored_layers(names: Iterable[str], prefix: str) -> int:
    """How many distinct layer indices the header stores under ``prefix`` (names ``{prefix}{i}.<rest>``).

    A config's layer count is bounded by this before any per-layer table is built: a
    ``num_hidden_layers`` of 1e9 is then one named error, not a billion-entry shape table.
    """
    found: set[int] = set()
    cut = len(prefix)
    for name in names:
        if name.startswith(prefix):
            head = name[cut:].split(".", 1)[0]
            if head.isdigit():
                found.add(int(head))
    return len(found)


def layer_bound(names: Iterable[str], *prefixes: str) -> dict[str, Any]:
    """``maximum=`` and ``why=`` for ``Cfg.int``: the most layers stored under any of ``prefixes``."""
    counts = {p: stored_layers(names, p) for p in prefixes}
    prefix = max(counts, key=lambda p: counts[p])
    return {"maximum": counts[prefix], "why": f"the checkpoint stores {counts[prefix]} layers, {prefix}<i>.*"}
