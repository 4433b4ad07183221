"""A strict NumPy-backed stand-in for a CuPy device, so the reference's device plumbing is tested without a GPU.

Its arrays (``FakeArray``) refuse to mix with NumPy arrays the way CuPy's do: a NumPy function or ufunc on one, an
operator with a NumPy array on the other side, ``np.asarray`` of one, a NumPy array handed to one of its
functions (``asarray`` aside): each raises StrictMix. So a reference op that builds a host array in the middle of a
device run, or a harness line that reads a device array without ``reference.xp.to_host``, fails here as it would
on a card. The arithmetic is NumPy's own, so a run through it must equal the host run bit for bit.

``FakeNamespace(plant=...)`` wraps one function to plant a device-only defect (``--reference-compare`` tests).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from bloomery_gates.reference.xp import Device


class StrictMix(Exception):
    """Not a TypeError: NumPy takes a TypeError from __array__ as "not an array" and falls back to iterating."""
    pass


def _unwrap(x: Any, allow_host: bool = False) -> Any:
    if isinstance(x, FakeArray):
        return x._a
    if isinstance(x, np.ndarray) and not allow_host:
        raise StrictMix("a NumPy array handed to a device op (the fake device refuses it, as CuPy does)")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, allow_host) for v in x)
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return FakeArray(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    return x


class FakeArray:
    """A device array: a NumPy array inside that only this namespace's functions and its own operators touch."""

    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, a: np.ndarray):
        self._a = a

    def __array__(self, *args, **kwargs):
        raise StrictMix("implicit conversion of a fake device array to NumPy (use reference.xp.to_host)")

    def __array_function__(self, func, types, args, kwargs):
        raise StrictMix(f"numpy.{func.__name__} on a fake device array")

    @property
    def shape(self):
        return self._a.shape

    @property
    def ndim(self):
        return self._a.ndim

    @property
    def dtype(self):
        return self._a.dtype

    @property
    def size(self):
        return self._a.size

    @property
    def nbytes(self):
        return self._a.nbytes

    @property
    def T(self):  # noqa: N802
        return FakeArray(self._a.T)

    def __getattr__(self, name: str):
        if name.startswith("__"):            # never __array_interface__ & co.: NumPy would read the data through them
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **{key: _unwrap(v) for key, v in k.items()}))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(x) if isinstance(x, np.ndarray) else FakeArray(np.asarray(x)) for x in self._a)

    def __getitem__(self, key):
        out = self._a[_unwrap(key)]
        return FakeArray(np.asarray(out)) if not isinstance(out, np.ndarray) else FakeArray(out)

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __bool__(self):
        return bool(self._a)

    def __repr__(self):
        return f"FakeArray({self._a!r})"


def _binary(op: Callable, reflected: bool = False):
    def f(self, other):
        o = _unwrap(other)
        return _wrap(np.asarray(op(o, self._a) if reflected else op(self._a, o)))
    return f


def _inplace(op: Callable):
    def f(self, other):
        self._a = op(self._a, _unwrap(other))
        return self
    return f


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"):
    _op = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(FakeArray, f"__{_name}__", _binary(_op))
    setattr(FakeArray, f"__r{_name}__", _binary(_op, reflected=True))
    setattr(FakeArray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}")))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(FakeArray, f"__{_name}__", _binary(getattr(operator, _name)))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(FakeArray, f"__{_name}__", (lambda op: lambda self: FakeArray(np.asarray(op(self._a))))(
        getattr(operator, _name)))
FakeArray.__hash__ = None


class FakeNamespace:
    """numpy's functions over FakeArrays; ``asarray`` / ``array`` / ``ascontiguousarray`` take host arrays in (the
    upload). ``plant``: {name: f(numpy_function) -> replacement}, a defect only this 'device' has."""

    HOST_IN = ("asarray", "array", "ascontiguousarray")

    def __init__(self, plant: dict[str, Callable[[Callable], Callable]] | None = None):
        self._plant = plant or {}

    def __getattr__(self, name: str):
        obj = getattr(np, name)
        if isinstance(obj, type) or not callable(obj):
            return obj                                       # dtypes (float64, uint32), constants (inf)
        if name in self._plant:
            obj = self._plant[name](obj)
        allow = name in self.HOST_IN

        def call(*args, **kwargs):
            return _wrap(obj(*_unwrap(args, allow), **{k: _unwrap(v, allow) for k, v in kwargs.items()}))
        return call


def fake_device(plant: dict[str, Callable[[Callable], Callable]] | None = None, name: str = "fake:0",
                upload: Callable[[Any], Any] | None = None) -> Device:
    """A ``reference.xp.Device`` on the fake namespace (its ``get`` copies back to NumPy); ``upload``: the card's
    own tensor path (CuPy's goes through torch's ``.to``), None: the host's float32 upload."""
    return Device(name, FakeNamespace(plant), FakeArray, lambda a: np.array(a._a), upload=upload)
