"""(r) checks of the engine's state AFTER the speculative loop has run (CONTRACT.md, "State after the loop").

The prefill-time (r) lines see the prompt and the first draft block only; a defect that shows after a verify and a
commit, and that the plain and the drafted run share (a verify rotated one position early, a store not written
after an accept, a rollback that restores the wrong tail), passes all of them. So the first prompt is drafted
again and stopped after W windows, as soon as W >= MIN_WINDOWS and a window that rejected every proposal and one
that kept some but not all of them are behind it (at the latest after n ids), and then:

    proposal = draft.propose(anchor, detail=True)          the next block (an MTP draft writes its real rows here)
    arrays   = each declared state, read from the engine and the draft          (before the next verify)
    verify   = engine.verify([anchor, *proposal.ids], logits=True)              (not committed)
    ref      = the family's f64 reference, ONE fresh run over seq = prompt + emitted + proposal.ids

with length = len(prompt) + len(emitted) - 1 the committed positions (the cache holds prompt + emitted[:-1];
the anchor emitted[-1] is the next verify's first row). The reference is causal, so the rows of ``ref`` cut at
``length`` are what a fresh run over the committed ids leaves behind, and its rows length..length+R-1 are the
next verify's. The fresh runs make the discrete choices (MoE routers, V4.1's stream top-k) the kernel's cache
holds where the contract excuses a flip (``gates.routing_flips.state_choices``: the engine's passes are logged per
position by ``ChoiceLog``; one line per choice), else a near-tie flip of the emulation or the kernel would stand
in the band or the statistic of every later layer. One line per state item:

    (r) state after <W> windows: <what> [shape] vs host f64: <count> checked, worst rel <x> (band <y>),
        rms rel <z> (band <v>) PASS|FAIL

What a state IS is declared, not known here: a target family (``gates.targets.Family.state``) and a drafter
(``GateDef.draft_state``) each give ``StateDecl``s: ``read`` (engine or draft -> named arrays), ``reference`` (the
fresh run -> the same names), ``ops`` (the stored ops chained from the ids to each array, for its band). Every
band comes from ``state_band`` (the emulated band of the fresh run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .bands import Band, Op, emulated_band, layer_ops, rel_rms, worst_rel
from .contract import Report, fmt_list
from .metrics import Tally
from .speculative import generate

MIN_WINDOWS = 8
BROKE = (RuntimeError, ValueError, IndexError)      # a broken loop or draft is a failed check (as in run_gate)


def np64(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().cpu().numpy()


@dataclass(frozen=True)
class StateRun:
    """The drafted run of one prompt stopped after ``windows`` windows, and the reference's fresh run of it."""

    target_spec: Any
    draft_spec: Any
    dtype: str
    prompt: list[int]
    emitted: list[int]            # every id the loop emitted; the last one is the next verify's anchor
    proposal: Any                 # the draft's next block (detail=True)
    windows: int
    forward: Callable             # the family's reference: (spec, ids) -> RefOut
    ref: Any = None               # RefOut over ``seq``, positions 0..T-1
    emu: StateRun | None = None   # the same run with ``ref`` from the reference under the dtype's storage rounding

    @property
    def length(self) -> int:
        """Committed positions: the cache holds prompt + emitted[:-1]."""
        return len(self.prompt) + len(self.emitted) - 1

    @property
    def verify_ids(self) -> list[int]:
        return [self.emitted[-1], *self.proposal.ids]

    @property
    def seq(self) -> list[int]:
        return [*self.prompt, *self.emitted, *self.proposal.ids]

    def fresh(self) -> StateRun:
        """The same run with ``ref`` from one fresh reference run over ``seq`` (under a rounding context: the
        emulated run the bands come from)."""
        return replace(self, ref=on_reference(lambda: self.forward(self.target_spec, self.seq)))


@dataclass(frozen=True)
class IntCheck:
    """An integer outcome of the state (a cut length) against the reference's: a line via ``Report.state_match``."""

    what: str
    checked: int
    differ: int
    excused: int


