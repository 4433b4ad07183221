"""The array namespace of the float64 reference: NumPy on the host (the default), CuPy on a GPU.

The reference is array code written once against a namespace ``xp`` that NumPy and CuPy both are. Two rules
say which namespace an op uses:

- an op works in the namespace of the arrays it is given (``ns``: CuPy's ``get_array_module`` rule, extended to
  every ``Device`` seen): NumPy arrays in, NumPy out, so the tier-1 transcriptions the harness runs on the
  engine's own float32 scores stay on the host whatever the reference device is;
- new arrays of a run come from its data: the weights (``reference.weights.F64Weights`` hands each tensor out on
  the ACTIVE device) and the harness's inputs, which an entry point moves there with ``here``.

    active()          the device the reference computes on now (a ContextVar: thread-local, like stored_as)
    on(device)        within the block, weights and entry inputs live on ``device``
    run(compute)      the harness's door: compute() on the selected device, its arrays brought back to NumPy
    select(device)    for a gate run: which device ``run`` uses, and whether it also runs the host to compare

Results move back to NumPy only in ``run`` (where the harness receives them to compare); inside the reference
nothing crosses. CuPy is imported only when a CUDA device is asked for (``cuda``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .storage import emulating

R = TypeVar("R")


@dataclass(frozen=True)
class Device:
    """A place the reference can run: a name ('cpu', 'cuda:0'), its namespace module and its array type.

    ``get`` brings one of its arrays to NumPy; ``scope`` is entered while it is active (CuPy's
    ``cupy.cuda.Device(i)``, so allocations land on that card); ``sync`` waits for queued work (timing);
    ``peak_bytes`` the memory it holds for the reference (CuPy's pool, cached blocks included; None: the host);
    ``upload`` (optional) a checkpoint tensor -> its float64 array there, by the fastest exact path it has."""

    name: str
    xp: Any
    array_type: type
    get: Callable[[Any], np.ndarray]
    scope: Callable[[], AbstractContextManager] = nullcontext
    sync: Callable[[], None] = lambda: None
    peak_bytes: Callable[[], int | None] = lambda: None
    upload: Callable[[Any], Any] | None = None

    @property
    def is_host(self) -> bool:
        return self.xp is np


HOST = Device("cpu", np, np.ndarray, np.asarray)
_KNOWN: list[Device] = []                 # non-host devices seen, for ``ns``
_ACTIVE: ContextVar[Device] = ContextVar("bloomery_reference_device", default=HOST)


def register(device: Device) -> Device:
    """Make ``ns`` recognise the device's arrays (done once per device kind)."""
    if not device.is_host and all(d.array_type is not device.array_type for d in _KNOWN):
        _KNOWN.append(device)
    return device


def ns(*arrays: Any) -> Any:
    """The namespace of the arrays: a device's if any of them is one of its arrays (the active device's first),
    else NumPy."""
    now = _ACTIVE.get()
    for x in arrays:
        for d in (now, *_KNOWN):
            if isinstance(x, d.array_type):
                return d.xp
    return np


def common(*arrays: Any) -> tuple[Any, ...]:
    """(xp, *arrays) with every array in ``ns(*arrays)`` (no copy for one already there; None passes)."""
    xp = ns(*arrays)
    return (xp, *(None if a is None else xp.asarray(a) for a in arrays))


def active() -> Device:
    return _ACTIVE.get()


@contextmanager
def on(device: Device) -> Iterator[Device]:
    """Within the block the reference's weights and entry inputs live on ``device``."""
    token = _ACTIVE.set(register(device))
    try:
        with device.scope():
            yield device
    finally:
        _ACTIVE.reset(token)


def here(x: Any) -> Any:
    """An input on the active device (a harness array entering the reference); no copy if it is there."""
    return active().xp.asarray(x)


def to_host(obj: Any) -> Any:
    """``obj`` with every device array in it brought to NumPy: arrays, dataclasses, tuples, lists, dicts."""
    for d in (_ACTIVE.get(), *_KNOWN):
        if isinstance(obj, d.array_type):
            return d.get(obj)
    if isinstance(obj, np.ndarray) or obj is None or isinstance(obj, (int, float, str, bool, np.generic)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_host(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    if isinstance(obj, tuple):
        return type(obj)(*(to_host(v) for v in obj)) if hasattr(obj, "_fields") else tuple(to_host(v) for v in obj)
    if isinstance(obj, list):
        return [to_host(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    return obj


def cuda(spec: str) -> Device:
    """The CUDA device ``spec`` ('cuda' or 'cuda:<i>') through CuPy, imported here and only here.

    Raises ValueError with the reason when CuPy does not import or the card does not exist."""
    index = 0 if spec == "cuda" else int(spec.removeprefix("cuda:"))
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
        raise ValueError(f"CuPy does not import ({type(e).__name__}: {e}); install the gpu extra for this "
                         "machine's CUDA major") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - cudaErrorNoDevice, an insufficient driver
        raise ValueError(f"CuPy sees no CUDA device ({type(e).__name__}: {e})") from None
    if not 0 <= index < count:
        raise ValueError(f"cuda:{index} asked for, but CuPy sees {count} device(s)")
    card = cupy.cuda.Device(index)

    def held() -> int:
        with card:
            return int(cupy.get_default_memory_pool().total_bytes())

    def sync() -> None:
        with card:
            cupy.cuda.get_current_stream().synchronize()

    def upload(t: Any) -> Any:
        """A torch tensor's values as float64 on the card: its stored bytes copied there by torch's own ``.to``
        (2 bytes a value for bf16, not the host's 8), widened to float32 there (exact), read by CuPy through
        ``__cuda_array_interface__`` and cast to float64 in CuPy's pool. Only tensor methods: no torch import."""
        g = t.detach().to(f"cuda:{index}").contiguous()
        if str(g.dtype) in ("torch.bfloat16", "torch.float16"):
            g = g.float()
        with card:
            return cupy.asarray(g).astype(cupy.float64)

    return Device(f"cuda:{index}", cupy, cupy.ndarray, cupy.asnumpy, lambda: card, sync, held, upload)


# --- the harness's door -------------------------------------------------------------------------------------------

@dataclass
class Selection:
    """A gate run's reference device; ``compare``: run every exact computation on the host too and keep the
    worst relative difference (``Compared``). ``seconds``: wall time spent in ``run`` on ``device``."""

    device: Device = HOST
    compare: bool = False
    seconds: float = 0.0
    host_seconds: float = 0.0
    compared: Compared = field(default_factory=lambda: Compared())


@dataclass
class Compared:
    """The device reference against the host one, over every array ``run`` returned from an exact run:
    tensors, values, worst rel (max over tensors of ``rel_diff``), integer entries that differ, and where."""

    tensors: int = 0
    values: int = 0
    worst: float = 0.0
    int_differ: int = 0
    worst_at: str = ""
    skipped_emulated: int = 0

    def add(self, label: str, dev: Any, host: Any, path: str = "") -> None:
        if isinstance(host, np.ndarray):
            d = np.asarray(dev)
            if d.shape != host.shape:
                self._note(f"{label}{path}", np.inf)
                return
            self.tensors += 1
            self.values += int(host.size)
            if host.dtype.kind in "biu":
                self.int_differ += int(np.count_nonzero(d != host))
            else:
                self._note(f"{label}{path}", rel_diff(d, host))
        elif dataclasses.is_dataclass(host) and not isinstance(host, type):
            for f in dataclasses.fields(host):
                self.add(label, getattr(dev, f.name), getattr(host, f.name), f"{path}.{f.name}")
        elif isinstance(host, (tuple, list)):
            for i, (a, b) in enumerate(zip(dev, host, strict=True)):
                self.add(label, a, b, f"{path}[{i}]")
        elif isinstance(host, dict):
            for k in host:
                self.add(label, dev[k], host[k], f"{path}[{k!r}]")

    def _note(self, where: str, rel: float) -> None:
        if rel >= self.worst:
            self.worst, self.worst_at = rel, where


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max over rows (the last axis) of max|a - b| / max|b| (a row of zeros counts its absolute difference);
    inf where they disagree on a NaN or an inf. Both float64 NumPy arrays of one shape."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    fin = np.isfinite(b)
    if not np.array_equal(fin, np.isfinite(a)) or not np.array_equal(a[~fin], b[~fin], equal_nan=True):
        return float("inf")
    rows = (-1, a.shape[-1]) if a.ndim else (1, 1)
    a, b = np.where(fin, a, 0.0).reshape(rows), np.where(fin, b, 0.0).reshape(rows)
    err, scale = np.max(np.abs(a - b), axis=-1), np.max(np.abs(b), axis=-1)
    return float(np.max(err / np.where(scale > 0, scale, 1.0)))


_SELECTED: ContextVar[Selection | None] = ContextVar("bloomery_reference_selection", default=None)
_INSIDE: ContextVar[bool] = ContextVar("bloomery_reference_run", default=False)


@contextmanager
def select(selection: Selection) -> Iterator[Selection]:
    """For the block (a gate run): ``run`` computes on ``selection.device`` (and on the host too, to compare)."""
    token = _SELECTED.set(selection)
    try:
        yield selection
    finally:
        _SELECTED.reset(token)


def selected() -> Selection | None:
    return _SELECTED.get()


def run(compute: Callable[[], R], label: str = "reference") -> R:
    """``compute()`` on the selected reference device, every array of its result in NumPy.

    Without a selection, or inside a run already, it is ``compute()`` itself. With ``compare`` an exact run
    (no storage rounding active: an emulated run's rounding may flip on a last-ulp difference, so those are
    counted, not compared) is repeated on the host and ``Compared.add``-ed."""
    sel = _SELECTED.get()
    if sel is None or _INSIDE.get():
        return compute()
    token = _INSIDE.set(True)
    try:
        t0 = time.perf_counter()
        if sel.device.is_host:
            out = compute()
        else:
            with on(sel.device):
                out = to_host(compute())
                sel.device.sync()
        sel.seconds += time.perf_counter() - t0
        if sel.compare and not sel.device.is_host:
            if emulating():
                sel.compared.skipped_emulated += 1
            else:
                t0 = time.perf_counter()
                sel.compared.add(label, out, compute())
                sel.host_seconds += time.perf_counter() - t0
    finally:
        _INSIDE.reset(token)
    return out
