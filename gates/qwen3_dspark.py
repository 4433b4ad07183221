"""Gate qwen3-dspark: a Qwen3 target with a DSpark block drafter (DeepSpec layout, DRAFTERS.md section 4).

Verify rows per pass: B + 1 (the anchor + B anchor-first drafts). The (r) lines, on the first block
after the first prompt, compare the kernel with the f64 reference whose Markov inputs are
teacher-forced with the kernel's own chain (so rows compare one by one even past an excused flip):
each draft layer's output, the logits (Markov term included), the draft ids; then two tier-1 checks
of the kernel against a host transcription of its own rules: the chain prev_0 = anchor,
prev_{k+1} = argmax logits_k, and (with a confidence head) the confidence logits and the cut length.

Option ``confidence_cut`` t (the CLI's ``--confidence-cut``; see ``with_options``): proposals stop
before the first draft with confidence < t (at least one is kept). With t > 0 the gate also runs the
first prompt with t = 0 and prints how the cut changed the verify rows and accept_mean (a note).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bloomery_cli.bands import Op
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef, GateOption, unit_interval
from bloomery_cli.loading import load_dspark
from bloomery_cli.speculative import generate
from bloomery_gates.spec import DSparkSpec

from ..kernels.drafts.dspark import DSparkDraft
from ..reference.drafts import dspark as ref_dspark
from .close import close, exact_and_emulated
from .draft_checks import draft_ops, kernel_taps
from .draft_oracle import check_dspark
from .dspark_cut import check_cut_windows
from .fixtures import FIXTURES, PROMPTS
from .state_decls import DSPARK_STATE
from .targets import greedy_flips, to_np

CUT_COMPARE_IDS = 64      # ids generated per run for the cut vs no-cut note


def depth_ops(c: DraftCheck, logits: bool, extra: int = 0) -> list[Op]:
    """The chained ops behind a DSpark tap: the DFlash depth, for logits the final norm, the head and the
    Markov term's two ops (a length-r product, an add); for the confidence logits the confidence
    projection (n = H + r) instead."""
    d: DSparkSpec = c.draft_spec
    h = c.target_spec.layer.hidden_size
    ops = draft_ops(c, d.num_layers if extra == 0 else extra, logits=False)
    if logits:
        ops += [Op("final norm", h), Op("lm head", h), Op("markov W2 . W1[prev]", max(d.markov_rank, 1)),
                Op("markov add", 1)]
    return ops


def check_rows(report: Report, c: DraftCheck, got, ref: ref_dspark.DSparkRefOut, emu: ref_dspark.DSparkRefOut,
               anchor: int, ops: list[Op]) -> None:
    """A DSpark block's rows (dense and DSV4 alike): the logits with the Markov term [B, V] within the band of
    ``ops``, the draft ids (greedy flips excused by that band), and the chain rule prev_0 = anchor,
    prev_{k+1} = argmax logits_k on the kernel's own logits."""
    logits = to_np(got.logits)
    band = close(report, f"dspark logits+markov [{logits.shape[0]}x{logits.shape[1]}]", logits, ref.logits,
                 emu.logits, c.dtype, ops)
    differ, excused = greedy_flips(logits, ref.logits, band)
    report.integer_match("dspark draft ids (anchor-first, row k -> s+k+1)", logits.shape[0], differ, excused)
    prev = to_np(got.prev).astype(np.int64)
    want = np.concatenate([[anchor], logits[:-1].argmax(-1)])
    report.integer_match("dspark markov chain prev_0=anchor prev_k+1=argmax_k", len(prev), int((prev != want).sum()),
                         0, ref="host rule")


def check_cut(report: Report, c: DraftCheck, got) -> None:
    """The drafts kept equal ``cut_length`` of the kernel's confidences [B] (sigmoid of its conf_logits [B]) at the
    draft's threshold t."""
    t = c.draft.confidence_cut
    keep = ref_dspark.cut_length(to_np(got.confidence), t)
    report.integer_match(f"dspark confidence cut t={t:g} kept {len(got.ids)} of {len(got.conf_logits)}", 1,
                         int(keep != len(got.ids)), 0, ref="host rule")


def check_block(report: Report, c: DraftCheck, got, ref: ref_dspark.DSparkRefOut, emu: ref_dspark.DSparkRefOut,
                anchor: int) -> None:
    """got: the kernel's DSparkProposal (detail=True); ref / emu: the reference teacher-forced with got.prev,
    exact and under the dtype's storage rounding."""
    layer_out = to_np(got.layer_out)
    for i in range(layer_out.shape[0]):
        close(report, f"dspark layer {i} out [{layer_out.shape[1]}x{layer_out.shape[2]}]", layer_out[i],
              ref.layer_out[i], emu.layer_out[i], c.dtype, depth_ops(c, False, i + 1))
    check_rows(report, c, got, ref, emu, anchor, depth_ops(c, True))
    if got.conf_logits is None:
        return
    z = to_np(got.conf_logits)
    h, r = c.target_spec.layer.hidden_size, c.draft_spec.markov_rank
    close(report, f"dspark confidence logits [{len(z)}]", z, ref.conf_logits, emu.conf_logits, c.dtype,
          depth_ops(c, False) + [Op("final norm", h), Op("confidence proj", h + r)])
    check_cut(report, c, got)


