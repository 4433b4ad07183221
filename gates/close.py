"""One (r) line for a tapped array: the kernel's value against the exact f64 reference, inside the
emulated band (``bloomery_cli.bands.emulated_band``: the same reference computation re-run with the
run dtype's storage rounding, ``reference.rounding``).

    reference()            -> the exact f64 value of the tap          (called once plainly)
    emulate(dtype, reference) -> the same, as an engine of ``dtype`` stores it

Both statistics, worst_rel and rel_rms, must sit inside their bands. The band's numbers and its
derivation also go to the record (``facts["bands"]``), so a record says what each check allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from bloomery_cli.bands import Band, Op, emulated_band, rel_rms, worst_rel
from bloomery_cli.contract import Report

from ..reference.rounding import emulate
from ..reference.xp import run

R = TypeVar("R")


def exact_and_emulated(dtype: str, reference: Callable[[], R]) -> tuple[R, R]:
    """(reference(), reference() under the dtype's storage rounding), each on the gate's reference device
    (``reference.xp.run``: its arrays come back as NumPy)."""
    return run(reference), emulate(dtype, lambda: run(reference))


def close(report: Report, what: str, got: np.ndarray, exact: np.ndarray, emulated: np.ndarray, dtype: str,
          ops: Sequence[Op] = (), tag: str = "(r)", ref: str = "host f64") -> Band:
    """Print the line for ``got`` vs ``exact`` with the band that ``emulated`` gives; returns the band."""
    band = emulated_band(dtype, exact, emulated, what, ops)
    worst, rms = worst_rel(got, exact), rel_rms(got, exact)
    report.reference(what, int(np.size(got)), worst, band.value, tag=tag, ref=ref, rms=rms, rms_band=band.rms)
    report.facts.setdefault("bands", []).append(
        {"what": what, "worst_rel": worst, "band": band.value, "rel_rms": rms, "rms_band": band.rms,
         "derivation": band.derivation})
    return band
