"""Files of equal content in fixtures/ stored once: every other copy is a relative symlink to the first.

Layout copies share their bytes: the speculators-layout drafters carry the z-lab drafters' weights, the yarn
target the plain target's, every target folder the same tokenizer. Git keeps one blob for them, but a checkout
wrote each copy out (11 MB of the folder's 43 MB). ``link_duplicates(root, files)`` turns each later copy (``_first``
order) of a manifest sha256 into a relative link to the first real file of that content; the loaders read
through it, ``manifest.verify`` hashes through it and refuses a link that leaves the folder.

Before an entry is replaced (``install``, ``install_model``), ``materialize_links_into(root, name)`` gives every
link that points into it a real copy again, so a rebuilt drafter never changes its layout copies under them.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path

from .hashing import sha256_file


def _relink(path: Path, target: str) -> None:
    tmp = path.with_name(path.name + ".link-tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _first(rel: str) -> tuple[int, int, str]:
    """Which copy keeps the bytes: the shallowest, then the shortest path (the shared top-level tokenizer, the
    z-lab-layout drafter before its speculators-layout copy, the plain target before its yarn twin)."""
    return rel.count("/"), len(rel), rel


def link_duplicates(root: Path, files: dict[str, dict]) -> int:
    """Link every later copy of a listed content to its first real file; returns the bytes no longer written
    twice. A file whose bytes differ from its manifest entry is left alone (``verify`` reports it)."""
    root = Path(root)
    groups: dict[str, list[str]] = defaultdict(list)
    for rel, entry in sorted(files.items(), key=lambda kv: _first(kv[0])):
        groups[entry["sha256"]].append(rel)
    saved = 0
    for sha, rels in groups.items():
        if len(rels) < 2:
            continue
        real = [r for r in rels if (root / r).is_file() and not (root / r).is_symlink()
                and sha256_file(root / r) == sha]
        if not real:
            continue
        keep = root / real[0]
        for rel in rels:
            p = root / rel
            if p == keep or not p.exists():
                continue
            target = os.path.relpath(keep, p.parent)
            if p.is_symlink() and os.readlink(p) == target:
                continue
            if sha256_file(p) != sha:
                continue
            if not p.is_symlink():
                saved += p.stat().st_size
            _relink(p, target)
    return saved


def materialize_links_into(root: Path, name: str) -> list[Path]:
    """Every symlink under ``root`` (outside ``root/name``) that resolves into ``root/name`` becomes a real copy
    of its content; returns those paths."""
    root = Path(root).resolve()
    inside = root / name
    done = []
    for p in sorted(root.rglob("*")):
        if not p.is_symlink() or p.is_relative_to(inside):
            continue
        dest = p.resolve()
        if dest.is_file() and (dest == inside or dest.is_relative_to(inside)):
            tmp = p.with_name(p.name + ".copy-tmp")
            shutil.copyfile(dest, tmp)
            os.replace(tmp, p)
            done.append(p)
    return done


def real_bytes(root: Path) -> int:
    """What a checkout of ``root`` holds on disk: regular files' sizes, links counted as links (not followed)."""
    return sum(p.lstat().st_size for p in Path(root).rglob("*") if p.is_symlink() or p.is_file())
