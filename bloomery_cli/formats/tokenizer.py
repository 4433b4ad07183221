"""The target's tokenizer: a HF ``tokenizer.json`` (tokenizers library), never the GGUF vocab.

Expected: ``<dir>/tokenizer.json`` for an HF directory, or ``tokenizer.json`` in the folder of a
``*.gguf`` file (``model.gguf`` -> ``model.tokenizer.json`` is tried first, then ``tokenizer.json``).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from bloomery_cli.files import exists, read_text
from bloomery_gates.errors import InputError, MissingFile


def tokenizer_path(path: str | Path) -> Path:
    """Where the tokenizer of the checkpoint at ``path`` must be; raises ``MissingFile`` if absent."""
    p = Path(path)
    if p.is_dir():
        candidates = [p / "tokenizer.json"]
    else:
        candidates = [p.with_name(f"{p.stem}.tokenizer.json"), p.with_name("tokenizer.json")]
    for c in candidates:
        if exists(c, "HF tokenizer.json"):
            return c
    raise MissingFile(candidates[-1], "missing; expected the HF tokenizer.json "
                                      + ("in the model directory" if p.is_dir() else "beside the GGUF file"))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """``tokenizers.Tokenizer`` from the ``tokenizer.json`` of the checkpoint at ``path`` (dir or gguf)."""
    tj = tokenizer_path(path)
    text = read_text(tj, "HF tokenizer.json")       # a directory, unreadable or non-UTF-8 file: named here
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise InputError(tj, f"cannot parse the tokenizer: {exc}") from None
