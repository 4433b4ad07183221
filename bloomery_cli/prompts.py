"""The prompts file: JSONL, one object a line, ``{"ids": [...]}`` or ``{"text": "..."}`` (``ids`` wins
when both are there). Every line is checked before any model work starts; each problem is a
``BadConfig`` naming ``<file>:<line>`` and what was expected.

- the file: present, a file, readable, UTF-8 (``bloomery_cli.files``);
- a line: JSON (nested no deeper than the parser takes), an object, with "ids" or "text";
- "ids": a non-empty list of JSON integers (no bools, floats, strings or lists; ``"123"`` is not
  ``[1, 2, 3]``), each a token id in ``[0, vocab)`` of the target;
- "text": a non-empty string, tokenized with the target's tokenizer, whose ids must also lie in
  ``[0, vocab)`` (a tokenizer bigger than the target's embedding does not fit it).

Blank lines are skipped. ``read_prompts`` returns ``Prompt`` s: lists of ids that also carry
``where`` (``file:line``), so later checks (the context length, ``bloomery_cli.preflight``) can name
the line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bloomery_gates.errors import BadConfig

from .files import parse_json, read_text

WHAT = "prompts file (JSONL with a 'text' or 'ids' field per line)"


class Prompt(list):
    """A prompt's token ids (a plain ``list[int]`` to every consumer) plus ``where``: ``file:line``."""

    where: str

    def __init__(self, ids: list[int], where: str):
        super().__init__(ids)
        self.where = where


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def check_ids(ids: Any, where: str, vocab: int | None, field: str = "ids") -> list[int]:
    """``ids`` as a list of token ids; anything else is a ``BadConfig`` naming ``where`` and the entry."""
    if not isinstance(ids, list):
        raise BadConfig(where, f"{field} is {_kind(ids)} ({ids!r:.40}); expected a list of integer token ids")
    if not ids:
        raise BadConfig(where, f"{field} is empty; expected at least one token id")
    for j, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int):
            raise BadConfig(where, f"{field}[{j}] is {_kind(x)} ({x!r:.40}); expected an integer token id")
        if x < 0 or (vocab is not None and x >= vocab):
            span = f"[0, {vocab}) (the target's vocab size)" if vocab is not None else ">= 0"
            raise BadConfig(where, f"{field}[{j}] = {x}; expected a token id in {span}")
    return ids


def read_prompts(path: Path, tokenizer: Callable[[], Any], limit: int | None,
                 vocab: int | None = None) -> list[Prompt]:
    """The prompts in ``path`` (the first ``limit`` when set); ``tokenizer()`` is called on the first "text"
    line. ``vocab`` (the target's vocab size) bounds every id; None checks only that ids are >= 0."""
    text = read_text(path, WHAT)
    prompts: list[Prompt] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        obj = parse_json(line, where, "line as JSON")
        if not isinstance(obj, dict):
            raise BadConfig(where, f"{_kind(obj)}; expected a JSON object with a 'text' or 'ids' field")
        if "ids" in obj:
            ids = check_ids(obj["ids"], where, vocab)
        elif "text" in obj:
            if not isinstance(obj["text"], str):
                raise BadConfig(where, f"'text' is {_kind(obj['text'])}; expected a string")
            if not obj["text"]:
                raise BadConfig(where, "'text' is empty; expected a non-empty prompt")
            ids = check_ids(list(tokenizer().encode(obj["text"]).ids), where, vocab, "the tokenized text")
        else:
            raise BadConfig(where, f"keys {sorted(obj)}; expected a 'text' or 'ids' field")
        prompts.append(Prompt(ids, where))
    if not prompts:
        raise BadConfig(path, "no prompts in file; expected one JSON object per line")
    return prompts[:limit] if limit else prompts
