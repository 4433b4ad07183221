"""Fixtures made on demand from the stored ones instead of stored twice: a GGUF that is the HF fixture's own
weights in llama.cpp's layout (``qwen3-tiny.gguf`` = ``qwen3-tiny/`` through ``export_gguf.write_target_gguf``,
byte for byte). ``MANIFEST.json`` lists each under ``derived`` with its sha256; ``derived(name, fixtures)`` writes
it once into the cache folder beside ``fixtures/`` (``.fixtures-derived/``, or ``$BLOOMERY_DERIVED``), checks the
sha256 and returns the path. fixtures/ then holds each content once (the size budget counts what it stores)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from bloomery_gates.errors import InputError

from .hashing import sha256_file
from .manifest import Manifest


def _qwen3_gguf(fixtures: Path, path: Path) -> None:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from . import export_gguf
    from .train import TargetShape

    man = Manifest.read(fixtures)
    params = load_file(str(fixtures / "qwen3-tiny" / "model.safetensors"))
    tok = Tokenizer.from_file(str(fixtures / "tokenizer.json"))
    export_gguf.write_target_gguf(path, TargetShape(**man.models["qwen3-tiny"]["shape"]), params, tok)


WRITERS: dict[str, Callable[[Path, Path], None]] = {"qwen3-tiny.gguf": _qwen3_gguf}


def cache_dir(fixtures: Path) -> Path:
    return Path(os.environ.get("BLOOMERY_DERIVED") or Path(fixtures).resolve().parent / ".fixtures-derived")


def beside(fixtures: Path, folder: Path) -> None:
    """The readers take a GGUF's tokenizer from the tokenizer.json beside it, as in fixtures/: a link to it."""
    folder.mkdir(parents=True, exist_ok=True)
    link, target = folder / "tokenizer.json", (Path(fixtures) / "tokenizer.json").resolve()
    if not (link.is_symlink() and link.resolve() == target):
        link.unlink(missing_ok=True)
        link.symlink_to(target)


def derived(name: str, fixtures: Path) -> Path:
    """The derived fixture ``name`` of ``fixtures`` (module docstring): made on first use, its sha256 checked
    against the manifest (a RuntimeError naming both when the writer no longer reproduces it)."""
    fixtures = Path(fixtures)
    want = Manifest.read(fixtures).derived.get(name)
    if want is None or name not in WRITERS:
        raise InputError(fixtures / name, f"not a derived fixture (derived: {', '.join(sorted(WRITERS))})")
    out = cache_dir(fixtures) / name
    beside(fixtures, out.parent)
    if out.is_file() and out.stat().st_size == want["bytes"] and sha256_file(out) == want["sha256"]:
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        WRITERS[name](fixtures, tmp)
        got = sha256_file(tmp)
        if got != want["sha256"]:
            raise RuntimeError(f"{name}: written from {want.get('from')} with sha256 {got[:16]}..., the manifest "
                               f"says {want['sha256'][:16]}...")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def stored_or_derived(path: Path) -> Path:
    """``path`` itself, or where it is missing and names a derived fixture of the folder it would be in (that
    folder's MANIFEST.json lists it under ``derived``), the derived file: ``--target fixtures/qwen3-tiny.gguf``
    and the llama.cpp engine's GGUF beside a gate's target keep working."""
    path = Path(path)
    if path.exists() or not (path.parent / "MANIFEST.json").is_file() or path.name not in WRITERS:
        return path
    return derived(path.name, path.parent)
