"""Hugging Face checkpoint directories: ``config.json`` plus safetensors (one file or index shards).

Expected layout::

    <dir>/config.json                          # parsed as JSON data only; auto_map is never acted on
    <dir>/model.safetensors                    # one file, or
    <dir>/model.safetensors.index.json         # {"weight_map": {tensor name: shard file}} + the shards

Tensors are memory-mapped with ``safetensors.safe_open`` and read on first access. Stored dtypes
F32, F16 and BF16 are accepted; any other dtype is a ``BadTensor`` when that tensor is needed, unless a reader
has allowed it for that tensor by name (``SafetensorsTensors.allow``: DeepSeek V4's packed FP4 experts, I8 / U8
codes and F8_E8M0 / U8 scales, handed out as uint8 bytes after the reader's own check of their values).
Pickle checkpoints (``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) are refused: we never unpickle.
Nothing in the directory is imported or executed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from bloomery_cli.files import check_readable, parse_json, read_text
from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.lazy import LazyTensors
from bloomery_gates.errors import BadTensor, InputError, MissingFile, Refused

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
INTEGER_TABLES = (".tid2eid",)     # integer tensors a reader checks itself (DeepSeek V4's token -> expert table)
INTEGER_DTYPES = ("I32", "I64")


def refuse_pickle(path: Path) -> None:
    """Raise ``Refused`` if ``path`` is a pickle checkpoint file."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise Refused(path, "a pickle checkpoint; we never unpickle (it can run code). "
                            "Convert it to safetensors and pass the directory")


def read_json(path: Path, what: str = "JSON file") -> dict[str, Any]:
    """Read a JSON object; a missing file is ``MissingFile``, a directory or unreadable file ``Unreadable``,
    bad JSON (or JSON nested past the parser) ``InputError``, each naming the file (``bloomery_cli.files``)."""
    data = parse_json(read_text(path, what), path, what)
    if not isinstance(data, dict):
        raise InputError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def read_config(directory: Path) -> dict[str, Any]:
    """``<directory>/config.json`` as a dict (data only)."""
    return read_json(directory / "config.json", "model config (config.json)")


def model_config(directory: Path, types: Sequence[str]) -> tuple[Cfg, Cfg]:
    """(the file's Cfg, the numbers' Cfg) of ``<directory>/config.json``: ``model_type`` must be one of ``types``
    (the family's, from the registry), and the numbers sit under ``text_config`` when the file is a multimodal
    wrapper, else at the top."""
    top = Cfg(read_config(directory), directory / "config.json")
    model_type = top.get("model_type", what=f"one of {list(types)}")
    if model_type not in types:
        raise top.bad("model_type", f"{model_type!r} is not supported; expected one of {list(types)}")
    return top, top.sub("text_config") if top.get("text_config", None) is not None else top


class SafetensorsTensors(LazyTensors):
    """HF tensor name -> torch tensor (stored dtype), read from memory-mapped safetensors files."""

    def __init__(self, files: list[Path]):
        super().__init__()
        self.files = files
        self._allowed: dict[str, tuple[tuple[str, ...], Callable[[str, torch.Tensor], torch.Tensor]]] = {}
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        for f in files:
            handle = _open(f)
            self._handles[f] = handle
            names = handle.keys()
            for name in names:
                if name in self._where:
                    raise BadTensor(f"{f}: tensor {name}", f"also stored in {self._where[name]}; "
                                                           "expected each tensor in one file")
                self._where[name] = f

    def _names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def _slice(self, name: str) -> Any:
        return self._handles[self._where[name]].get_slice(name)

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._slice(name).get_shape())

    def dtype_of(self, name: str) -> str:
        return str(self._slice(name).get_dtype())

    def file_of(self, name: str) -> Path:
        return self._where[name]

    def allow(self, names: Iterable[str], dtypes: tuple[str, ...],
              on_read: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
        """Let ``names`` be stored in ``dtypes`` too (a reader's packed tensors); each is passed through
        ``on_read(name, tensor)`` when it is read (the reader's value check and view; it raises a named error)."""
        for name in names:
            self._allowed[name] = (dtypes, on_read)

    def check_dtype(self, name: str) -> None:
        dtype = self.dtype_of(name)
        if name.endswith(INTEGER_TABLES) and dtype in INTEGER_DTYPES:
            return
        if name in self._allowed:
            if dtype in self._allowed[name][0]:
                return
            raise BadTensor(self.label(name), f"dtype {dtype}; expected one of {', '.join(self._allowed[name][0])}")
        if dtype not in TORCH_DTYPES:
            raise BadTensor(self.label(name), f"dtype {dtype}; expected one of {', '.join(TORCH_DTYPES)}")

    def _load(self, name: str) -> torch.Tensor:
        """The tensor as a view of its own mapping of the file: its pages leave the process's resident set
        when the tensor is freed (a handle kept open would keep every page it ever served resident)."""
        f = self._where[name]
        try:
            with safe_open(str(f), framework="pt") as handle:
                t = handle.get_tensor(name)
        except (SafetensorError, RuntimeError, OSError, MemoryError) as exc:
            raise InputError(f, f"cannot read tensor {name}: {exc}") from None
        return self._allowed[name][1](name, t) if name in self._allowed else t


def _open(path: Path) -> Any:
    check_readable(path, "safetensors file")
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, RuntimeError, MemoryError) as exc:
        raise InputError(path, f"not a readable safetensors file (truncated or corrupt?): {exc}") from None


def shards_from_index(index_path: Path) -> tuple[dict[str, str], list[Path]]:
    """The index's weight map and its shard files, each a plain file name in the index's own folder (the one
    owner of this check: the gate, inventory and plan all read an index through here)."""
    index = read_json(index_path, "safetensors shard index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(index_path, "expected a non-empty 'weight_map' object {tensor name: shard file}")
    shards: list[Path] = []
    for shard in weight_map.values():
        if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard.startswith("."):
            raise InputError(index_path, f"weight_map entry {shard!r}: expected a file name in this folder")
        p = index_path.parent / shard
        if p not in shards:
            shards.append(p)
    return weight_map, shards


def open_safetensors_dir(directory: Path) -> SafetensorsTensors:
    """All tensors of an HF directory: the shards of ``*.safetensors.index.json`` or every ``*.safetensors``.

    Raises ``Refused`` when the directory holds only pickle weights, ``MissingFile`` when it holds none.
    """
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise InputError(directory, f"several shard indexes ({', '.join(p.name for p in indexes)}); "
                                    "expected one *.safetensors.index.json")
    if indexes:
        weight_map, shards = shards_from_index(indexes[0])
        tensors = SafetensorsTensors(shards)
        for name, shard in weight_map.items():
            if name not in tensors or tensors.file_of(name).name != shard:
                raise BadTensor(f"{directory / shard}: tensor {name}",
                                f"listed in {indexes[0].name} but not in that file")
        return tensors
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return SafetensorsTensors(files)
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise Refused(directory, f"only pickle weights ({', '.join(pickles[:4])}); we never unpickle. "
                                 "Convert them to safetensors")
    raise MissingFile(directory, "no *.safetensors weights; expected model.safetensors or "
                                 "model.safetensors.index.json with its shards")