@dataclass(frozen=True)
class StateDecl:
    """A component's state after a run, as named arrays [..., row] (worst rel is taken per last-axis row).

    read:      (engine or draft, run) -> {name: array}, read-only, float64
    reference: run (its fresh ``ref``) -> {name: array}, the same names and shapes, from reference/ code
    ops:       run -> {name: [Op]}: the stored ops chained from the ids to that array (its band's depth)
    integers:  optional (engine or draft, run) -> [IntCheck]
    """

    read: Callable[[Any, StateRun], dict[str, np.ndarray]]
    reference: Callable[[StateRun], dict[str, np.ndarray]]
    ops: Callable[[StateRun], dict[str, list[Op]]]
    integers: Callable[[Any, StateRun], list[IntCheck]] | None = None


class ChoiceLog:
    """The engine, its prefill / verify passes' choices (``Pass.routing``, ``Pass.choices``) logged per position:
    the last pass to run a position wins, as its cache rows do. Everything else is the engine's."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.routing: dict[int, dict[int, np.ndarray]] = {}       # layer -> position -> ids [k]
        self.choices: dict[str, dict[int, np.ndarray]] = {}       # name -> position -> ids [k]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _log(self, p0: int, real: int, out: Any) -> Any:
        for table, got in ((self.routing, {l: r.ids for l, r in (getattr(out, "routing", None) or {}).items()}),
                           (self.choices, getattr(out, "choices", None) or {})):
            for key, ids in got.items():
                if ids is None:              # the pass made no such choice: its positions stay unlogged
                    continue
                rows = ids.detach().cpu().numpy()
                table.setdefault(key, {}).update({p0 + i: rows[i] for i in range(min(real, len(rows)))})
        return out

    def prefill(self, ids: list[int], *args, **kwargs) -> Any:
        return self._log(0, len(ids), self.engine.prefill(ids, *args, **kwargs))

    def verify(self, ids: list[int], *args, **kwargs) -> Any:
        p0 = self.engine.length
        return self._log(p0, len(ids), self.engine.verify(ids, *args, **kwargs))

    def ids(self, t: int) -> tuple[dict[int, np.ndarray | None], dict[str, np.ndarray | None]]:
        """(layer -> [t, k], name -> [t, k]) over positions 0..t-1; None where a position was never run."""
        def stack(rows: dict[int, np.ndarray]) -> np.ndarray | None:
            return np.stack([rows[p] for p in range(t)]) if all(p in rows for p in range(t)) else None
        return ({l: stack(r) for l, r in self.routing.items()}, {n: stack(r) for n, r in self.choices.items()})


def emulated(dtype: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` under the dtype's storage rounding (``reference.rounding``; imported late: the harness
    imports reference/ only through the gates)."""
    from bloomery_gates.reference.rounding import emulate

    return emulate(dtype, compute)


def on_reference(compute: Callable[[], Any]) -> Any:
    """``compute()`` on the gate's reference device, its arrays back as NumPy (``reference.xp.run``)."""
    from bloomery_gates.reference.xp import run

    return run(compute)


def state_band(dtype: str, what: str, exact: np.ndarray, emulated_value: np.ndarray, depth_ops: Sequence[Op]) -> Band:
    """The band of one state item; every state line's band comes from here: the emulated band
    (``bands.emulated_band``) of the reference's fresh run re-run under the dtype's storage rounding, with
    ``depth_ops`` (the stored ops chained from the ids to the array) for the accumulation term."""
    return emulated_band(dtype, exact, emulated_value, f"state {what}", depth_ops)


def rollbacks_seen(t: Tally) -> bool:
    """A window rejected every proposal (kept 1) and a window kept some but not all (1 < kept <= proposed)."""
    full = any(k == 1 for k in t.kept)
    partial = any(1 < k <= p for p, k in zip(t.proposed, t.kept, strict=True))
    return full and partial


def stop_rule(min_windows: int = MIN_WINDOWS) -> Callable[[Tally], bool]:
    return lambda t: t.windows >= min_windows and rollbacks_seen(t)


def next_verify(spec: Any) -> StateDecl:
    """The next verify's taps (each layer's output) and logits against the reference's rows length..length+R-1."""
    def rows(run: StateRun) -> slice:
        return slice(run.length, run.length + len(run.verify_ids))

    def read(v, run: StateRun) -> dict[str, np.ndarray]:
        taps = np64(v.taps)
        out = {f"next verify layer {l} out": taps[l + 1] for l in range(spec.num_layers)}
        return {**out, "next verify logits": np64(v.logits)}

    def reference(run: StateRun) -> dict[str, np.ndarray]:
        r = rows(run)
        out = {f"next verify layer {l} out": run.ref.hidden[l + 1, r] for l in range(spec.num_layers)}
        return {**out, "next verify logits": run.ref.logits[r]}

    def ops(run: StateRun) -> dict[str, list[Op]]:
        one, h = layer_ops(spec.layer, len(run.seq)), spec.hidden_size
        out = {f"next verify layer {l} out": one * (l + 1) for l in range(spec.num_layers)}
        return {**out, "next verify logits": one * spec.num_layers + [Op("final norm", h), Op("lm head", h)]}

    return StateDecl(read, reference, ops)


