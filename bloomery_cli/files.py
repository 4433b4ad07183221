"""Reading the user's files with named errors: every OS or decoding failure becomes one ``InputError`` line.

- absent (or a path through a non-directory)            -> ``MissingFile``   "missing; expected the <what>"
- a directory where a file is expected                  -> ``Unreadable``    "is a directory; expected the <what>"
- permission denied, I/O error, any other OS refusal    -> ``Unreadable``    "unreadable (<OS reason>); ..."
- text that is not UTF-8                                -> ``Unreadable``    "not UTF-8 text (byte <k>, line <l>)"
- JSON that does not parse, or nests past the parser    -> ``InputError``    "cannot parse the <what>: ..."
- more than ``SMALL_FILE_MAX`` bytes (a link to an endless device, a huge file where a config belongs)
                                                        -> ``Unreadable``    "larger than <cap> bytes; ..."

Every small file (configs, tokenizers, prompts, manifests, records, shard indexes) is read through
``read_bytes``: at most ``SMALL_FILE_MAX + 1`` bytes are ever read, so memory is bounded by the cap whatever the
path points at. Nothing here creates, truncates or leaves behind a file.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError, MissingFile, Unreadable

_ABSENT = (errno.ENOENT, errno.ENOTDIR)

SMALL_FILE_MAX = 256 << 20
"""The largest small file read whole (bytes): a real tokenizer.json is ~11 MB, a config a few kB, a results record
well under 1 MB; 256 MiB leaves room for long prompt files and stops an endless device long before memory runs
out."""


def unreadable(path: str | Path, exc: OSError, what: str) -> InputError:
    """The named error for an ``OSError`` raised while opening or reading ``path``."""
    if exc.errno in _ABSENT:
        return MissingFile(path, f"missing; expected the {what}")
    if exc.errno == errno.EISDIR:
        return Unreadable(path, f"is a directory; expected the {what}")
    return Unreadable(path, f"unreadable ({exc.strerror or type(exc).__name__}); expected the {what}")


def exists(path: str | Path, what: str) -> bool:
    """Whether ``path`` exists; a stat refused by the OS (e.g. a parent without search permission) is
    ``Unreadable`` rather than a silent False (which would be reported as missing)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise unreadable(path, exc, what) from None
    return True


def check_readable(path: str | Path, what: str) -> None:
    """Open ``path`` for reading and close it at once (raises the named error if that fails)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise unreadable(path, exc, what) from None


def _read_upto(f: Any, n: int) -> bytes:
    """At most ``n`` bytes of ``f`` in chunks of 1 MiB: memory follows what the file holds, not the cap (a single
    ``read(n)`` allocates all n bytes up front)."""
    chunks, got = [], 0
    while got < n:
        chunk = f.read(min(1 << 20, n - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_bytes(path: str | Path, what: str, limit: int | None = None) -> bytes:
    """At most ``limit`` (default ``SMALL_FILE_MAX``) bytes of ``path``; more is ``Unreadable`` (read no further)."""
    cap = SMALL_FILE_MAX if limit is None else limit
    try:
        with open(path, "rb") as f:
            data = _read_upto(f, cap + 1)
    except OSError as exc:
        raise unreadable(path, exc, what) from None
    except MemoryError:
        raise Unreadable(path, f"out of memory reading it; expected the {what} (at most {cap} bytes)") from None
    if len(data) > cap:
        raise Unreadable(path, f"larger than {cap} bytes (an endless device or a file that is not the {what}?); "
                               f"expected the {what}")
    return data


def read_text(path: str | Path, what: str, limit: int | None = None) -> str:
    """The file as UTF-8 text; a byte that does not decode is ``Unreadable`` naming its offset and line."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise Unreadable(path, f"not UTF-8 text (byte {exc.start}, line {line}: {data[exc.start:exc.start + 1]!r}); "
                               f"expected the {what} as UTF-8") from None


def parse_json(text: str, where: str | Path, what: str) -> Any:
    """``json.loads`` with its failures named: bad syntax, and nesting deeper than the parser's recursion."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, f"cannot parse the {what}: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InputError(where, f"cannot parse the {what}: nested too deeply (arrays/objects inside each other "
                                "past the JSON parser's recursion limit)") from None
    except ValueError as exc:               # an integer past Python's int-string digit limit
        raise InputError(where, f"cannot parse the {what}: {exc}") from None
    except MemoryError:
        raise InputError(where, f"cannot parse the {what}: out of memory") from None


def read_json_file(path: str | Path, what: str, limit: int | None = None) -> Any:
    """``parse_json(read_text(path))``: the one bounded, named way to read a small JSON file."""
    return parse_json(read_text(path, what, limit), path, what)
