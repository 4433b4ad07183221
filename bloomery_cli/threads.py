"""How many CPU threads torch uses: the rule, and ``--threads``.

Rule: one intra-op thread, unless the user set ``OMP_NUM_THREADS`` (then that) or passed ``--threads N``
(then N). Measured on the 2-core CI machine (``bloomery gate run qwen38-mtp --dtype bf16``, see
docs/SPEED.md): with the machine otherwise idle, 1 thread 21.6 s and torch's default (2) 19.3 s; with ONE other
busy process on the machine, 1 thread 28.7 s and 2 threads more than 16 minutes. The fixtures' matrices are
too small for a second thread to pay more than ~10%, and when a core is taken OpenMP's barrier (every
parallel op waits for all its threads) stalls each of the thousands of small ops on the descheduled thread.
A bench or a real checkpoint on a dedicated CPU may want more: ``--threads`` / ``OMP_NUM_THREADS``.
numpy's BLAS (the float64 reference) keeps its own setting (``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from .errors import InputError

DEFAULT = 1
Threads = Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: OMP_NUM_THREADS "
                                             "when set, else 1: see docs/SPEED.md).")]


def thread_count(flag: int | None = None, env: dict[str, str] | None = None) -> int:
    """The rule: ``flag`` if given, else ``OMP_NUM_THREADS`` if set, else 1."""
    if flag is not None:
        if flag < 1:
            raise InputError("--threads", f"{flag}: expected a thread count >= 1")
        return flag
    raw = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").strip()
    if not raw:
        return DEFAULT
    try:
        n = int(raw)
    except ValueError:
        raise InputError("OMP_NUM_THREADS", f"{raw!r}: expected a positive integer") from None
    if n < 1:
        raise InputError("OMP_NUM_THREADS", f"{raw!r}: expected a positive integer")
    return n


def apply_threads(flag: int | None = None, device: str | None = None) -> int:
    """torch.set_num_threads(thread_count(flag)); returns the count (``device`` is accepted for the callers'
    symmetry: the host side of a CUDA run follows the same rule)."""
    import torch

    n = thread_count(flag)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
