"""A layer's (r) line with the discrete choices the kernel made (CONTRACT.md "Routing flips on the layer lines"), as
``targets.greedy_flips`` excuses an argmax flip: a MoE layer's router, and named choices such as deepseek41's stream
top-k (``Pass.choices``; ``reference.ops.moe.pinned`` keys).

For layer l, the kernel's picks K_key [T, k] of every choice the reference layer makes (its router: key ``ROUTER``,
``Pass.routing[l].ids``; a named one: ``Pass.choices[key]``), on the kernel's input to layer l:

    exact run    the f64 reference layer, recording each choice's scores c [T, n] and own ids R [T, k]
    emulated run the same under the dtype's storage rounding, CONTINUING WITH K for every key: its band measures
                 rounding, not a flip of its own; its scores c_emu give the choice's band
    band_c       ``bands.emulated_band`` of c_emu against c (entries not visible, -inf, left out; the layer's ops)
    row t        differs when set(K_t) != set(R_t); excused when ``bands.routing_flip_excused``: the entries only the
                 kernel chose score on c within 2 * band_c * max|c_t| of those only the reference chose
    use          K_t on excused rows, R_t elsewhere; where use != R the exact run is repeated continuing with ``use``
                 (``pinned``), so the layer line compares like with like on excused rows and an unexcused row keeps
                 the reference's own choice (its jump stays on the layer line). Choices are taken in the order the
                 layer makes them (a stream top-k before the router): a later choice's exact scores come from a run
                 that continued with the earlier ones' ``use``, as its emulated scores did with K

One line per choice, at the layer that makes it: ``(r) target <name> [T x k] vs host f64 choice: T checked, d differ,
e excused ...``, failing unless d == e (name: ``routing of layer l``, or the key). A later layer that re-makes an
earlier layer's choice (deepseek41: a stream reader re-primes its sources from their input taps) reuses that layer's
``use``. A choice the kernel does not report (a hash layer's table) runs unpinned and gets no line.

The state after the loop (``state_choices``; ``bloomery_cli.state_check``): the fresh run over the whole sequence
T = prompt + emitted + proposal follows the same rule with a ``layered`` pin, each choice keyed (key, layer), K the
ids the kernel's cache holds at each position (the last pass that ran the position), the band of layer l's scores
from ``ops_of(l)``: the emulated run continues with K everywhere, the exact run with ``use``, layer by layer.
One line per choice: ``(r) state after <W> windows: target <name> [T x k] vs host f64 choice: ...``. The prompt's
end-to-end logits line (``targets.check_target``) runs the same over the prompt with the prefill's choices (lines
``(r) end to end: target <name> ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bloomery_cli.bands import Band, Op, emulated_band, routing_flip_excused
from bloomery_cli.contract import Report

from ..reference.ops.moe import ROUTER, pinned
from ..reference.rounding import emulate
from ..reference.xp import run

Layer = Callable[[], np.ndarray]


@dataclass
class Chosen:
    """One run of a layer under pins: its output and each choice's (scores [T, n], own ids [T, k])."""

    out: np.ndarray
    seen: dict[str, tuple[np.ndarray, np.ndarray]]
    rules: dict = field(default_factory=dict)       # key -> the choice's own rule (``moe.chosen``), where it has one


def pinned_run(layer: Layer, pins: Mapping[str, np.ndarray]) -> Chosen:
    """layer() inside ``pinned(pins)`` (a fresh pin per run: ``reference.xp.run`` may run it twice to compare)."""
    def compute() -> Chosen:
        with pinned(dict(pins)) as pin:
            out = layer()
        return Chosen(out, dict(pin.seen), dict(pin.rules))
    return run(compute)


@dataclass
class Flips:
    """Rows whose chosen set differs, the excused ones among them, and the ids the exact run continues with."""

    differ: int
    excused: int
    use: np.ndarray


