"""Named errors. Every user error is a `InputError`: the CLI prints its one line and exits 2."""

from __future__ import annotations

from pathlib import Path

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_INPUT = 2


class InputError(Exception):
    """The run could not start: a bad or missing file, key or tensor, a mismatched pair, a bad flag.

    The message names the thing (file, key, tensor) and what was expected, on one line.
    """

    def __init__(self, what: str | Path, problem: str):
        self.what = str(what)
        self.problem = problem
        super().__init__(f"{what}: {problem}")


class MissingFile(InputError):
    pass


class Unreadable(InputError):
    """A file that is there but cannot be read: a directory where a file is expected, permission denied,
    not UTF-8 text, or JSON nested past what the parser takes. The message carries the OS reason."""


class BadConfig(InputError):
    """A config key is missing, of the wrong type, or out of range."""


class BadTensor(InputError):
    """A tensor is missing, of the wrong shape, or of an unsupported dtype."""


class Mismatch(InputError):
    """Target and draft do not fit together (hidden size, vocab, mask id, layer ids)."""


class Refused(InputError):
    """A file we will not read: pickles (*.bin, *.pt, *.pth, *.ckpt), a GGUF of another arch."""
