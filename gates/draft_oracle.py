"""(o) lines for block drafts against speculators' own model definitions (``bloomery_cli.oracle.speculators``).

The gates' ``check_draft_oracle`` hook, under ``--oracle``, after the drafted runs, on the first block after the
first prompt. Every side reads the same target taps, the engine's own (``draft_checks.kernel_taps``) taken to
float64, so a line measures the draft alone (the target was checked against transformers already):

- ``host f64 ... vs speculators f64``: our reference (``reference/drafts``) against speculators, both float64;
  the bands are the (r) lines' bands computed for dtype "f64".
- ``kernel ... vs speculators f64``: the device kernel's proposal (``detail=True``) against the same speculators
  run, within the run dtype's bands (the (r) lines' own).

DFlash: logits, draft ids. DFlash2: logits, top-K candidate sets, selector scores S_j[p, c] (speculators'
``score_candidates`` evaluated on each side's own candidates, so entries compare one by one), the walked path.
DSpark: logits with the Markov term and the confidence logits (both sides teacher-forced with one chain:
speculators' greedy chain for the host line, the kernel's for the kernel line), and the serial greedy chain
itself (our reference's free-running chain against speculators'). A greedy or path difference is excused only
where speculators' own top-2 margin sits inside the band; later slots of a path follow from the first.

Without speculators (or for a spec feature speculators' definition lacks) one note line says so and no (o)
draft line is printed: that is not a failure.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bloomery_cli.bands import Band, Op, chain_band, flip_excused, layer_ops, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck
from bloomery_cli.oracle import speculators as osp
from bloomery_gates.reference.families.qwen3.model import hf_hidden_states

from ..reference.drafts import dflash as ref_dflash
from ..reference.drafts import dflash2 as ref_dflash2
from ..reference.drafts import dspark as ref_dspark
from .dflash2_bands import dflash2_ops, set_excused
from .draft_checks import draft_ops, kernel_taps
from .targets import greedy_flips, to_np

TAG, REF = "(o)", "speculators f64"


@dataclass
class Setup:
    oracle: osp.Oracle
    taps: Any              # RefOut: the kernel's taps in float64
    hf: np.ndarray         # [L+1, s, H] the same in HF's hidden_states convention
    s: int
    anchor: int
    got: Any               # the kernel's Proposal (detail=True)


def setup(report: Report, c: DraftCheck) -> Setup | None:
    """The speculators model and the shared inputs, or None after a note saying why there is no oracle."""
    name = osp.kind(c.draft_spec)
    reason = osp.missing()
    if reason is None:
        try:
            oracle = osp.Oracle(c.draft_spec, c.target_spec)
        except osp.NotModelled as e:
            reason = str(e)
    if reason is not None:
        report.note(f"(o) {name} draft vs speculators: not checked, {reason}")
        return None
    anchor = int(c.prefill.argmax[-1])
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    taps = kernel_taps(c)
    report.note(f"(o) {name} draft oracle: speculators {osp.version()} {type(oracle.model).__name__}, float64 "
                f"(float32 islands lifted), on the kernel's target taps; target_layer_ids "
                f"{list(c.draft_spec.target_layer_ids)} -> aux_hidden_state_layer_ids {oracle.model.target_layer_ids}")
    return Setup(oracle, taps, hf_hidden_states(taps), taps.hidden.shape[1], anchor, got)


def rows(report: Report, what: str, got: np.ndarray, want: np.ndarray, band: Band) -> None:
    shape = "x".join(str(n) for n in got.shape)
    report.reference(f"{what} [{shape}]", got.size, worst_rel(got, want), band.value, tag=TAG, ref=REF)


def argmax_ids(report: Report, what: str, got_logits: np.ndarray, want_logits: np.ndarray, band: Band) -> None:
    differ, excused = greedy_flips(got_logits, want_logits, band)
    report.integer_match(what, len(got_logits), differ, excused, tag=TAG, ref=REF)


def path_ids(report: Report, what: str, got: np.ndarray, want: np.ndarray, margin_row, band: Band,
             loose: Collection[int] = ()) -> None:
    """A path (a serial chain): the first difference j0 is excused when speculators' row margin_row(j0) has
    its top-2 inside the band (or j0 / j0-1 is in ``loose``); every later slot then follows from it."""
    differ = np.nonzero(np.asarray(got) != np.asarray(want))[0]
    excused = 0
    if len(differ):
        j0 = int(differ[0])
        if flip_excused(margin_row(j0), band) or j0 in loose or (j0 - 1) in loose:
            excused = len(differ)
    report.integer_match(what, len(want), len(differ), excused, tag=TAG, ref=REF)


def draft_depth_band(c: DraftCheck, layers: int, logits: bool) -> Band:
    """The (o) lines' band: the worst-case chain band of the draft's ops (``bands.chain_band``). Against an
    outside oracle a ceiling is the right tool: f64 against f64 it is ~1e-12, and the kernel's own tight
    check is the (r) line's emulated band."""
    return chain_band(c.dtype, draft_ops(c, layers, logits), f"draft {'logits' if logits else 'layer'} after "
                                                           f"{layers} draft layer(s)")


def dflash2_band(c: DraftCheck, layers: int, stage: str) -> Band:
    """The same ceiling over DFlash2's op list (``dflash2_bands.dflash2_ops``: the conv and selector ops too)."""
    return chain_band(c.dtype, dflash2_ops(c, layers, stage), f"dflash2 {stage} after {layers} draft layer(s)")


