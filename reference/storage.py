"""The active storage dtype of the reference: which rounding ``reference.rounding.st`` applies, set by
``stored_as(dtype)``. Apart from ``reference.rounding`` (which rounds arrays through ``reference.xp``) so that
``reference.xp.run`` can ask whether a run is emulated without importing it.

The state is a ContextVar, so it is local to the thread that set it (as torch.autocast is).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_STORAGE = ("bf16", "f16", "f32")
_ALIASES = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32"}
_CURRENT: ContextVar[str | None] = ContextVar("bloomery_reference_storage", default=None)


def storage_key(dtype: object) -> str | None:
    """The storage rounding of a run dtype ('bf16', 'f16', 'f32', torch.bfloat16 ...) as 'bf16' / 'f16' / 'f32';
    None for f64."""
    key = str(dtype).removeprefix("torch.").lower()
    key = _ALIASES.get(key, key)
    if key in ("f64", "float64", "double"):
        return None
    if key not in _STORAGE:
        raise ValueError(f"no storage rounding for dtype {dtype!r}; expected one of bf16, f16, f32, f64")
    return key


@contextmanager
def stored_as(dtype: object) -> Iterator[None]:
    """Within the block, reference ops round their stored outputs (and the weights) to ``dtype``."""
    token = _CURRENT.set(storage_key(dtype))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def emulating() -> bool:
    """Whether a storage rounding is active (an emulated run)."""
    return _CURRENT.get() is not None
