"""The peak of the bytes that torch ops allocate while a function runs, on any device (the host has no allocator
statistics): a ``TorchDispatchMode`` sees every op's outputs; a storage counts from the first tensor that holds it
until the last such tensor is collected. Views share their storage (counted once); in-place outputs are the
tensors already counted. What existed before the call is not counted."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, int] = {}        # storage data_ptr -> live tensors holding it
        self._bytes: dict[int, int] = {}
        self._seen: set[int] = set()           # id() of the tensors counted (removed when collected)
        self._before: set[int] = set()

    def _drop(self, ptr: int, ident: int) -> None:
        self._seen.discard(ident)
        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            self.live -= self._bytes.pop(ptr)
            del self._refs[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for a in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(a, torch.Tensor) and id(a) not in self._seen:
                self._before.add(a.untyped_storage().data_ptr())
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or id(t) in self._seen:
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr in self._before or ptr == 0:
                continue
            self._seen.add(id(t))
            if ptr not in self._refs:
                self._refs[ptr], self._bytes[ptr] = 0, st.nbytes()
                self.live += st.nbytes()
                self.peak = max(self.peak, self.live)
            self._refs[ptr] += 1
            weakref.finalize(t, self._drop, ptr, id(t))
        return out


def peak_of(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), the peak of the bytes its ops held at once)."""
    mode = PeakMode()
    with mode:
        out = fn()
    return out, mode.peak


def allocator_peak_of(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), the peak of the bytes the host allocator held at once past what it held before the call), from the
    profiler's allocator events: unlike ``peak_of`` it sees the buffers an op makes inside itself and never returns
    (an index widened to int64 inside ``aten.index``, a kernel's scratch), which the device's
    ``torch.cuda.max_memory_allocated`` counts too. Host tensors only."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return out, peak
