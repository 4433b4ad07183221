"""fixtures/MANIFEST.json: every file's sha256 and size, how the fixtures were made, and what they scored.

``verify(out_dir)`` recomputes the hashes (through the links of equal content, ``links``); it returns one line
per problem (an empty list is a pass).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from bloomery_gates.errors import InputError

from ..files import read_json_file
from .hashing import sha256_file
from .links import link_duplicates

MANIFEST_NAME = "MANIFEST.json"
FORMAT = "bloomery-fixtures/1"


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


@dataclass
class Manifest:
    files: dict[str, dict] = field(default_factory=dict)          # relpath (POSIX) -> {sha256, bytes}
    made_by: dict = field(default_factory=dict)                   # command, seeds, versions, device
    corpus: dict = field(default_factory=dict)
    tokenizer: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)                    # name -> config summary, training, scores
    prompts: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict)    # name -> {sha256, bytes, from, by}: made on demand, not stored
    format: str = FORMAT

    def add_files(self, root: Path, paths: list[Path]) -> None:
        for p in sorted(paths):
            rel = p.relative_to(root).as_posix()
            self.files[rel] = file_entry(p)

    @property
    def total_bytes(self) -> int:
        return sum(int(e["bytes"]) for e in self.files.values())

    @property
    def stored_bytes(self) -> int:
        """Bytes of distinct content (by sha256): what the repository stores, since git keeps one blob for
        files of equal content (a layout copy of the same weights costs nothing). The size caps apply here."""
        return sum({e["sha256"]: int(e["bytes"]) for e in self.files.values()}.values())

    def to_json(self) -> str:
        body = {
            "format": self.format,
            "total_bytes": self.total_bytes,
            "stored_bytes": self.stored_bytes,
            "files": dict(sorted(self.files.items())),
            "made_by": self.made_by,
            "corpus": self.corpus,
            "tokenizer": self.tokenizer,
            "prompts": self.prompts,
            "models": self.models,
            "derived": dict(sorted(self.derived.items())),
        }
        return json.dumps(body, indent=2) + "\n"

    def write(self, root: Path) -> Path:
        """The manifest into ``root``, then every later copy of a listed content linked to its first file
        (``links.link_duplicates``: a checkout holds each content once, as the repository does)."""
        path = Path(root) / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        link_duplicates(root, self.files)
        return path

    @classmethod
    def read(cls, root: Path) -> Manifest:
        """The manifest, its shape checked (an ``InputError`` naming the key): a JSON object whose ``files`` maps
        relative paths inside ``root`` to ``{"bytes": int, "sha256": str}``."""
        path = Path(root) / MANIFEST_NAME
        d = read_json_file(path, "fixtures manifest")
        if not isinstance(d, dict):
            raise InputError(path, f"expected a JSON object, got {type(d).__name__}")
        for key in ("files", "made_by", "corpus", "tokenizer", "models", "prompts", "derived"):
            if not isinstance(d.get(key, {}), dict):
                raise InputError(path, f"key {key!r}: expected an object, got {type(d[key]).__name__}")
        if not isinstance(d.get("format", ""), str):
            raise InputError(path, f"key 'format': expected a string, got {type(d['format']).__name__}")
        for rel, want in (*d.get("files", {}).items(), *d.get("derived", {}).items()):
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise InputError(path, f"files key {rel!r}: expected a path inside {root}")
            if not (isinstance(want, dict) and isinstance(want.get("bytes"), int)
                    and not isinstance(want.get("bytes"), bool) and isinstance(want.get("sha256"), str)):
                raise InputError(path, f"files[{rel!r}]: expected {{\"bytes\": int, \"sha256\": str}}, "
                                       f"got {want!r:.80}")
        return cls(files=d.get("files", {}), made_by=d.get("made_by", {}), corpus=d.get("corpus", {}),
                   tokenizer=d.get("tokenizer", {}), models=d.get("models", {}), prompts=d.get("prompts", {}),
                   derived=d.get("derived", {}), format=d.get("format", ""))


def verified(out_dir: Path, after: str) -> None:
    """``verify`` that must come back clean: a RuntimeError naming the build step ``after`` otherwise."""
    problems = verify(out_dir)
    if problems:
        raise RuntimeError(f"fixtures do not verify after the {after}: " + "; ".join(problems))


def verify(out_dir: Path) -> list[str]:
    """Problems with ``out_dir`` against its manifest: missing, resized or changed files, files the
    manifest does not list (hidden files and caches ignored), an unreadable manifest."""
    root = Path(out_dir)
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        return [f"{mpath}: missing (run `bloomery fixtures build`)"]
    try:
        man = Manifest.read(root)
    except (OSError, ValueError) as e:
        return [f"{mpath}: unreadable ({e})"]
    if man.format != FORMAT:
        return [f"{mpath}: format {man.format!r}, expected {FORMAT!r}"]
    problems = []
    top = root.resolve()
    for rel, want in sorted(man.files.items()):
        p = root / rel
        if p.is_symlink() and not p.resolve().is_relative_to(top):
            problems.append(f"{p}: a link out of {root} (to {p.resolve()}); fixtures link only to their own files")
            continue
        if not p.is_file():
            problems.append(f"{p}: missing (listed in {MANIFEST_NAME})")
            continue
        size = p.stat().st_size
        if size != int(want["bytes"]):
            problems.append(f"{p}: {size} bytes, manifest says {want['bytes']}")
            continue
        got = sha256_file(p)
        if got != want["sha256"]:
            problems.append(f"{p}: sha256 {got[:16]}..., manifest says {str(want['sha256'])[:16]}...")
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel == MANIFEST_NAME or any(part.startswith(".") or part == "__pycache__"
                                                          for part in rel.split("/")):
            continue
        if rel not in man.files:
            problems.append(f"{p}: not listed in {MANIFEST_NAME}")
    return problems
