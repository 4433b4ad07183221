"""The training corpus every machine has: the Python standard library's own source.

Selection (deterministic for one Python install):
  * every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, relative POSIX paths, sorted;
  * skipped: test folders (``test/``, ``tests/``, ``idle_test/``), ``idlelib/``, ``lib2to3/``,
    ``site-packages/``, ``dist-packages/``, ``__pycache__/``, ``config-*/`` (build leftovers),
    ``encodings/`` (codec tables: hex, not code), ``pydoc_data/`` (one huge string of docs) and
    ``_sysconfigdata_*.py`` (the build's own paths, different on every machine);
  * held out (never trained on; the prompts and the held-out losses come from them): the named
    modules ``json/``, ``csv.py``, ``textwrap.py``, plus every file whose path hash
    ``int(sha256(relpath)[:8], 16) % 20 == 0``.

The corpus hash is the sha256 over ``relpath NUL sha256(content) LF`` for every selected file in
sorted order (train and held-out alike), so two machines agree on it exactly when they would train
on the same bytes. The stdlib differs a little between Python versions; the manifest records both.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = frozenset({
    "test", "tests", "idle_test", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__",
    "encodings", "pydoc_data",
})
HELD_OUT_NAMED = ("json/", "csv.py", "textwrap.py")
HELD_OUT_MOD = 20
HELD_OUT_RULE = (f"named {list(HELD_OUT_NAMED)} + every file with int(sha256(relpath)[:8], 16) % "
                 f"{HELD_OUT_MOD} == 0")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
        return True
    return parts[-1].startswith("_sysconfigdata")


def is_held_out(rel: str) -> bool:
    """rel: a POSIX path relative to the stdlib root, e.g. ``json/decoder.py``."""
    for name in HELD_OUT_NAMED:
        if (name.endswith("/") and rel.startswith(name)) or rel == name:
            return True
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % HELD_OUT_MOD == 0


def select_files(root: Path | None = None) -> list[str]:
    """Every corpus file (train and held-out), relative POSIX paths, sorted."""
    root = stdlib_root() if root is None else Path(root)
    rels = []
    for p in root.rglob("*.py"):
        if not p.is_file():
            continue
        rel = p.relative_to(root).as_posix()
        if not _skipped(rel):
            rels.append(rel)
    return sorted(rels)


@dataclass
class Corpus:
    root: Path
    train: list[str]                         # relative paths, sorted
    held_out: list[str]
    texts: dict[str, str] = field(repr=False)
    sha256: str
    n_bytes: int

    def train_texts(self) -> list[str]:
        return [self.texts[r] for r in self.train]

    def held_out_texts(self) -> list[str]:
        return [self.texts[r] for r in self.held_out]

    def describe(self) -> dict:
        return {
            "source": "the Python standard library's own *.py sources (sysconfig stdlib path)",
            "python_version": sys.version.split()[0],
            "python_implementation": sys.implementation.name,
            "skipped_dirs": sorted(SKIP_DIRS) + ["config-*"],
            "skipped_files": ["_sysconfigdata*.py"],
            "held_out_rule": HELD_OUT_RULE,
            "n_files_train": len(self.train),
            "n_files_held_out": len(self.held_out),
            "bytes": self.n_bytes,
            "sha256": self.sha256,
            "held_out_files": list(self.held_out),
        }


def load_corpus(root: Path | None = None, limit: int | None = None) -> Corpus:
    """Read and hash the corpus. ``limit`` keeps only the first ``limit`` training files (and every
    held-out file among the first files in sorted order up to the same cut), for quick test builds."""
    root = stdlib_root() if root is None else Path(root)
    rels = select_files(root)
    if limit is not None:
        train_seen, kept = 0, []
        for r in rels:
            if is_held_out(r):
                kept.append(r)
            elif train_seen < limit:
                kept.append(r)
                train_seen += 1
        rels = kept
    h = hashlib.sha256()
    texts: dict[str, str] = {}
    n_bytes = 0
    for r in rels:
        raw = (root / r).read_bytes()
        n_bytes += len(raw)
        h.update(r.encode() + b"\0" + hashlib.sha256(raw).hexdigest().encode() + b"\n")
        texts[r] = raw.decode("utf-8", errors="replace")
    train = [r for r in rels if not is_held_out(r)]
    held = [r for r in rels if is_held_out(r)]
    return Corpus(root=root, train=train, held_out=held, texts=texts, sha256=h.hexdigest(), n_bytes=n_bytes)
