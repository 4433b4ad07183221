"""A MoE layer's (r) line with the routing the kernel chose (CONTRACT.md "Routing flips on the layer lines"), as
``targets.greedy_flips`` excuses an argmax flip.

For layer l with the kernel's chosen experts K [T, k] (``Pass.routing[l].ids``), on the kernel's input to layer l:

    exact run    the f64 reference layer, recording its router's choice scores c [T, E] and own ids R [T, k]
                 (``reference.ops.moe.pinned(None)``)
    emulated run the same under the dtype's storage rounding, ROUTED WITH K (``pinned(K)``): its band measures
                 rounding, not a flip of its own; its scores c_emu [T, E] give the router's band
    band_c       ``bands.emulated_band`` of c_emu against c (the layer's ops for e_acc)
    row t        differs when set(K_t) != set(R_t); excused when ``bands.routing_flip_excused``: the experts only the
                 kernel chose score on c within 2 * band_c * max|c_t| of those only the reference chose
    use          K_t on excused rows, R_t elsewhere; where use != R the exact run is repeated routed with ``use``
                 (``pinned(use)``), so the layer line compares like with like on excused rows and an unexcused row
                 keeps the reference's own experts (its jump stays on the layer line)

The routing line ``(r) target routing of layer l [T x k] vs host f64 choice: T checked, d differ, e excused ...``
fails unless d == e. A layer whose reference ranks nothing (a hash layer: the table chose) gets no routing line and
its layer line runs as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_cli.bands import Band, Op, emulated_band, routing_flip_excused
from bloomery_cli.contract import Report

from ..reference.ops.moe import pinned
from ..reference.rounding import emulate
from ..reference.xp import run

Layer = Callable[[], np.ndarray]


@dataclass
class Routed:
    """One run of a layer under a pin: its output, the router's choice scores [T, E] and own ids [T, k] (None when
    no ranking router ran)."""

    out: np.ndarray
    choice: np.ndarray | None
    own: np.ndarray | None


def routed_run(layer: Layer, ids: np.ndarray | None) -> Routed:
    """layer() inside ``pinned(ids)`` (a fresh pin per run: ``reference.xp.run`` may run it twice to compare)."""
    def compute() -> Routed:
        with pinned(ids) as pin:
            out = layer()
        return Routed(out, pin.choice, pin.own)
    return run(compute)


@dataclass
class Flips:
    """Rows whose chosen set differs, the excused ones among them, and the ids the exact run routes with."""

    differ: int
    excused: int
    use: np.ndarray


def routing_flips(choice: np.ndarray, own: np.ndarray, got: np.ndarray, band: Band) -> Flips:
    """choice c [T, E], own R [T, k], got K [T, k] -> Flips (module docstring)."""
    own, got = np.asarray(own, dtype=np.int64), np.asarray(got, dtype=np.int64)
    if own.shape != got.shape:
        raise ValueError(f"kernel routing {got.shape} against the reference's {own.shape}")
    use, differ, excused = own.copy(), 0, 0
    for t in range(own.shape[0]):
        if set(own[t].tolist()) == set(got[t].tolist()) and len(set(got[t].tolist())) == got.shape[1]:
            continue
        differ += 1
        if routing_flip_excused(choice[t], own[t], got[t], band):
            excused += 1
            use[t] = got[t]
    return Flips(differ, excused, use)


def routed_layer(report: Report, l: int, layer: Layer, got_ids: np.ndarray, dtype: str,
                 ops: Sequence[Op]) -> tuple[np.ndarray, np.ndarray]:
    """(exact, emulated) layer outputs for layer l's line, routed as the module docstring says; prints the routing
    line (when the reference ranked experts in this layer)."""
    exact = routed_run(layer, None)
    if exact.own is None:
        return exact.out, emulate(dtype, lambda: routed_run(layer, None)).out
    got = np.asarray(got_ids, dtype=np.int64)[: exact.own.shape[0]]
    emu = emulate(dtype, lambda: routed_run(layer, got))
    t, k = exact.own.shape
    what = f"target routing of layer {l} [{t}x{k}]"
    band = emulated_band(dtype, exact.choice, emu.choice, f"{what} choice scores", ops)
    flips = routing_flips(exact.choice, exact.own, got, band)
    if not np.array_equal(flips.use, exact.own):
        exact = routed_run(layer, flips.use)
    report.check(f"(r) {what} vs host f64 choice: {t} checked, {flips.differ} differ, {flips.excused} excused "
                 f"(inside 2 x band {band.value:.3g} x max|c| of the f64 choice scores)",
                 flips.differ == flips.excused)
    report.facts.setdefault("routing_flips", []).append(
        {"what": f"{what} choice scores", "band": band.value, "differ": flips.differ, "excused": flips.excused,
         "derivation": band.derivation})
    return exact.out, emu.out
