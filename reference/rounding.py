"""Emulated storage rounding: the float64 reference run again with each stored op's output rounded.

The device engine stores every op's output in the run's dtype (bf16, f16 or f32) and reads weights
cast to it; its arithmetic inside an op is float32 (accumulation, norm statistics, softmax, rope
angles, the delta-rule state). The reference is exact float64. Inside ``stored_as(dtype)`` every
reference op rounds its output to ``dtype`` at the points where the engine stores one, and every
weight read through ``reference.weights.as_f64`` is rounded to ``dtype`` first, so the reference
computes what an engine of that dtype computes, up to the order of its float32 sums:

    st(x) = float64( dtype( float32(x) ) )       round to nearest even, through float32 as torch does

bf16 is rounded on the float32 bits (``bf16_round``), f16 by the namespace's own float16 cast, so the same code
runs on NumPy and CuPy arrays (``reference.xp``); on NumPy it is bit for bit ml_dtypes' bfloat16 (tests/test_xp.py).

The deviation of that emulated run from the exact run is a draw of the error the engine's storage
rounding makes on these inputs, with these weights: ``bloomery_cli.bands.emulated_band`` turns it
into a band. It is computed from the dtype and the math alone, never from the engine's output.

Outside the context ``st`` is the identity (the plain reference). The context is a ContextVar, so it
is local to the thread that set it (as torch.autocast is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

# the active storage dtype lives in reference.storage (reference.xp asks it too); its API is re-exported here
from .storage import _CURRENT, emulating, storage_key, stored_as
from .xp import common, ns

__all__ = ["bf16_round", "emulate", "emulating", "exact_in", "linear", "st", "storage_key", "stored_as"]

R = TypeVar("R")


def bf16_round(f: Any) -> Any:
    """float32 values f -> the nearest bfloat16 values (ties to even), as float32. On the bits b (uint32):

        r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000          a carry into the exponent rounds up to inf
        NaN stays NaN (its bits would round to inf)

    which is ml_dtypes' (and torch's) float32 -> bfloat16 conversion; integer ops that NumPy and CuPy both have."""
    xp = ns(f)
    b = f.view(xp.uint32)
    r = (b + (xp.uint32(0x7FFF) + ((b >> xp.uint32(16)) & xp.uint32(1)))) & xp.uint32(0xFFFF0000)
    return xp.where(xp.isnan(f), f, r.view(xp.float32))


def st(x: Any) -> Any:
    """x rounded to the active storage dtype and back to float64 (identity outside ``stored_as``)."""
    key = _CURRENT.get()
    if key is None:
        return x
    xp = ns(x)
    f = xp.asarray(x, dtype=xp.float64).astype(xp.float32)
    if key == "bf16":
        f = bf16_round(f)
    elif key == "f16":
        f = f.astype(xp.float16)
    return f.astype(xp.float64)


_EXACT = {"bf16": ("bf16", "f32"), "f16": ("f16", "f32"), "f32": ("f32",)}


def exact_in(stored: str) -> bool:
    """Whether every value of the stored dtype ('bf16', 'f16', 'f32') is exact in the active storage dtype
    (so ``st`` is the identity on it); always true outside ``stored_as``."""
    key = _CURRENT.get()
    return key is None or key in _EXACT.get(stored, ())


def linear(x: Any, w: Any) -> Any:
    """A stored projection: st(x W^T), x [..., in], w [out, in] (the engine's F.linear)."""
    _, x, w = common(x, w)
    return st(x @ w.T)


def emulate(dtype: object, compute: Callable[[], R]) -> R:
    """``compute()`` run inside ``stored_as(dtype)``: the reference as an engine of that dtype runs it."""
    with stored_as(dtype):
        return compute()

