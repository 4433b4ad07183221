"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels (issue 27): on by
default in a graph's warm-up and capture, ``BLOOMERY_PDL=off`` turns it off.

A decode step is ~330 kernels in a row; each boundary drains one kernel and fills the next, and the latency-bound
ones (attention, rope, rms, silu: ~12 us a layer at 8B) leave HBM idle. With PDL a kernel may be launched while
the one before it still runs: its programs start, do what does not depend on the kernel before (here: ask L2 for
their slab of the weight, which no kernel writes), then ``griddepcontrol.wait`` until the kernel before has
finished and its writes are visible. Every kernel launched so waits before it reads or writes an activation, and
before it ends, so "finished" stays transitive along the chain and the step's numbers are unchanged (the
projections' sums keep their order). A kernel not launched with PDL (cuBLAS, torch ops) runs after the one
before it has finished, as without PDL.

    BLOOMERY_PDL = unset or "" (DEFAULT: "on,early,l2=4") | "off" | "on" | "on,early" | "on,l2=MB" | "on,early,l2=MB"
      off    every launch as without PDL
      on     the Triton decode kernels launched with PDL; each waits first, then lets its successor launch
      early  each lets its successor launch first, then waits (the chain of launches runs ahead)
      l2=MB  the projection's programs prefetch the head of each row of their weight slab into L2 before the
             wait (``cp.async.bulk.prefetch.L2``, one per row), MB MiB a projection in all ("l2": the whole
             slab; measured at 500f780: 0.8 ms a step slower at 8B, the 100 MB down_proj evicting its own
             prefetched lines before they are read)

The default is the setting measured best (results/h200/speed/ec34bc2-pdl: the 8B chain 0.790 -> 0.825 of the read
roofline, the 27B MTP drafted run +12%), made the default once every fast-engine gate had passed under it on the
H200 (results/h200/fast/). ``mode()`` is read at each launch, so a graph captured under one setting keeps it. Only
the launches of a ``GraphSet``'s warm-up and capture take PDL (``graphs.graphing``; the warm-up compiles the variant
the capture launches): launched one by one from the host (a prompt, an eager draft), the 27B MTP bench ran 9% slower
with it (results/h200/speed/c5d9074-pdl), its graphed chain 2% faster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bloomery_gates.errors import InputError

from .. import graphs

OFF, WAIT_FIRST, LAUNCH_FIRST = 0, 1, 2
VAR = "BLOOMERY_PDL"
DEFAULT = "on,early,l2=4"


@dataclass(frozen=True)
class Setting:
    """BLOOMERY_PDL parsed: on, early, and the L2 prefetch budget of a projection in bytes (None: none; 0: all)."""
    on: bool = False
    early: bool = False
    l2_bytes: int | None = None

    def __str__(self) -> str:
        """The setting as BLOOMERY_PDL spells it ("off", "on,early,l2=4")."""
        if not self.on:
            return "off"
        l2 = "" if self.l2_bytes is None else ",l2" if self.l2_bytes == 0 else f",l2={self.l2_bytes / (1 << 20):g}"
        return "on" + (",early" if self.early else "") + l2


def setting(text: str | None = None) -> Setting:
    """``text`` (default: the environment's BLOOMERY_PDL) parsed, unset or empty meaning DEFAULT; a flag it does not
    know is an InputError."""
    text = (os.environ.get(VAR, "") if text is None else text).strip() or DEFAULT
    if text == "off":
        return Setting()
    on = early = False
    l2: int | None = None
    for flag in (f.strip() for f in text.split(",") if f.strip()):
        name, _, value = flag.partition("=")
        if flag in ("on", "early"):
            on, early = on or flag == "on", early or flag == "early"
        elif name == "l2":
            try:
                l2 = int(float(value) * (1 << 20)) if value else 0
            except ValueError:
                l2 = -1
            if l2 < 0 or (value and l2 == 0):
                raise InputError(VAR, f"{flag!r}: l2 takes a positive size in MiB (l2=4), or no size (the whole slab)")
        else:
            raise InputError(VAR, f"{flag!r}: expected off, or a comma list of on, early, l2[=MiB] "
                                  "(e.g. on,early,l2=4)")
    if (early or l2 is not None) and not on:
        raise InputError(VAR, f"{text!r}: early and l2 need on (e.g. on,early,l2=4)")
    return Setting(on, early, l2)


def mode(device: torch.device) -> tuple[int, int | None]:
    """(the kernels' PDL constexpr, the bytes a projection prefetches into L2: None none, 0 all of its weight)
    for a launch on ``device`` now."""
    if device.type != "cuda" or not graphs.graphing():       # every launch asks: the cheap answers first
        return OFF, None
    s = setting()
    if not s.on or not hopper(device):
        return OFF, None
    return (LAUNCH_FIRST if s.early else WAIT_FIRST), s.l2_bytes


def hopper(device: torch.device) -> bool:
    """Compute capability 9 (Hopper) or later: what PDL and the projection's TMA loads (``gemv.proj``) need."""
    return torch.cuda.get_device_capability(device)[0] >= 9


def describe(device: torch.device) -> str | None:
    """What the graphed passes on ``device`` take, for a record: the setting (e.g. "on,early,l2=4"), "off", or
    "off (compute capability < 9)"; None off CUDA."""
    if device.type != "cuda":
        return None
    s = setting()
    return str(s) if not s.on or hopper(device) else "off (compute capability < 9)"


def in_effect(device: torch.device) -> bool:
    """Whether the graphed passes on ``device`` take PDL (``describe`` names the setting)."""
    return device.type == "cuda" and setting().on and hopper(device)


def row_bytes(budget: int | None, rows: int, row_span: int) -> int:
    """Bytes prefetched from the head of each of ``rows`` rows of ``row_span`` bytes for an L2 budget (``mode``):
    whole 128-byte lines, at most the span; 0: none."""
    if budget is None:
        return 0
    per = row_span if budget == 0 else min(row_span, budget // rows // 128 * 128)
    return per if per % 16 == 0 else 0


def launch_opts(pdl: int) -> dict:
    """The launch keyword of a kernel compiled with ``PDL=pdl``."""
    return {"launch_pdl": True} if pdl != OFF else {}
