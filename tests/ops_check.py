"""What the op tests of issue 25 share (tests/test_ops_*.py): the kernel's inputs in the run dtype and the same
values in float64 for the reference, the gates' (r) line for one tap (``close`` with the emulated band), a
reference op run on the strict fake device, and the FAIL-first verdict."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from fake_xp import fake_device

from bloomery_cli.bands import Op
from bloomery_cli.contract import Report
from bloomery_gates.gates.close import close, exact_and_emulated
from bloomery_gates.reference import xp as rxp
from bloomery_gates.reference.xp import here

TORCH = {"bf16": torch.bfloat16, "f32": torch.float32}


def stored(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, np.ndarray]:
    """(x in the run dtype for the kernel, the same values in float64 for the reference)."""
    t = x.to(TORCH[dtype])
    return t, t.double().numpy()


def report(name: str = "op") -> Report:
    return Report(name, emit=lambda _line: None)


def check(rep: Report, what: str, got: torch.Tensor, reference: Callable[[], Any], dtype: str,
          ops: Sequence[Op], pick: Callable[[Any], np.ndarray] = lambda r: r) -> None:
    """One (r) line: the kernel's ``got`` against pick(reference()), banded by the same reference emulated in dtype."""
    exact, emulated = exact_and_emulated(dtype, reference)
    close(rep, what, got.detach().double().numpy(), pick(exact), pick(emulated), dtype, ops)


def failed(rep: Report, head: str) -> bool:
    """The report ends in exit 1 and the line that starts with ``head`` says FAIL."""
    return rep.finish() == 1 and any(line.startswith(head) and line.endswith(" FAIL") for line in rep.lines)


def fails_only(rep: Report, head: str) -> bool:
    """As ``failed``, and every other check line passed (the plant is caught by the line that guards it)."""
    bad = [line for line in rep.lines if line.endswith(" FAIL")]
    return failed(rep, head) and all(line.startswith(head) for line in bad)


def on_fake_device(compute: Callable[..., Any], *arrays: np.ndarray) -> Any:
    """compute(*arrays) with every array moved onto the strict fake device (NumPy arithmetic that refuses a host
    array, as CuPy does) and the result brought back: a reference op that builds a host array mid-run raises."""
    with rxp.on(fake_device()):
        return rxp.to_host(compute(*(here(a) for a in arrays)))