def routing_flips(scores: np.ndarray, own: np.ndarray, got: np.ndarray, band: Band, rule=None) -> Flips:
    """scores c [T, n], own R [T, k], got K [T, k] -> Flips (module docstring); -1 (an empty slot) is no entry;
    ``rule`` the choice's own (``bands.routing_flip_excused``)."""
    own, got = np.asarray(own, dtype=np.int64), np.asarray(got, dtype=np.int64)
    if own.shape != got.shape:
        raise ValueError(f"kernel choice {got.shape} against the reference's {own.shape}")
    use, differ, excused = own.copy(), 0, 0
    for t in range(own.shape[0]):
        g = got[t][got[t] >= 0].tolist()
        if set(own[t][own[t] >= 0].tolist()) == set(g) and len(set(g)) == len(g):
            continue
        differ += 1
        if routing_flip_excused(scores[t], own[t], got[t], band, rule):
            excused += 1
            use[t] = got[t]
    return Flips(differ, excused, use)


def visible(c: np.ndarray, like: np.ndarray) -> np.ndarray:
    """c with the entries where ``like`` (the exact scores) is not finite set to 0 (not visible: no error there)."""
    return np.where(np.isfinite(like), c, 0.0)


def kernel_picks(l: int, routing: Mapping, choices: Mapping) -> dict[str, np.ndarray | None]:
    """The kernel's picks as ``pinned`` keys: layer l's router (``ROUTER``) and every named choice (None: the kernel
    made none)."""
    picks = {key: (None if v is None else v.detach().cpu().numpy()) for key, v in choices.items()}
    if l in routing:
        picks[ROUTER] = routing[l].ids.detach().cpu().numpy()
    return picks


def chosen_layer(report: Report, l: int, layer: Layer, picks: Mapping[str, np.ndarray], decided: dict,
                 dtype: str, ops: Sequence[Op]) -> tuple[np.ndarray, np.ndarray]:
    """(exact, emulated) layer outputs for layer l's line (module docstring); prints a line per choice first made
    here and records its ``use`` in ``decided`` (name -> ids) for the layers after it."""
    def name_of(key: str) -> str:
        return f"routing of layer {l}" if key == ROUTER else key

    first = pinned_run(layer, {})
    got = kernel_ids(report, first, lambda key: picks.get(key), name_of, "target ", decided, only=picks)
    return continue_with(report, lambda pins: pinned_run(layer, pins), first, got, name_of, lambda key: ops, dtype,
                         "target ", decided)


def kernel_ids(report: Report, first: Chosen, lookup: Callable[[Any], Any], name_of: Callable[[Any], str],
               label: str, decided: dict, only: Mapping | None = None) -> dict:
    """key -> the kernel's ids [T, k] for every choice the reference made in ``first`` (``only``: of those, the keys
    the kernel reports at all), in the order it made them; a choice the kernel made none of (None) fails closed
    with a line of its own (its reference ids then stand in ``decided``). ``label`` prefixes each line's name
    ("target ", "state after W windows: target ", "mtp: draft ")."""
    got: dict = {}
    for key in first.seen:
        if only is not None and key not in only:
            continue
        ids, (t, k) = lookup(key), first.seen[key][1].shape
        if ids is not None:
            got[key] = np.asarray(ids, dtype=np.int64)[:t]
        elif name_of(key) not in decided:
            report.check(f"(r) {label}{name_of(key)} [{t}x{k}] vs host f64 choice: the kernel made no choice", False)
            decided[name_of(key)] = first.seen[key][1]
    return got


def continue_with(report: Report, runner: Callable[[Mapping], Chosen], first: Chosen, got: dict,
                  name_of: Callable[[Any], str], ops_of: Callable[[Any], Sequence[Op]], dtype: str, label: str,
                  decided: dict) -> tuple[Any, Any]:
    """The emulated run continuing with the kernel's ids ``got``; the exact run continuing with each choice's
    ``use`` in the order they are made (a later choice's exact scores from a run with the earlier ``use``), its
    line printed where ``decided`` has no ``use`` for it yet. -> (exact output, emulated output)."""
    emu = emulate(dtype, lambda: runner(got))
    exact, use, stale = first, {}, False                       # stale: exact ran with other upstream choices
    for key in got:
        if stale:
            exact, stale = runner(use), False
        name, (scores, own) = name_of(key), exact.seen[key]
        if name not in decided:
            decided[name] = choice_line(report, name, scores, own, got[key], emu.seen[key][0], dtype,
                                        ops_of(key), label, exact.rules.get(key))
        use[key] = decided[name]
        stale = not np.array_equal(use[key], own)
    if stale:
        exact = runner(use)
    return exact.out, emu.out


