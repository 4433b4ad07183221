"""Inputs to models: which files form one checkpoint, and their tensors from the headers alone."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from bloomery_cli.files import read_json_file
from bloomery_cli.formats.gguf_file import GGUFFile, is_gguf
from bloomery_cli.formats.hf_dir import (
    PICKLE_SUFFIXES,
    SafetensorsTensors,
    open_safetensors_dir,
    read_json,
    refuse_pickle,
    shards_from_index,
)
from bloomery_gates.errors import InputError, MissingFile

from .model import (
    _HF_NEXTN_KEYS,
    _HF_ROUTED_KEYS,
    _HF_SHARED_KEYS,
    _HF_USED_KEYS,
    _SPLIT_RE,
    _ST_BITS,
    ModelInventory,
    TensorRow,
)

# ---------------------------------------------------------------------------------------------
# inputs -> models


class _HeaderGGUF(GGUFFile):
    """A GGUF opened for its header only; unlike GGUFFile, one part of a split GGUF is accepted."""

    def __init__(self, path: Path):  # deliberately not GGUFFile.__init__ (it refuses split parts)
        self.path = Path(path)
        try:
            self.reader = GGUFReader(self.path)
        except Exception as exc:  # GGUFReader raises ValueError/IndexError/... on a bad or short file
            raise InputError(self.path, f"not a readable GGUF file (truncated or corrupt?): {exc}") from None
        self._by_name = {t.name: t for t in self.reader.tensors}


def _group_inputs(paths: list[Path]) -> list[tuple[str, list[Path]]]:
    """Sort the inputs into models: ("hf-dir", [dir]), ("st", files of one folder), ("gguf", parts)."""
    if not paths:
        raise InputError("inventory", "no files given; expected GGUF or safetensors files, or an HF directory")
    units: list[tuple[str, list[Path]]] = []
    st_by_dir: dict[Path, list[Path]] = {}
    gguf_splits: dict[str, list[Path]] = {}
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        if not p.exists():
            raise MissingFile(p, "missing; expected a GGUF file, a safetensors file or an HF directory")
        if p.is_dir():
            units.append(("hf-dir", [p]))
            continue
        if p.suffix.lower() in PICKLE_SUFFIXES:
            refuse_pickle(p)
        name = p.name.lower()
        if name.endswith(".safetensors.index.json"):
            units.append(("st-index", [p]))
        elif name.endswith(".safetensors"):
            if p.parent.resolve() not in st_by_dir:
                st_by_dir[p.parent.resolve()] = []
                units.append(("st", st_by_dir[p.parent.resolve()]))
            st_by_dir[p.parent.resolve()].append(p)
        elif is_gguf(p):
            m = _SPLIT_RE.match(p.name)
            if m:
                base = str(p.parent.resolve() / m["base"])
                if base not in gguf_splits:
                    gguf_splits[base] = []
                    units.append(("gguf", gguf_splits[base]))
                gguf_splits[base].append(p)
            else:
                units.append(("gguf", [p]))
        else:
            raise InputError(p, "not a GGUF or safetensors file; expected *.gguf, *.safetensors, "
                                "*.safetensors.index.json or an HF directory")
    for kind, files in units:
        if kind in ("st", "gguf"):
            files.sort(key=lambda f: f.name)
    return units




# -- safetensors ------------------------------------------------------------------------------

_MAX_ST_HEADER = 100 << 20      # the safetensors crate's own header limit


def _st_model(kind: str, files: list[Path]) -> ModelInventory:
    if kind == "hf-dir":
        directory = files[0]
        gguf_files = sorted(directory.glob("*.gguf"))
        if gguf_files and not any(directory.glob("*.safetensors")):
            raise InputError(directory, f"holds GGUF files ({', '.join(f.name for f in gguf_files[:4])}); "
                                        "pass the GGUF file(s) themselves")
        st = open_safetensors_dir(directory)
        label = str(directory)
    elif kind == "st-index":
        directory = files[0].parent
        shards = sorted(shards_from_index(files[0])[1], key=lambda f: f.name)
        st = SafetensorsTensors(shards)
        label = str(files[0])
    else:
        directory = files[0].parent
        st = SafetensorsTensors(files)
        label = str(files[0]) if len(files) == 1 else f"{directory} ({len(files)} shards)"
    m = ModelInventory(label=label, fmt="safetensors", files=list(st.files))
    sizes: dict[Path, dict[str, int]] = {}
    for name in st:
        f = st.file_of(name)
        shape = st.shape_of(name)
        dtype = st.dtype_of(name)
        m.tensors.append(TensorRow(name, f, dtype, shape, _st_nbytes(f, name, dtype, shape, sizes)))
    _shard_notes(m, directory, kind)
    cfg_path = directory / "config.json"
    cfg: dict[str, Any] = {}
    if cfg_path.is_file():
        cfg = read_json(cfg_path, "model config (config.json)")
        m.config = cfg_path
    _hf_meta(m, cfg)
    return m


def _st_nbytes(f: Path, name: str, dtype: str, shape: tuple[int, ...], cache: dict[Path, dict[str, int]]) -> int:
    numel = 1
    for d in shape:
        numel *= d
    bits = _ST_BITS.get(dtype.upper())
    if bits is not None:
        return (numel * bits + 7) // 8
    if f not in cache:  # an exotic dtype: take the byte span from the header's data_offsets
        cache[f] = _st_spans(f)
    return cache[f].get(name, 0)


def _st_spans(f: Path) -> dict[str, int]:
    try:
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if n > _MAX_ST_HEADER:
                raise ValueError(f"header length {n} past {_MAX_ST_HEADER} bytes")
            header = json.loads(fh.read(n))
        return {k: int(v["data_offsets"][1]) - int(v["data_offsets"][0])
                for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as exc:
        raise InputError(f, f"cannot read the safetensors header: {type(exc).__name__} {exc}") from None


def _shard_notes(m: ModelInventory, directory: Path, kind: str) -> None:
    if kind != "st":
        return
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) != 1:
        return
    data = read_json_file(indexes[0], "safetensors shard index")
    weight_map = (data.get("weight_map") if isinstance(data, dict) else None) or {}
    listed = {str(v) for v in weight_map.values()}
    given = {f.name for f in m.files}
    missing = sorted(listed - given)
    if missing:
        m.notes.append(f"{len(given & listed)} of {len(listed)} shards listed in {indexes[0].name} given; "
                       f"totals cover the given shards only (missing: {', '.join(missing[:4])}"
                       f"{', ...' if len(missing) > 4 else ''})")


def _first_int(cfgs: Iterable[dict[str, Any]], keys: Iterable[str]) -> tuple[int | None, str | None]:
    for cfg in cfgs:
        for k in keys:
            v = cfg.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v, k
    return None, None


def _hf_meta(m: ModelInventory, cfg: dict[str, Any]) -> None:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    cfgs = [text, cfg]
    if m.config is None:
        m.notes.append("no config.json beside the files: counts come from tensor names only")
    mt = cfg.get("model_type")
    m.arch = mt if isinstance(mt, str) else None
    archs = cfg.get("architectures")
    m.architectures = [str(a) for a in archs] if isinstance(archs, list) else []
    spec_type = cfg.get("speculators_model_type")
    m.block_count, _ = _first_int(cfgs, ("num_hidden_layers",))
    m.nextn_layers, nk = _first_int(cfgs, _HF_NEXTN_KEYS)
    m.n_routed, rk = _first_int(cfgs, _HF_ROUTED_KEYS)
    m.n_used, uk = _first_int(cfgs, _HF_USED_KEYS)
    m.n_shared, sk = _first_int(cfgs, _HF_SHARED_KEYS)
    meta = m.meta
    if m.config is not None:
        meta["config"] = str(m.config)
    meta["model_type"] = m.arch
    if text.get("model_type"):
        meta["text_config.model_type"] = text.get("model_type")
    if m.architectures:
        meta["architectures"] = ", ".join(m.architectures)
    if spec_type:
        meta["speculators_model_type"] = spec_type
    meta["num_hidden_layers"] = m.block_count
    if nk:
        meta[nk] = m.nextn_layers
    if rk:
        meta[rk] = m.n_routed
    if uk:
        meta[uk] = m.n_used
    if sk:
        meta[sk] = m.n_shared
    for k in ("tie_word_embeddings", "torch_dtype", "dtype", "block_size"):
        v = next((c[k] for c in cfgs if k in c), None)
        if v is not None:
            meta[k] = v
    dcfg = cfg.get("dflash_config")
    if isinstance(dcfg, dict):
        for k in ("block_size", "target_layer_ids", "mask_token_id"):
            if k in dcfg:
                meta[f"dflash_config.{k}"] = dcfg[k]
    meta["files"] = len(m.files)


# -- GGUF -------------------------------------------------------------------------------------


def _gguf_model(files: list[Path]) -> ModelInventory:
    parts = [_HeaderGGUF(f) for f in files]
    label = str(files[0]) if len(files) == 1 else f"{files[0].parent / _SPLIT_RE.match(files[0].name)['base']}" \
        f"-*.gguf ({len(files)} parts)"
    m = ModelInventory(label=label, fmt="gguf", files=list(files))
    seen: dict[str, Path] = {}
    for part in parts:
        for t in part.reader.tensors:
            if t.name in seen:
                raise InputError(part.path, f"tensor {t.name} is also in {seen[t.name]}; "
                                            "expected each tensor in one file (two different models?)")
            seen[t.name] = part.path
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            m.tensors.append(TensorRow(t.name, part.path, t.tensor_type.name, shape, int(t.n_bytes)))

    def meta(key: str) -> Any:
        for part in parts:
            v = part.meta(key, None)
            if v is not None:
                return v
        return None

    arch = meta("general.architecture")
    m.arch = str(arch) if arch is not None else None
    a = m.arch or "?"

    def meta_int(key: str) -> int | None:
        v = meta(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    m.block_count = meta_int(f"{a}.block_count")
    m.nextn_layers = meta_int(f"{a}.nextn_predict_layers")
    m.n_routed = meta_int(f"{a}.expert_count")
    m.n_used = meta_int(f"{a}.expert_used_count")
    m.n_shared = meta_int(f"{a}.expert_shared_count")
    show = ["general.architecture", "general.name", f"{a}.block_count", f"{a}.nextn_predict_layers",
            f"{a}.expert_count", f"{a}.expert_used_count", f"{a}.expert_shared_count",
            f"{a}.embedding_length", f"{a}.context_length", f"{a}.block_size", f"{a}.target_layers"]
    for k in show:
        v = meta(k)
        if v is not None:
            m.meta[k] = v
    split = meta_int("split.count")
    if split and split > 1:
        m.meta["split.count"] = split
        if len(files) < split:
            m.notes.append(f"split GGUF of {split} parts, {len(files)} given; totals cover the given parts only")
    m.meta["files"] = len(files)
    return m