# ---------------------------------------------------------------------------------------------------- dflash

def check_dflash(report: Report, c: DraftCheck, plain_ids: list[int] | None = None) -> None:
    st = setup(report, c)
    if st is None:
        return
    want = st.oracle.dflash(st.hf, st.s, st.anchor)
    ref = ref_dflash.forward(c.draft_spec, c.target_spec, st.taps, st.anchor)
    n = c.draft_spec.num_layers
    f64, run = draft_depth_band(replace(c, dtype="f64"), n, logits=True), draft_depth_band(c, n, logits=True)
    rows(report, "host f64 dflash logits", ref.logits, want.logits, f64)
    argmax_ids(report, "host f64 dflash draft ids", ref.logits, want.logits, f64)
    kernel = to_np(st.got.logits)
    rows(report, "kernel dflash logits", kernel, want.logits, run)
    argmax_ids(report, "kernel dflash draft ids", kernel, want.logits, run)


# --------------------------------------------------------------------------------------------------- dflash2

def check_dflash2(report: Report, c: DraftCheck, plain_ids: list[int] | None = None) -> None:
    st = setup(report, c)
    if st is None:
        return
    want, sel = st.oracle.dflash2(st.hf, st.s, st.anchor)
    ref = ref_dflash2.forward(c.draft_spec, c.target_spec, st.taps, st.anchor)
    d, n = c.draft_spec, c.draft_spec.num_layers
    got = st.got
    sides = {"host f64": (replace(c, dtype="f64"), ref.logits, ref.cand, ref.scores, ref.ids),
             "kernel": (c, to_np(got.logits), to_np(got.cand).astype(np.int64), to_np(got.scores),
                        np.asarray(got.ids, dtype=np.int64))}
    for side, (cc, logits, cand, scores, ids) in sides.items():
        lband, sband = dflash2_band(cc, n, "logits"), dflash2_band(cc, n, "scores")
        rows(report, f"{side} dflash2 logits", logits, want.logits, lband)
        bad = [j for j in range(len(cand)) if set(cand[j]) != set(sel.cand[j])]
        loose = {j for j in bad if set_excused(want.logits[j], d.selector_top_k, lband)}
        report.integer_match(f"{side} dflash2 top-{d.selector_top_k} candidate sets", len(cand), len(bad), len(loose),
                             tag=TAG, ref=REF)
        rows(report, f"{side} dflash2 selector scores", scores, st.oracle.selector_scores(want, st.anchor, cand), sband)
        prev = np.concatenate([[0], sel.idx[:-1]])
        path_ids(report, f"{side} dflash2 walked path ids", ids, sel.ids, lambda j, p=prev: sel.scores[j, p[j]],
                 sband, loose)


# ---------------------------------------------------------------------------------------------------- dspark

def dspark_bands(c: DraftCheck) -> tuple[Band, Band]:
    """(logits + Markov, confidence logits) after fc + the draft layers, from the kernel's taps."""
    d = c.draft_spec
    h, seq = c.target_spec.hidden_size, len(c.prompt) + d.block_size
    base = draft_depth_band(c, d.num_layers, logits=True)
    markov = chain_band(c.dtype, [Op("markov W2 . W1[prev]", max(d.markov_rank, 1)), Op("markov add", 1)], "markov")
    ops = layer_ops(c.target_spec.layer, seq) * (1 + d.num_layers)
    conf = chain_band(c.dtype, [*ops, Op("final norm", h), Op("confidence proj", h + d.markov_rank)],
                      f"dspark confidence logits after {1 + d.num_layers} layer(s)")
    return Band(base.value + markov.value, f"{base.derivation}; plus {markov.derivation}"), conf


def check_dspark(report: Report, c: DraftCheck, plain_ids: list[int] | None = None) -> None:
    st = setup(report, c)
    if st is None:
        return
    d, got = c.draft_spec, st.got
    want = st.oracle.dspark(st.hf, st.s, st.anchor)                       # speculators' own serial greedy chain
    free = ref_dspark.forward(d, c.target_spec, st.taps, st.anchor)        # ours, free-running
    forced = ref_dspark.forward(d, c.target_spec, st.taps, st.anchor, prev=want.prev)
    lband, cband = dspark_bands(replace(c, dtype="f64"))
    rows(report, "host f64 dspark logits+markov", forced.logits, want.logits, lband)
    path_ids(report, "host f64 dspark greedy chain ids (anchor-first, row k -> s+k+1)", free.ids, want.ids,
             lambda j: want.logits[j], lband)
    if d.confidence:
        rows(report, "host f64 dspark confidence logits", forced.conf_logits, want.conf_logits, cband)
    kprev = to_np(got.prev).astype(np.int64)
    kwant = want if np.array_equal(kprev, want.prev) else st.oracle.dspark(st.hf, st.s, st.anchor, prev=kprev)
    lband, cband = dspark_bands(c)
    kernel = to_np(got.logits)
    rows(report, "kernel dspark logits+markov", kernel, kwant.logits, lband)
    argmax_ids(report, "kernel dspark draft ids", kernel, kwant.logits, lband)
    if d.confidence:
        rows(report, "kernel dspark confidence logits", to_np(got.conf_logits), kwant.conf_logits, cband)