def choice_line(report: Report, name: str, scores: np.ndarray, own: np.ndarray, got: np.ndarray,
                emulated: np.ndarray, dtype: str, ops: Sequence[Op], label: str = "target ", rule=None) -> np.ndarray:
    """The line of one choice (exact scores and own ids, the kernel's ids, the emulated scores) -> its ``use``;
    ``label`` prefixes the checked thing ("target ", "state after W windows: target ")."""
    t, k = own.shape
    what = f"{label}{name} [{t}x{k}]"
    band = emulated_band(dtype, visible(scores, scores), visible(emulated, scores), f"{what} scores", ops)
    flips = routing_flips(scores, own, got, band, rule)
    report.check(f"(r) {what} vs host f64 choice: {t} checked, {flips.differ} differ, {flips.excused} excused "
                 f"(inside 2 x band {band.value:.3g} x max|c| of the f64 scores)", flips.differ == flips.excused)
    report.facts.setdefault("choice_flips", []).append(
        {"what": f"{what} scores", "band": band.value, "differ": flips.differ, "excused": flips.excused,
         "derivation": band.derivation})
    return flips.use


def state_choices(report: Report, where: str, forward: Callable[[], Any], routing: Mapping[int, np.ndarray | None],
                  choices: Mapping[str, np.ndarray | None], dtype: str,
                  ops_of: Callable[[int], Sequence[Op]], who: str = "target", unit: str = "layer"
                  ) -> tuple[Any, Any]:
    """The fresh runs of the state check with the kernel's choices (module docstring): ``forward()`` the family's
    reference over the sequence (its RefOut); ``routing`` layer -> the ids [T, k] the kernel's cache holds per
    position (None: a position the kernel's passes did not report), ``choices`` name -> the same for a named
    choice; ``where`` prefixes each line's checked thing ("state after W windows: ", "end to end: "); ``who`` and
    ``unit`` name the model and its numbered parts ("draft", "stage": a MoE draft's block, its stages' routers).
    -> (exact RefOut continuing with ``use``, emulated RefOut continuing with K)."""
    def layered(pins: Mapping) -> Chosen:
        def compute() -> Chosen:
            with pinned(dict(pins), layered=True) as pin:
                out = forward()
            return Chosen(out, dict(pin.seen), dict(pin.rules))
        return run(compute)

    def name_of(key: tuple) -> str:
        return f"routing of {unit} {key[1]}" if key[0] == ROUTER else key[0]

    first, decided, label = layered({}), {}, f"{where}{who} "
    got = kernel_ids(report, first, lambda key: routing.get(key[1]) if key[0] == ROUTER else choices.get(key[0]),
                     name_of, label, decided)
    return continue_with(report, layered, first, got, name_of, lambda key: ops_of(key[1]), dtype, label, decided)


def chained_choices(report: Report, where: str, reference: Callable[[], Any], calls: Sequence[Any], t: int,
                    width: int, dtype: str, ops_of: Callable[[int], Sequence[Op]]) -> tuple[Any, Any]:
    """A chained draft's (an MTP / NextN with a MoE) router lines and its (exact, emulated) reference with the
    kernel's choices (``state_choices``, who "draft"). ``calls``: the Routing of each block call of one propose
    (its T real rows, then one per chained row); its reference re-runs the whole context at each chained row k
    under ``at_layer(k)``, so row k's pin is the ids of those T + k rows. Calls of any other shape pin nothing: each
    line then fails closed (the kernel made no choice). Lines ``(r) <where>draft routing of chained row <k> ...``."""
    ids = [r.ids.detach().cpu().numpy().astype(np.int64) for r in calls]
    shaped = len(ids) == width and ids[0].shape[0] == t and all(x.shape[0] == 1 for x in ids[1:])
    routing = {k: np.concatenate(ids[:k + 1]) for k in range(width)} if shaped else {}
    return state_choices(report, where, reference, routing, {}, dtype, ops_of, who="draft", unit="chained row")
