"""Judge an engine record (``record``) with the gate's lines, against the float64 reference (docs/CONTRACT.md,
"Another engine").

    (w) prompt i: ids identical N        the engine's drafted greedy ids equal its plain ones (strict; at a
                                          difference the f64 top-2 margin there and the window's verify width)
    (e) prompt i plain ids vs host f64   the engine's plain greedy ids against the f64 target's greedy id at each
                                          position, teacher-forced on the engine's ids; at the first divergence the
                                          f64 top-2 margin, labelled near-tie (inside the dtype's emulated logits
                                          band: bands.flip_excused) or defect; only a defect fails
    (b) accepts A of P proposals          fail closed: a run that never drafted, or never rejected, fails
    (a) draft ids vs host f64             on every engine window the f64 drafter's proposal at the same context
                                          (``replay``): a difference is excused only inside its top-2 margin band
    (a) acceptance vs host f64 replay     the engine's kept rows against the reference's on the same windows;
                                          one-sided sign test over the windows where they differ: the engine
                                          keeping fewer more often than chance (p < ALPHA) fails, with the
                                          per-position table that shows where
    accept_mean=...                       the engine's windows in our definition (kept rows incl. the bonus), and
                                          the engine's own figure with its own definition beside it
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bloomery_gates.reference.rounding import emulate
from bloomery_gates.reference.xp import run
from bloomery_gates.registry import FAMILIES

from ..bands import emulated_band, flip_excused
from ..contract import Report, fmt_list
from ..metrics import Tally
from .record import Record
from .replay import CONVENTIONS, PROPOSE, WindowRef, lookup, ref_logits_row, replay_prompt

ALPHA = 1e-3        # the (a) acceptance line's false-alarm rate


def sign_test(fewer: int, more: int) -> float:
    """P(X >= fewer), X ~ Binomial(fewer + more, 1/2): the engine keeping fewer rows than the reference on at
    least ``fewer`` of the windows where the two differ, were each difference a coin flip."""
    n = fewer + more
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(fewer, n + 1)) / 2.0**n


def drafted_tally(windows) -> Tally:
    """The windows that proposed, in our definition: kept rows = accepted + the bonus."""
    t = Tally()
    for w in windows:
        if w.proposed > 0:
            t.add(w.proposed, w.accepted + 1)
    return t


@dataclass
class Judged:
    """What the lines were made from (for the record's facts and tests)."""

    windows: list[WindowRef]
    engine: Tally
    reference: Tally


class Judge:
    def __init__(self, report: Report, record: Record, family: str, draft_kind: str, target_spec: Any,
                 draft_spec: Any):
        self.report, self.rec = report, record
        self.kind, self.t, self.d = draft_kind, target_spec, draft_spec
        self.propose = lookup(PROPOSE, family, draft_kind)
        self.convention_of = lookup(CONVENTIONS, family, draft_kind)
        self.forward: Callable = FAMILIES[family].reference
        self.dtype = record.header.dtype
        self._taps: dict[tuple[int, ...], Any] = {}
        self._emu: dict[tuple[int, ...], Any] = {}

    def taps(self, seq: list[int]) -> Any:
        key = tuple(seq)
        if key not in self._taps:
            self._taps[key] = run(lambda: self.forward(self.t, seq))
        return self._taps[key]

    def emulated_taps(self, seq: list[int]) -> Any:
        key = tuple(seq)
        if key not in self._emu:
            self._emu[key] = emulate(self.dtype, lambda: run(lambda: self.forward(self.t, seq)))
        return self._emu[key]

    def flip(self, seq: list[int], pos: int) -> tuple[float, bool, float]:
        """At position pos (the row predicting seq[pos + 1]): the f64 top-2 margin over max|row|, whether it is
        inside the band, and the band.

        The band is that row's own (``emulated_band`` of the one row, its small-tap multiples), as for a draft
        row: a tap-wide band takes the worst row's ratio (a row of small logits) to every row and grew past 1 in
        bf16 (mimo2-mtp on the H200: 1.17, so every flip passed as a near-tie)."""
        exact = np.asarray(self.taps(seq).logits)[pos]
        emu = np.asarray(self.emulated_taps(seq).logits)[pos]
        band = emulated_band(self.dtype, exact[None], emu[None], "target logits row")
        top = np.sort(exact)[-2:]
        return float((top[1] - top[0]) / np.max(np.abs(exact))), flip_excused(exact, band), band.value

    # --- the lines ---
    def lossless(self) -> bool:
        ok = True
        for p in self.rec.prompts:
            plain, drafted = p.plain_ids, p.drafted_ids
            margin = None
            if plain != drafted:
                k = next((i for i, (a, b) in enumerate(zip(plain, drafted, strict=False)) if a != b),
                         min(len(plain), len(drafted)))
                seq = list(p.prompt_ids) + list(plain)
                pos = len(p.prompt_ids) - 1 + k
                if pos < len(seq) - 1:
                    margin, near, band = self.flip(seq, pos)
                    width = self.verify_width(p, k)
                    self.report.note(f"(w) prompt {p.prompt}: at id {k} the f64 top-2 margin is {margin:.3e} of "
                                     f"max|logit| (band {band:.3e}: {'near-tie' if near else 'defect'}); the "
                                     f"drafted run verified {width} rows there, the plain run 1")
            ok &= self.report.ids(p.prompt, plain, drafted, margin)
        return ok

    @staticmethod
    def verify_width(p, k: int) -> int:
        e = 0
        for w in p.windows:
            if e + w.emitted > k:
                return w.proposed + 1
            e += w.emitted
        return 1

    def plain_vs_reference(self) -> bool:
        ok = True
        for p in self.rec.prompts:
            seq = list(p.prompt_ids) + list(p.plain_ids)
            start = len(p.prompt_ids) - 1
            greedy = np.asarray(self.taps(seq).logits)[start:len(seq) - 1].argmax(-1)
            got = np.asarray(p.plain_ids[:len(greedy)])
            diff = np.nonzero(greedy != got)[0]
            what = f"(e) prompt {p.prompt}: plain greedy ids vs host f64 (teacher-forced): {len(got)} checked"
            if len(diff) == 0:
                ok &= self.report.check(f"{what}, 0 differ", True)
                continue
            k = int(diff[0])
            margin, near, band = self.flip(seq, start + k)
            label = "near-tie" if near else "defect"
            ok &= self.report.check(f"{what}, first divergence at id {k}: f64 top-2 margin {margin:.3e} of "
                                    f"max|logit| (band {band:.3e}), verify width 1: {label}", near)
        return ok

    def replay(self) -> Judged:
        wins: list[WindowRef] = []
        eng, ref = Tally(), Tally()
        for p in self.rec.prompts:
            taps = self.taps(list(p.prompt_ids) + list(p.drafted_ids))
            wins += replay_prompt(self.propose, self.d, self.t, taps, p.prompt_ids, p.drafted_ids, p.windows, p.prompt)
        for w in wins:
            eng.add(w.proposed, w.engine_kept)
            ref.add(w.proposed, w.ref_kept)
        return Judged(wins, eng, ref)

    def drafts_vs_reference(self, j: Judged) -> bool:
        exposed = [w for w in j.windows if w.engine_ids]
        what = "draft ids on the engine's windows"
        if not exposed:
            return self.report.check(f"(a) {what}: the record holds no draft ids, the check could not run", False)
        differ = [w for w in exposed if w.first_diff is not None]
        excused = 0
        for w in differ[:64]:               # each difference costs an emulated forward; 64 decide the line
            p = self.rec.prompts[w.prompt]
            seq = list(p.prompt_ids) + list(p.drafted_ids)
            row = w.ref_row
            emu = emulate(self.dtype, lambda seq=seq, w=w: run(lambda: ref_logits_row(
                self.propose, self.d, self.t, self.emulated_taps(seq), seq, w.s, len(w.engine_ids), w.first_diff)))
            band = emulated_band(self.dtype, row[None], np.asarray(emu)[None], "draft logits row")
            excused += flip_excused(row, band)
        self.convention(differ)
        unjudged = max(0, len(differ) - 64)
        note = f" ({unjudged} more not judged)" if unjudged else ""
        self.report.facts["engine_drafts"] = {"windows": len(exposed), "differ": len(differ), "excused": excused}
        return self.report.integer_match(what, len(exposed), len(differ), excused, tag="(a)",
                                         ref=f"host f64 drafter{note}")

    def convention(self, differ: list[WindowRef]) -> None:
        """Where an engine's drafts differ and a known engine convention exists for the kind, a note: how many of
        the differing windows the f64 reference reproduces when it follows that convention (the cause, named)."""
        if not differ or self.convention_of is None:
            return
        what, propose = self.convention_of
        same = 0
        for w in differ[:64]:
            p = self.rec.prompts[w.prompt]
            seq = list(p.prompt_ids) + list(p.drafted_ids)
            ids, _ = run(lambda seq=seq, w=w: propose(self.d, self.t, self.taps(seq), seq, w.s, len(w.engine_ids)))
            same += [int(x) for x in ids[:len(w.engine_ids)]] == list(w.engine_ids)
        self.report.facts["engine_convention"] = {"convention": what, "checked": min(len(differ), 64),
                                                  "reproduced": same}
        self.report.note(f"(a) with {what}, the f64 reference reproduces the engine's drafts in {same} of "
                         f"{min(len(differ), 64)} differing windows")

    def acceptance(self, j: Judged) -> bool:
        fewer = sum(1 for w in j.windows if w.engine_ids and w.engine_kept < w.ref_kept)
        more = sum(1 for w in j.windows if w.engine_ids and w.engine_kept > w.ref_kept)
        p = sign_test(fewer, more)
        ok = p >= ALPHA and j.engine.windows > 0
        text = (f"(a) acceptance vs host f64 replay on the same {j.engine.windows} windows: engine accept_mean "
                f"{j.engine.accept_mean:.3f}, reference {j.reference.accept_mean:.3f}; the engine kept fewer in "
                f"{fewer} and more in {more} windows: one-sided sign test p={p:.3g} (alpha {ALPHA:g})")
        res = self.report.check(text, ok)
        self.report.facts["engine_acceptance"] = {
            "engine_accept_mean": j.engine.accept_mean, "reference_accept_mean": j.reference.accept_mean,
            "fewer": fewer, "more": more, "p": p, "engine_pos_accept": j.engine.pos_accept(),
            "reference_pos_accept": j.reference.pos_accept()}
        self.report.note(f"(a) pos_accept engine    {fmt_list(j.engine.pos_accept())}")
        self.report.note(f"(a) pos_accept reference {fmt_list(j.reference.pos_accept())}")
        if not res:
            self.report.note("(a) draft numerics differ from the reference: the table above shows where")
        return res

    def run(self) -> Judged:
        self.lossless()
        self.plain_vs_reference()
        per = [drafted_tally(p.windows) for p in self.rec.prompts]
        drafted = drafted_tally(w for p in self.rec.prompts for w in p.windows)
        self.report.branches(drafted)
        j = self.replay()
        self.drafts_vs_reference(j)
        self.acceptance(j)
        if all(p.plain_ids == p.drafted_ids for p in self.rec.prompts):
            self.report.identical(self.rec.header.n)
        self.report.acceptance(drafted, per, self.rec.header.width + 1)
        self.engine_figure()
        return j

    def engine_figure(self) -> None:
        """The engine's own acceptance figure, from its counters where the record has them, with its definition."""
        c = [p.counters for p in self.rec.prompts]
        drafted = sum(int(x.get("n_drafted", 0)) for x in c)
        accepted = sum(int(x.get("n_accept", 0)) for x in c)
        steps = sum(len(p.windows) for p in self.rec.prompts)
        if drafted and all("n_drafted" in x and "n_accept" in x for x in c):
            self.report.facts["engine_counters"] = {"n_drafted": drafted, "n_accept": accepted, "windows": steps}
            self.report.note(f"engine acceptance (its own counters): accept {accepted / drafted:.3f} = n_accept "
                             f"{accepted} / n_drafted {drafted}; mean acceptance length 1 + n_accept / verify steps "
                             f"= {1 + accepted / max(steps, 1):.3f}")
        self.report.note(f"engine acceptance definition: {self.rec.header.acceptance}")
        self.report.note("accept_mean (ours): mean kept rows per window, the bonus included, over the windows that "
                         "proposed (docs/CONTRACT.md)")
