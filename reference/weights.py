"""Weights as float64 NumPy arrays, converted once per spec object.

The reference never imports torch: a spec's tensors are torch tensors, and the only torch call made
here is the boundary conversion ``t.double().numpy()`` (exact for bf16/f16/f32 storage: every value
of those formats is a float64 value). Conversion is lazy (a tensor is converted the first time it
is read) and cached per spec object for as long as the spec lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from .rounding import st


class HasTensors(Protocol):
    tensors: Mapping[str, Any]


class F64Weights(Mapping[str, np.ndarray]):
    """A read-only mapping name -> float64 array over a spec's tensors, converted on first access."""

    def __init__(self, tensors: Mapping[str, Any]):
        self._tensors = tensors
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        arr = self._arrays.get(name)
        if arr is None:
            arr = np.ascontiguousarray(self._tensors[name].detach().cpu().double().numpy())
            arr.setflags(write=False)
            self._arrays[name] = arr
        return st(arr)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


_CACHE: dict[int, tuple[weakref.ref, F64Weights]] = {}


def as_f64(spec: HasTensors) -> F64Weights:
    """The spec's tensors as float64 arrays (same names). Cached per spec object (by identity)."""
    key = id(spec)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is spec:
        return hit[1]
    weights = F64Weights(spec.tensors)
    try:
        ref = weakref.ref(spec, lambda _r, k=key: _CACHE.pop(k, None))
    except TypeError:          # not weak-referenceable: convert, but do not cache
        return weights
    _CACHE[key] = (ref, weights)
    return weights
