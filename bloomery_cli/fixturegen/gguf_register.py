"""Put a GGUF written from a bundled HF fixture beside it: moved into ``fixtures/``, listed in MANIFEST.json (sha256,
bytes) and in the HF model's entry (``files`` and a ``gguf_export`` record of how it was made), refused with nothing
moved when the fixtures would then store more than ``MAX_FIXTURE_BYTES`` distinct bytes; ``export_checked`` the
write / read-back / register sequence the families' ``fixture_gguf.export_gguf`` share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .install import MAX_FIXTURE_BYTES
from .manifest import Manifest, verified


def register_gguf(fixtures: Path, tmp: Path, name: str, target: str, export: dict[str, str],
                  label: str | None = None) -> Path:
    """``tmp`` (a written, checked GGUF) -> ``fixtures/name``, registered under model ``target`` with ``export``;
    ``label`` names the step in a failed verify (default ``"<name> GGUF export"``)."""
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
    verified(fixtures, label or f"{name} GGUF export")
    return dst


def export_from_hf(fixtures: Path, out: Path | None, name: str, target: str, write: Callable, check: Callable,
                   export: dict[str, str], label: str | None = None) -> Path:
    """``export_checked`` for a GGUF written from the HF fixture ``fixtures/target``: its spec and tokenizer read
    here, then ``write(tmp, spec, tok)`` and ``check(tmp, spec)``."""
    from tokenizers import Tokenizer

    from ..loading import load_target

    spec = load_target(fixtures / target)
    tok = Tokenizer.from_file(str(fixtures / target / "tokenizer.json"))
    return export_checked(fixtures, out, name, target, lambda tmp: write(tmp, spec, tok), lambda tmp: check(tmp, spec),
                          export, label)


def export_checked(fixtures: Path, out: Path | None, name: str, target: str, write: Callable[[Path], None],
                   check: Callable[[Path], None], export: dict[str, str], label: str | None = None) -> Path:
    """``write(tmp)`` then ``check(tmp)`` (the read-back against the HF fixture; raises on a difference), tmp
    beside the destination (``out``, or ``fixtures/name``); with ``out`` moved there unregistered, without
    ``register_gguf``'d under model ``target``."""
    dst = out or fixtures / name
    tmp = dst.with_name(dst.name + ".tmp")
    write(tmp)
    os.chmod(tmp, 0o644)
    check(tmp)
    if out is not None:
        os.replace(tmp, dst)
        return dst
    return register_gguf(fixtures, tmp, name, target, export, label)
