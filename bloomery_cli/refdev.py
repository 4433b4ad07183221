"""Where a gate's float64 reference runs (``--reference-device cpu|cuda[:i]``, ``--reference-compare``).

The reference is one body of array code (``reference.xp``): NumPy on the host, CuPy on a card. This module turns
the flags into a ``reference.xp.Selection`` before any work (a bad spelling, no CuPy, no such card: exit 2), and
says afterwards what the reference cost and, with ``--reference-compare``, how far the card's reference sits from
the host's over every array the checks read from it:

    worst rel = max over the exact runs' arrays of max over rows of max|dev - host| / max|host|     <= 1e-12

(float64 on both sides: only the order of sums and the libm differ, so their distance is a few ulps times the
depth; a dropped term or a wrong op is orders above it). Emulated runs (storage rounding) are not compared: a
last-ulp difference may flip one bf16 rounding there, which is no defect; the line counts them.
"""

from __future__ import annotations

from typing import Any

from bloomery_gates.errors import InputError

from .contract import Report

COMPARE_BOUND = 1e-12


def reference_selection(device: str, compare: bool) -> Any:
    """The Selection for ``--reference-device device [--reference-compare]``; InputError (exit 2) when it cannot
    run here. CuPy is imported only for a cuda device."""
    from bloomery_gates.reference import xp

    if device == "cpu":
        if compare:
            raise InputError("--reference-compare", "compares a GPU reference with the host one: it needs "
                                                    "--reference-device cuda or cuda:<i>")
        return xp.Selection(xp.HOST)
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise InputError("--reference-device", f"{device!r}: expected cpu, cuda or cuda:<i>")
    try:
        return xp.Selection(xp.cuda(device), compare=compare)
    except ValueError as e:
        raise InputError("--reference-device", f"{device}: {e}") from None


def peak_reference_bytes(selection: Any) -> int | None:
    """The reference device's memory high-water mark (CuPy's pool: what it holds, cached blocks included);
    None on the host (its use is in peak_host_rss)."""
    return None if selection.device.is_host else selection.device.peak_bytes()


def finish(report: Report, selection: Any) -> None:
    """The reference's facts into the record, and with --reference-compare its (r) line (a check)."""
    dev = selection.device
    report.facts["reference"] = {"device": dev.name, "compare": selection.compare,
                                 "wall_s": round(selection.seconds, 3),
                                 "peak_device_bytes": peak_reference_bytes(selection)}
    if selection.compare:
        c = selection.compared
        report.facts["reference"].update(host_wall_s=round(selection.host_seconds, 3), compared_tensors=c.tensors,
                                         compared_values=c.values, worst_rel=c.worst, worst_at=c.worst_at,
                                         int_differ=c.int_differ, emulated_not_compared=c.skipped_emulated,
                                         bound=COMPARE_BOUND)
        report.reference_compare(dev.name, c.tensors, c.values, c.worst, COMPARE_BOUND, c.int_differ,
                                 c.skipped_emulated, c.worst_at)
