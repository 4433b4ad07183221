"""Put a GGUF written from a bundled HF fixture beside it: moved into ``fixtures/``, listed in MANIFEST.json (sha256,
bytes) and in the HF model's entry (``files`` and a ``gguf_export`` record of how it was made), refused with nothing
moved when the fixtures would then store more than ``MAX_FIXTURE_BYTES`` distinct bytes."""

from __future__ import annotations

import os
from pathlib import Path

from .install import MAX_FIXTURE_BYTES
from .manifest import Manifest, verified


def register_gguf(fixtures: Path, tmp: Path, name: str, target: str, export: dict[str, str]) -> Path:
    """``tmp`` (a written, checked GGUF) -> ``fixtures/name``, registered under model ``target`` with ``export``."""
    dst = fixtures / name
    man = Manifest.read(fixtures)
    old = man.files.pop(name, None)
    os.replace(tmp, dst)
    man.add_files(fixtures, [dst])
    if man.stored_bytes > MAX_FIXTURE_BYTES:
        dst.unlink()
        if old is not None:
            man.files[name] = old
        raise RuntimeError(f"fixtures would store {man.stored_bytes} distinct bytes with {name}, over the "
                           f"{MAX_FIXTURE_BYTES} limit (write it elsewhere with --gguf-out)")
    entry = man.models[target]
    entry["files"] = sorted(set(entry["files"]) | {name})
    entry["gguf_export"] = dict(export)
    man.write(fixtures)
    verified(fixtures, f"{name} GGUF export")
    return dst