def compare_cut(report: Report, c: DraftCheck) -> None:
    """The first prompt drafted with the gate's cut t and with t = 0: verify rows and accept_mean (a note)."""
    n = min(CUT_COMPARE_IDS, c.draft.max_len - len(c.prompt) - c.draft_spec.block_size - 2)   # fits the engine
    runs = {}
    for t in (c.draft.confidence_cut, 0.0):
        draft = DSparkDraft(c.draft_spec, c.engine, c.draft.max_len, confidence_cut=t)
        runs[t] = generate(c.engine, draft, c.prompt, n)
    (t, cut), (_, full) = runs.items()
    rows = {k: 1 + r.tally.proposals / max(1, r.tally.windows) for k, r in runs.items()}
    facts = {"threshold": t, "ids": n, "verify_rows_mean": round(rows[t], 4),
             "verify_rows_mean_nocut": round(rows[0.0], 4), "accept_mean": round(cut.tally.accept_mean, 4),
             "accept_mean_nocut": round(full.tally.accept_mean, 4), "ids_identical": cut.ids == full.ids}
    report.facts["confidence_cut"] = facts
    report.note(f"confidence_cut t={t:g} prompt 0 ids={n}: verify_rows_mean={rows[t]:.3f} "
                f"(t=0: {rows[0.0]:.3f}) accept_mean={cut.tally.accept_mean:.3f} (t=0: {full.tally.accept_mean:.3f}) "
                f"ids identical to t=0: {'yes' if cut.ids == full.ids else 'NO'}")


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    prev = to_np(got.prev).astype(np.int64)
    ref, emu = exact_and_emulated(
        c.dtype, lambda: ref_dspark.forward(c.draft_spec, c.target_spec, kernel_taps(c), anchor, prev=prev))
    check_block(report, c, got, ref, emu, anchor)
    check_cut_windows(report, c)
    if c.draft.confidence_cut > 0 and c.draft_spec.confidence:
        compare_cut(report, c)


def describe(d: DSparkSpec, confidence_cut: float = 0.0) -> dict[str, Any]:
    return {"block": d.block_size, "drafts": d.block_size, "target_layers": list(d.target_layer_ids),
            "layers": d.num_layers, "mask_id": d.mask_token_id, "markov_rank": d.markov_rank,
            "markov_head": d.markov_head_type, "confidence_head": d.confidence, "confidence_cut": confidence_cut,
            "own_embed": "embed_tokens.weight" in d.tensors, "own_head": "lm_head.weight" in d.tensors}


def make_draft(spec: DSparkSpec, engine, max_len: int, confidence_cut: float = 0.0) -> DSparkDraft:
    return DSparkDraft(spec, engine, max_len, confidence_cut=confidence_cut)


CONFIDENCE_CUT = GateOption(0.0, "DSpark: cut a proposal before the first draft whose confidence is below this "
                            "threshold in [0, 1] (0 disables); the gate reports how verify rows and accept_mean "
                            "change, and ids must stay identical.", unit_interval, "T")

GATE = GateDef(
    name="qwen3-dspark", family="qwen3", draft_kind="dspark",
    target=FIXTURES / "qwen3-tiny", draft=FIXTURES / "qwen3-tiny-dspark-b7", prompts=PROMPTS,
    about="Qwen3 target + DSpark drafter (anchor-first B drafts, serial Markov head, confidence cut)",
    load_draft=lambda path, target: load_dspark(Path(path), target),
    make_draft=make_draft, block=lambda d: d.block_size + 1, describe=describe, check_draft=check_draft,
    anchors=("anchor (external, DSpark paper, T=1 B=7): Qwen3-8B GSM8K DSpark 6.17 vs DFlash 5.33 vs "
             "EAGLE-3 5.30",),
    options={"confidence_cut": CONFIDENCE_CUT}, check_draft_oracle=check_dspark,
    draft_state=DSPARK_STATE,
)


def with_options(gate: GateDef = GATE, confidence_cut: float | None = None) -> GateDef:
    """The gate with ``--confidence-cut t`` bound into make_draft / describe (t in [0, 1]; 0 disables)."""
    if confidence_cut is None:
        return gate
    cut = gate.options["confidence_cut"].value("--confidence-cut", str(confidence_cut))
    return replace(gate, options={**gate.options, "confidence_cut": replace(gate.options["confidence_cut"],
                                                                            default=cut)},
                   make_draft=partial(make_draft, confidence_cut=confidence_cut),
                   describe=partial(describe, confidence_cut=confidence_cut))
