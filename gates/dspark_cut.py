"""DSpark's confidence cut, tier 1 on every window of a drafted run (issue 29 part 2).

The kernel cuts a block of B drafts at t (``kernels.drafts.dspark.keep_count``); the host rule
(``reference.drafts.dspark.cut_length``) on the kernel's own confidence logits z [B] of the same window is

    c_k = 1 / (1 + exp(-z_k))  (float64) ;  keep = min{k : c_k < t}, at least 1 ; B when no c_k < t or t <= 0

and the proposal must be the block's drafts [:keep]. The kernel's sigmoid runs in float32 (a few ulps from the
float64 one), so a window that differs only where some c_k with k <= max(keep) lies within 1e-6 of t is excused.
With ``--confidence-cut t`` the check runs on the gate's draft at t; with or without it, also at the probe
thresholds ``PROBES`` on drafts of their own (t = 0 keeps every draft, so a run without a threshold would check
no cut position; and one threshold sees a cut on the raw logit z < t only where sigmoid(z) lies between
sigmoid(t) and t: 0.5 sees c in [0.5, 0.62), 0.9 sees c in [0.71, 0.9)). Each run is prompt 0, greedy, up to
``IDS`` ids.
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck
from bloomery_cli.speculative import generate

from ..kernels.drafts.dspark import DSparkDraft
from ..reference.drafts import dspark as ref_dspark

PROBES = (0.5, 0.9)  # thresholds checked whatever the gate's own
IDS = 64             # ids of the checked run (fewer where the engine is shorter)
NEAR = 1e-6          # a float32 sigmoid against the float64 one


class CutTape:
    """The draft, asked for its detail on every proposal (the same ids): keeps (ids, drafts, conf logits)."""

    def __init__(self, draft):
        self.draft, self.seen = draft, []

    def __getattr__(self, name):
        return getattr(self.draft, name)

    def propose(self, anchor: int, detail: bool = False):
        got = self.draft.propose(anchor, detail=True)
        z = got.conf_logits.detach().double().cpu().numpy() if got.conf_logits is not None else None
        self.seen.append((list(got.ids), list(got.drafts), z))
        return got


def judge(seen: list, t: float) -> tuple[int, int, int, int, str]:
    """(windows, windows cut short, differ, excused, the first unexcused difference)."""
    cut = differ = excused = 0
    where = ""
    for w, (ids, drafts, z) in enumerate(seen):
        c = 1.0 / (1.0 + np.exp(-z))
        keep = ref_dspark.cut_length(c, t)
        cut += int(len(ids) < len(drafts))
        if ids == drafts[:keep]:
            continue
        differ += 1
        upto = max(keep, len(ids))
        if np.any(np.abs(c[:upto] - t) <= NEAR):
            excused += 1
        elif not where:
            where = f"window {w}: kernel kept {len(ids)}, host rule {keep} (conf {np.round(c, 4).tolist()})"
    return len(seen), cut, differ, excused, where


def check_cut_windows(report: Report, c: DraftCheck, make=None) -> None:
    """One (r) cut line per threshold over every window of prompt 0's drafted run (no confidence head: none).
    ``make(t)``: a fresh draft of the gate's kind at threshold t (default: the dense ``DSparkDraft``)."""
    if not c.draft_spec.confidence:
        return
    own = c.draft.confidence_cut
    n = min(IDS, c.draft.max_len - len(c.prompt) - c.draft_spec.block_size - 2)
    runs = [(own, False, c.draft)] if own > 0 else []
    make = make or (lambda t: DSparkDraft(c.draft_spec, c.engine, c.draft.max_len, confidence_cut=t))
    runs += [(t, True, make(t)) for t in PROBES if t != own]
    for t, probe, draft in runs:
        tape = CutTape(draft)
        generate(c.engine, tape, c.prompt, n)
        windows, cut, differ, excused, where = judge(tape.seen, t)
        report.cut_windows(t, probe, windows, cut, differ, excused, where)
