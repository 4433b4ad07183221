"""The safetensors headers of an HF directory, read as bytes: the 8-byte length and the JSON header of each file,
nothing after it (a file whose tensor data is truncated or garbage still plans). GGUF files go through the
inventory's header reader (tensor infos only). The result is the inventory's ``ModelInventory``, grouped by its
``_classify`` (mtp_nextn, token_embd, output, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError, MissingFile, Refused

from ..files import read_json_file
from ..formats.hf_dir import PICKLE_SUFFIXES, shards_from_index

_MAX_HEADER = 100 << 20


def _header(f: Path) -> dict[str, Any]:
    try:
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= _MAX_HEADER:
                raise InputError(f, f"header length {n}: expected a safetensors file (8-byte length + JSON header)")
            raw = fh.read(n)
    except OSError as exc:
        raise InputError(f, f"cannot read the safetensors header: {exc.strerror}") from None
    if len(raw) < n:
        raise InputError(f, f"the safetensors header is cut short ({len(raw)} of {n} bytes)")
    try:
        head = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f, f"the safetensors header is not JSON: {exc}") from None
    if not isinstance(head, dict):
        raise InputError(f, "the safetensors header is not a JSON object")
    return head


def _files(d: Path) -> list[Path]:
    index = sorted(d.glob("*.safetensors.index.json"))
    if index:
        files = sorted(shards_from_index(index[0])[1])
        for f in files:
            if not f.is_file():
                raise MissingFile(f, f"named by {index[0].name} but missing")
        return files
    files = sorted(d.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in d.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES]
        if pickles:
            raise Refused(d / pickles[0], "a pickle checkpoint; we never unpickle (it can run code). "
                                          "Convert it to safetensors and pass the directory")
        raise MissingFile(d, "no *.safetensors files; expected an HF checkpoint directory")
    return files


def header_model(path: Path):
    """A ``ModelInventory`` of ``path`` (an HF dir or a GGUF) from its headers alone, classified."""
    from ..inventory.groups import _classify
    from ..inventory.model import _ST_BITS, ModelInventory, TensorRow
    from ..inventory.read import _gguf_model, _hf_meta

    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        m = _gguf_model([path])
    elif path.is_dir():
        m = ModelInventory(label=str(path), fmt="safetensors", files=_files(path))
        for f in m.files:
            for name, info in _header(f).items():
                if name == "__metadata__":
                    continue
                try:
                    shape, dtype = tuple(int(x) for x in info["shape"]), str(info["dtype"])
                except (KeyError, TypeError, ValueError):
                    raise InputError(f, f"tensor {name!r}: expected 'shape' and 'dtype' in the header") from None
                numel = 1
                for x in shape:
                    numel *= x
                m.tensors.append(TensorRow(name, f, dtype, shape, (numel * _ST_BITS.get(dtype.upper(), 8) + 7) // 8))
        cfg_path = path / "config.json"
        cfg: dict[str, Any] = {}
        if cfg_path.is_file():
            cfg = read_json_file(cfg_path, "model config (config.json)")
            if not isinstance(cfg, dict):
                raise InputError(cfg_path, "expected a JSON object")
            m.config = cfg_path
        _hf_meta(m, cfg)
    else:
        raise InputError(path, "expected an HF checkpoint directory or a *.gguf file")
    _classify(m)
    return m
