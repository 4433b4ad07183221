"""Plant a defect in a GGUF that llama.cpp will run without complaint: a copy with some metadata values and tensors
replaced, and tensors added (the reader / writer of gguf-py, as bloomery_cli.llamacpp_run.f32_copy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def edited(src: Path, dst: Path, fields: Mapping[str, Any] | None = None,
           tensors: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
           add: Mapping[str, np.ndarray] | None = None) -> Path:
    """``src`` with ``fields`` values replaced (same types), each tensor in ``tensors`` replaced by f(values as
    float32, in the file's [rows, cols] order) and stored as F32, and the ``add`` tensors appended (F32)."""
    import gguf
    from gguf.quants import dequantize

    fields, tensors, add = dict(fields or {}), dict(tensors or {}), dict(add or {})
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, fields.pop(name, f.contents()), f.types[0], sub_type=sub)
    assert not fields, f"no such metadata: {sorted(fields)}"
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.name in tensors:
            x = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
            w.add_tensor(t.name, np.ascontiguousarray(tensors.pop(t.name)(x), dtype=np.float32))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    assert not tensors, f"no such tensors: {sorted(tensors)}"
    for name, x in add.items():
        w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def read(src: Path, name: str) -> np.ndarray:
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(src))
    (t,) = [t for t in r.tensors if t.name == name]
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        tuple(int(d) for d in reversed(t.shape.tolist())))
