"""How many CPU threads torch uses: the rule, and ``--threads``.

Rule: one intra-op thread, unless the user set ``OMP_NUM_THREADS`` (then that) or passed ``--threads N``
(then N). Measured on the 2-core CI machine (``bloomery gate run qwen38-mtp --dtype bf16``, see
docs/SPEED.md): with the machine otherwise idle, 1 thread 21.6 s and torch's default (2) 19.3 s; with ONE other
busy process on the machine, 1 thread 28.7 s and 2 threads more than 16 minutes. The fixtures' matrices are
too small for a second thread to pay more than ~10%, and when a core is taken OpenMP's barrier (every
parallel op waits for all its threads) stalls each of the thousands of small ops on the descheduled thread.
A bench or a real checkpoint on a dedicated CPU may want more: ``--threads`` / ``OMP_NUM_THREADS``.
numpy's BLAS (the float64 reference) keeps its own setting (``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``).

With the engine on a card (``--device cuda...``) and neither set, torch keeps its own default (one thread per
core): the host's torch work is then the reference's weight conversions (``t.double()`` of every stored tensor,
each pass), large ops where threads pay and nothing small stalls. Measured on the H200 host (16 cores), the
real-layout Qwen3.8-27B-width gate (16 layers) with the host reference: cut at 260 s with one thread (0892af1),
134.3 s with torch's default (d0869cb; results/h200/speed/NOTE.md).
"""

from __future__ import annotations

import functools
import os
from typing import Annotated

import typer

from bloomery_gates.errors import InputError

DEFAULT = 1
Threads = Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: OMP_NUM_THREADS "
                                             "when set, else 1: see docs/SPEED.md).")]


def on_card(device: str | None) -> bool:
    """Whether ``device`` names a card (cuda, cuda:1, ..., or "auto" where CUDA is available): the engine's small
    ops are not on the host."""
    if device is None or str(device).startswith("cpu"):
        return False
    if str(device) == "auto":
        import torch

        return torch.cuda.is_available()
    return True


def thread_count(flag: int | None = None, env: dict[str, str] | None = None,
                 device: str | None = None) -> int | None:
    """The rule: ``flag`` if given, else ``OMP_NUM_THREADS`` if set, else 1 on the CPU and None (torch's own
    default) with the engine on a card."""
    if flag is not None:
        if not 1 <= flag <= max_threads():
            raise InputError("--threads", f"{flag}: expected a thread count in 1..{max_threads()} "
                                          f"(4 per CPU of this machine, at least 256)")
        return flag
    raw = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").strip()
    if not raw:
        return None if on_card(device) else DEFAULT
    try:
        n = int(raw)
    except ValueError:
        raise InputError("OMP_NUM_THREADS", f"{raw!r}: expected a positive integer") from None
    if not 1 <= n <= max_threads():
        raise InputError("OMP_NUM_THREADS", f"{raw!r}: expected a thread count in 1..{max_threads()}")
    return n


def max_threads() -> int:
    """The most threads taken: 4 per CPU, at least 256 (100000 ran the machine out of memory starting them)."""
    return max(256, 4 * (os.cpu_count() or 1))


@functools.cache
def _torch_default() -> int:
    """torch's own thread count (read once, by the first ``apply_threads``: before any change)."""
    import torch

    return torch.get_num_threads()


def apply_threads(flag: int | None = None, device: str | None = None) -> int:
    """torch.set_num_threads(thread_count(flag, device=device)) (torch's own default where that is None);
    returns the count."""
    import torch

    default = _torch_default()
    n = thread_count(flag, device=device)
    if n is None:
        n = default
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
