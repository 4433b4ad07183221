"""GGUF files (llama.cpp): metadata as Python values, tensors dequantized to float32 on demand.

Read with ``gguf.GGUFReader`` (memory-mapped). GGUF stores ggml shapes innermost-first (``ne[0]`` is
the contiguous dim), so an HF weight ``[out, in]`` has ggml shape ``(in, out)``; this module always
hands out the logical numpy/torch order (``[out, in]``), the reverse of the ggml dims.

Tensor types read: F32, F16, BF16, the legacy quants Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the K-quants
Q2_K..Q6_K and MXFP4, all dequantized with ``gguf.quants.dequantize``. Any other type is a
``BadTensor`` naming the tensor and the type when that tensor is needed. A truncated or corrupt file
is an ``InputError`` naming the file; a split GGUF (``split.count`` > 1) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from bloomery_cli.files import check_readable
from bloomery_cli.formats.lazy import LazyTensors
from bloomery_gates.errors import BadTensor, InputError, Refused

GGUF_MAGIC = b"GGUF"
_Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset({
    _Q.F32, _Q.F16, _Q.BF16, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q8_0,
    _Q.Q2_K, _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K, _Q.MXFP4,
})
_MISSING = object()

# llama.cpp tensor names -> HF names, for the llama-like families (qwen3). {i} is the block index.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    """The HF name of a llama.cpp tensor name (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.
    q_proj.weight``); names with no HF counterpart are returned unchanged."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return gguf_name


def is_gguf(path: Path) -> bool:
    """True for a ``*.gguf`` file or any file that starts with the GGUF magic."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.99e-07)."""
    return float(str(np.float32(x)))


class GGUFFile:
    """One GGUF file: ``meta(key)`` for metadata, ``tensors(rename)`` for a lazy tensor mapping."""

    def __init__(self, path: Path):
        self.path = Path(path)
        check_readable(self.path, "GGUF file")
        try:
            self.reader = GGUFReader(self.path)
        except Exception as exc:  # GGUFReader raises ValueError/IndexError/... on a bad or short file
            raise InputError(self.path, f"not a readable GGUF file (truncated or corrupt?): {exc}") from None
        self._by_name = {t.name: t for t in self.reader.tensors}
        split = self.meta("split.count", 1)
        if isinstance(split, int) and split > 1:
            raise Refused(self.path, f"one part of a split GGUF ({split} parts); merge it first "
                                     "(llama-gguf-split --merge) and pass the merged file")

    def meta_keys(self) -> list[str]:
        return list(self.reader.fields)

    def meta(self, key: str, default: Any = _MISSING) -> Any:
        """The metadata value of ``key`` as a Python value (str, int, float, bool or list).

        With no default, a missing key raises ``KeyError``; callers turn that into ``BadConfig``.
        """
        field = self.reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = field.contents()
        kind = field.types[-1] if field.types else None
        if kind == GGUFValueType.FLOAT32:
            value = [_f32(v) for v in value] if isinstance(value, list) else _f32(value)
        return value

    def tensor_names(self) -> list[str]:
        return list(self._by_name)

    def tensors(self, rename: Callable[[str], str] = hf_name) -> GGUFTensors:
        """A lazy mapping ``rename(gguf name) -> float32 tensor`` in logical order."""
        return GGUFTensors(self, rename)


class GGUFTensors(LazyTensors):
    """Public name -> float32 torch tensor, dequantized from the GGUF on first access."""

    def __init__(self, file: GGUFFile, rename: Callable[[str], str]):
        super().__init__()
        self.file = file
        self._raw: dict[str, Any] = {}
        for gname, t in file._by_name.items():
            public = rename(gname)
            if public in self._raw:
                raise BadTensor(f"{file.path}: tensor {gname}",
                                f"maps to {public}, which {self._raw[public].name} already gives")
            self._raw[public] = t

    def _names(self) -> list[str]:
        return list(self._raw)

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def gguf_name(self, name: str) -> str:
        return self._raw[name].name

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self._raw[name].shape.tolist()))

    def dtype_of(self, name: str) -> str:
        return self._raw[name].tensor_type.name

    def element_bytes(self, name: str) -> int:
        return 4                                  # every type is dequantized to float32 (_load)

    def file_of(self, name: str) -> Path:
        return self.file.path

    def label(self, name: str) -> str:
        g = self._raw[name].name
        return f"{self.file.path}: tensor {g}" + (f" (= {name})" if g != name else "")

    def check_dtype(self, name: str) -> None:
        t = self._raw[name]
        if t.tensor_type not in SUPPORTED_TYPES:
            raise BadTensor(self.label(name), f"type {t.tensor_type.name} is not supported; expected one of "
                                              f"{', '.join(sorted(q.name for q in SUPPORTED_TYPES))}")

    def _load(self, name: str) -> torch.Tensor:
        t = self._raw[name]
        try:
            arr = dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise BadTensor(self.label(name), f"cannot dequantize {t.tensor_type.name}: {exc}") from None
        arr = np.array(arr, dtype=np.float32, copy=True).reshape(self.shape_of(name))
        return torch.from_numpy(arr)
