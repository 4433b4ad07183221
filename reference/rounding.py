"""Emulated storage rounding: the float64 reference run again with each stored op's output rounded.

The device engine stores every op's output in the run's dtype (bf16, f16 or f32) and reads weights
cast to it; its arithmetic inside an op is float32 (accumulation, norm statistics, softmax, rope
angles, the delta-rule state). The reference is exact float64. Inside ``stored_as(dtype)`` every
reference op rounds its output to ``dtype`` at the points where the engine stores one, and every
weight read through ``reference.weights.as_f64`` is rounded to ``dtype`` first, so the reference
computes what an engine of that dtype computes, up to the order of its float32 sums:

    st(x) = float64( dtype( float32(x) ) )       round to nearest even, through float32 as torch does

The deviation of that emulated run from the exact run is a draw of the error the engine's storage
rounding makes on these inputs, with these weights: ``bloomery_cli.bands.emulated_band`` turns it
into a band. It is computed from the dtype and the math alone, never from the engine's output.

Outside the context ``st`` is the identity (the plain reference). The context is a ContextVar, so it
is local to the thread that set it (as torch.autocast is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import ml_dtypes
import numpy as np

_STORAGE = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}
_ALIASES = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32"}
_CURRENT: ContextVar[np.dtype | None] = ContextVar("bloomery_reference_storage", default=None)

R = TypeVar("R")


def storage_dtype(dtype: object) -> np.dtype | None:
    """The numpy storage type of a run dtype ('bf16', 'f16', 'f32', torch.bfloat16 ...); None for f64."""
    key = str(dtype).removeprefix("torch.").lower()
    key = _ALIASES.get(key, key)
    if key in ("f64", "float64", "double"):
        return None
    if key not in _STORAGE:
        raise ValueError(f"no storage rounding for dtype {dtype!r}; expected one of bf16, f16, f32, f64")
    return np.dtype(_STORAGE[key])


@contextmanager
def stored_as(dtype: object) -> Iterator[None]:
    """Within the block, reference ops round their stored outputs (and the weights) to ``dtype``."""
    token = _CURRENT.set(storage_dtype(dtype))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def st(x: np.ndarray) -> np.ndarray:
    """x rounded to the active storage dtype and back to float64 (identity outside ``stored_as``)."""
    dt = _CURRENT.get()
    if dt is None:
        return x
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(dt).astype(np.float64)


_EXACT = {"bf16": ("bf16", "f32"), "f16": ("f16", "f32"), "f32": ("f32",)}


def exact_in(stored: str) -> bool:
    """Whether every value of the stored dtype ('bf16', 'f16', 'f32') is exact in the active storage dtype
    (so ``st`` is the identity on it); always true outside ``stored_as``."""
    dt = _CURRENT.get()
    if dt is None:
        return True
    active = {np.dtype(v): k for k, v in _STORAGE.items()}[dt]
    return active in _EXACT.get(stored, ())


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A stored projection: st(x W^T), x [..., in], w [out, in] (the engine's F.linear)."""
    return st(x @ w.T)


def emulate(dtype: object, compute: Callable[[], R]) -> R:
    """``compute()`` run inside ``stored_as(dtype)``: the reference as an engine of that dtype runs it."""
    with stored_as(dtype):
        return compute()
