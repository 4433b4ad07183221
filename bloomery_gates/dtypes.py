"""The dtypes a run may be asked for, one table: the name the CLI and the records spell, the torch dtype the
engine stores in, the bytes an element takes (plan, bench, results) and the unit roundoff u = 2^-(p) of its p-bit
significand (the derived bands, ``bloomery_cli.bands``). f64 is the reference's and the oracles', never a run's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import InputError


@dataclass(frozen=True)
class DType:
    name: str               # as the CLI, the records and the results tables spell it
    torch: torch.dtype
    itemsize: int           # bytes per element
    unit_roundoff: float    # u: round-to-nearest relative error bound of one stored value


F64 = DType("f64", torch.float64, 8, 2.0**-53)
RUN: dict[str, DType] = {d.name: d for d in (DType("f32", torch.float32, 4, 2.0**-24),
                                             DType("bf16", torch.bfloat16, 2, 2.0**-8),
                                             DType("f16", torch.float16, 2, 2.0**-11))}
ALL: dict[str, DType] = {**RUN, F64.name: F64}
TORCH: dict[str, torch.dtype] = {k: d.torch for k, d in RUN.items()}      # name -> torch dtype, the run dtypes


def run_dtype(name: str, flag: str = "--dtype") -> DType:
    """The run dtype called ``name``, or exit 2 naming the flag and the choices."""
    if name not in RUN:
        raise InputError(flag, f"{name!r}: expected one of {', '.join(RUN)}")
    return RUN[name]