def compare(report: Report, run: StateRun, decl: StateDecl, got: dict[str, np.ndarray]) -> None:
    """One line per named array of ``got`` against the declaration's reference on ``run`` (exact, and on
    ``run.emu`` under the dtype's storage rounding for the band)."""
    want, ops = on_reference(lambda: decl.reference(run)), decl.ops(run)
    emu = emulated(run.dtype, lambda: on_reference(lambda: decl.reference(run.emu)))
    for name, g in got.items():
        w = want.get(name)
        if w is None:
            report.state_broken(run.windows, name, "the reference declares no such state")
            continue
        if g.shape != w.shape:
            report.state_broken(run.windows, name, f"shape {list(g.shape)}, the reference's fresh run {list(w.shape)}")
            continue
        band = state_band(run.dtype, name, w, emu[name], ops[name])
        report.state(run.windows, name, g.shape, g.size, worst_rel(g, w), band.value, rel_rms(g, w), band.rms)
    for name in sorted(want.keys() - got.keys()):
        report.state_broken(run.windows, name, "the reference's fresh run has it, the engine's read does not")


def check_state(report: Report, family: Any, gate: Any, engine: Any, draft: Any, target_spec: Any, draft_spec: Any,
                prompt: list[int], n: int, width: Any, dtype: str, choices: Callable | None = None) -> None:
    """The (r) state lines for one gate (called by ``run_gate`` after the (w) / (b) lines). ``choices``: the fresh
    runs with the kernel's choices (``gates.routing_flips.state_choices``, handed in by the runner: this layer does
    not import the gates); None: the fresh runs choose on their own."""
    target_decls = tuple(family.state or ())
    draft_decls = tuple(gate.draft_state or ())
    log = ChoiceLog(engine)
    try:
        r = generate(log, draft, prompt, n, width=width, stop=stop_rule())
        proposal = draft.propose(r.emitted[-1], detail=True)
        run = StateRun(target_spec, draft_spec, dtype, prompt, r.emitted, proposal, r.tally.windows, family.reference)
        got = [decl.read(engine, run) for decl in target_decls] + [decl.read(draft, run) for decl in draft_decls]
        verify = log.verify(run.verify_ids, logits=True)
    except BROKE as e:
        report.state_broken(None, "the drafted run of prompt 0", f"broke: {type(e).__name__}: {e}")
        return
    report.facts["state_run"] = {"windows": run.windows, "kept": r.tally.kept, "committed": run.length,
                                 "next_verify_rows": len(run.verify_ids)}
    report.note(f"state run: prompt 0 stopped after {run.windows} windows kept={fmt_list(r.tally.histogram())}, "
                f"{run.length} positions committed, next verify {len(run.verify_ids)} rows; host f64 runs "
                f"{len(run.seq)} ids fresh")
    if not rollbacks_seen(r.tally):
        report.note("state run: it ended (n ids) before both a window that rejected every proposal and one that kept "
                    "some proposals but not all had run; the state lines below check what it did run")
    routing, named = log.ids(len(run.seq))
    if choices is not None and (routing or named):
        one = family.layer_ops(target_spec.layer, len(run.seq))
        exact, emu = choices(report, f"state after {run.windows} windows: ",
                             lambda: family.reference(target_spec, run.seq), routing, named, dtype,
                             lambda l: one * (l + 1))
        run = replace(run, ref=exact)
        run = replace(run, emu=replace(run, ref=emu))
    else:
        run = run.fresh()
        run = replace(run, emu=emulated(dtype, run.fresh))
    nv = next_verify(target_spec)
    compare(report, run, nv, nv.read(verify, run))
    for decl, arrays in zip(target_decls + draft_decls, got, strict=True):
        compare(report, run, decl, arrays)
    for c in (c for decl in draft_decls if decl.integers for c in decl.integers(draft, run)):
        report.state_match(run.windows, c.what, c.checked, c.differ, c.excused)
