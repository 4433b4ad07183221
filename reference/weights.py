"""Weights as float64 arrays on the reference's device, streamed: converted when read, kept only within a budget.

The reference never imports torch: a spec's tensors are torch tensors, and the only torch calls made
here are the boundary conversions: ``t.double().numpy()`` on the host; on a card (``reference.xp.active()``: CuPy)
the device's ``upload`` (the stored bytes moved by the tensor's own ``.to``, widened to float32 there, cast to
float64 by CuPy), or else ``t.float().numpy()`` uploaded and cast there. All exact for bf16/f16/f32 storage
(every value of those formats is a float32 and a float64 value). Each device has its own store (the host's and a
card's never mix).

Memory rule (a real target must fit a workstation): float64 is 4x a bf16 checkpoint, so the reference
never holds all weights at once. A tensor is converted the first time it is read and kept in a
least-recently-used store bounded by ``budget`` bytes of that device's memory (``BLOOMERY_REF_CACHE_BYTES``,
default 2 GiB);
a tensor larger than the budget is never kept. A layer-by-layer walk therefore holds about one
layer's float64 weights beside the budget: every bundled fixture (a few MiB) stays converted whole,
while a Qwen3-8B target streams. Two reads that are never whole:

- ``rows(name, idx)``: rows of a table (the embedding), converting only those rows;
- ``project(name, x)``: ``linear(x, W)`` for W [out, in] (the LM head), W converted in row chunks of
  at most ``chunk_bytes``; exactly the same products as the whole matrix, chunk by chunk.

Inside ``rounding.stored_as(dtype)`` a weight is rounded to that dtype as it is read, unless its stored
dtype is exact in it (bf16 in bf16 or f32, f16 in f16 or f32, f32 in f32): then the rounding is the
identity and is skipped (``rounding.exact_in``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from bloomery_gates.lru import ByteLRU

from .rounding import exact_in, linear, st
from .xp import Device, active, to_host

DEFAULT_BUDGET = 2 << 30
CHUNK_BYTES = 256 << 20


class HasTensors(Protocol):
    tensors: Mapping[str, Any]


def budget_bytes(device: bool = False) -> int:
    """The float64 store's budget: ``BLOOMERY_REF_CACHE_BYTES`` (bytes, >= 0) or 2 GiB; a card's store reads
    ``BLOOMERY_REF_DEVICE_CACHE_BYTES`` first (a card with room can keep a whole model converted)."""
    raw = os.environ.get("BLOOMERY_REF_DEVICE_CACHE_BYTES", "") if device else ""
    raw = raw or os.environ.get("BLOOMERY_REF_CACHE_BYTES", "")
    return int(raw) if raw.isdigit() else DEFAULT_BUDGET


def _stored(t: Any) -> str:
    """The torch storage dtype as 'bf16' / 'f16' / 'f32' / other."""
    return {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}.get(str(t.dtype), str(t.dtype))


def _f64(t: Any) -> np.ndarray:
    arr = np.ascontiguousarray(t.detach().cpu().double().numpy())
    arr.setflags(write=False)
    return arr


def _on(device: Device, t: Any) -> Any:
    """The tensor's values as a float64 array on ``device``: the host's ``_f64``; on a card its own ``upload``
    (CuPy: the stored bytes moved by torch, widened there), or where that cannot run (a torch without CUDA) the
    float32 values (exact for bf16/f16/f32; float64 storage goes as it is) uploaded from the host, then cast."""
    if device.is_host:
        return _f64(t)
    if device.upload is not None:
        try:
            return device.upload(t)
        except (RuntimeError, AssertionError, TypeError):       # torch not compiled with CUDA, and the like
            pass
    src = t.detach().cpu()
    host = src.double().numpy() if _stored(t) not in ("bf16", "f16", "f32") else src.float().numpy()
    return device.xp.ascontiguousarray(device.xp.asarray(host).astype(device.xp.float64))


class F64Weights(Mapping[str, np.ndarray]):
    """A read-only mapping name -> float64 array over a spec's tensors (same names), streamed."""

    def __init__(self, tensors: Mapping[str, Any], budget: int | None = None, chunk_bytes: int = CHUNK_BYTES):
        self._tensors = tensors
        self._given = budget
        self.budget = budget_bytes() if budget is None else budget
        self.chunk_bytes = chunk_bytes
        self._stores: dict[str, ByteLRU] = {}   # per device name ('cpu', 'cuda:0'), each bounded by ``budget``
        self.converted_bytes = 0          # float64 bytes converted so far (a re-read after eviction counts again)

    @property
    def _arrays(self) -> ByteLRU:
        """The active device's store."""
        dev = active()
        store = self._stores.get(dev.name)
        if store is None:
            budget = self.budget if dev.is_host or self._given is not None else budget_bytes(device=True)
            store = self._stores[dev.name] = ByteLRU(budget, lambda a: int(a.nbytes))
        return store

    @staticmethod
    def _round(arr: np.ndarray, src: Any) -> np.ndarray:
        return arr if exact_in(_stored(src)) else st(arr)

    def _array(self, name: str) -> tuple[np.ndarray, Any]:
        src, store = self._tensors[name], self._arrays
        arr = store.get(name)
        if arr is None:
            arr = _on(active(), src)
            self.converted_bytes += arr.nbytes
            store.put(name, arr)
        return arr, src

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        arr, src = self._array(name)
        return self._round(arr, src)

    def rows(self, name: str, idx: Any) -> np.ndarray:
        """``W[idx]`` for a table W [N, ...] and integer ids idx [T]: [T, ...], only those rows converted."""
        idx = np.asarray(to_host(idx), dtype=np.int64)
        arr = self._arrays.get(name)
        if arr is not None:
            return self._round(arr[active().xp.asarray(idx)], self._tensors[name])
        src = self._tensors[name]
        picked = src[idx.tolist()] if idx.ndim else src[int(idx)]
        return self._round(_on(active(), picked), src)

    def project(self, name: str, x: np.ndarray) -> np.ndarray:
        """``linear(x, W)`` = st(x W^T) for W = self[name] [out, in], x [..., in] -> [..., out].

        W is converted ``chunk_bytes`` of float64 at a time (rows of W) unless the store holds it."""
        src = self._tensors[name]
        out_dim, in_dim = (int(d) for d in src.shape)
        step = max(1, self.chunk_bytes // (8 * max(in_dim, 1)))
        if name in self._arrays or step >= out_dim or out_dim * in_dim * 8 <= self._arrays.budget:
            return linear(x, self[name])
        dev = active()
        parts = [linear(x, self._round(_on(dev, src[a:a + step]), src)) for a in range(0, out_dim, step)]
        return dev.xp.concatenate(parts, axis=-1)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def held_bytes(self) -> int:
        """Float64 bytes the active device's store holds now (at most ``budget``)."""
        return self._arrays.held


_CACHE: dict[int, tuple[weakref.ref, F64Weights]] = {}


def as_f64(spec: HasTensors) -> F64Weights:
    """The spec's tensors as float64 arrays (same names): one streamed store per spec object."""
    key = id(spec)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is spec:
        return hit[1]
    weights = F64Weights(spec.tensors)
    try:
        ref = weakref.ref(spec, lambda _r, k=key: _CACHE.pop(k, None))
    except TypeError:          # not weak-referenceable: a store for this call only
        return weights
    _CACHE[key] = (ref, weights)
    return weights
