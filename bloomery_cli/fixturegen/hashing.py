"""A file's sha256, read in 1 MiB chunks: what the manifest lists (``manifest``) and what tells equal copies apart
(``links``). Apart from both so that each can import it without the other."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
