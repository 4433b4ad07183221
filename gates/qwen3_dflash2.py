"""Gate qwen3-dflash2: a Qwen3 target with a DFlash2 block drafter (dynamic conv + top-K path selector).

(r) lines, on the first block after the first prompt, the draft's reference reading the engine's own
target taps (``draft_checks.kernel_taps``):
- each draft layer's output and the logits, within bands that count the conv's ops (below);
- the per-slot argmax and the top-K candidate sets (a difference excused only inside the margin band);
- the selector scores S_j[p, c] against the f64 reference evaluated on the kernel's own candidates;
- tier 1: the walked path against the host transcription of the walk on the kernel's own scores (exact);
- the walked path against the f64 reference's path (a first divergence excused only inside the band).

Bands: emulated (``gates.close``), the reference re-run with the dtype's storage rounding. Op counts
(for the accumulation term): the DFlash chain (fc as one layer, then each draft layer) plus per draft
layer, per sublayer, the kernel projection (a reduction of H) and the two conv sides (T terms each);
the scores add the hidden projection (H) and the codebook sum (r).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bloomery_cli.bands import Band, flip_excused
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_cli.loading import load_dflash2
from bloomery_gates.spec import DFlash2Spec

from ..kernels.drafts.dflash2 import DFlash2Draft
from ..reference.drafts import dflash2 as ref_dflash2
from ..reference.ops import selector as ref_selector
from ..reference.rounding import emulate
from ..reference.weights import as_f64
from .close import close, exact_and_emulated
from .dflash2_bands import dflash2_ops, set_excused
from .dflash2_ties import check_ties
from .draft_checks import kernel_taps
from .draft_oracle import check_dflash2
from .fixtures import FIXTURES, PROMPTS
from .state_decls import DFLASH2_STATE
from .targets import greedy_flips, to_np

NAME = "dflash2"


def selector_scores(c: DraftCheck, cand: np.ndarray, ref) -> np.ndarray:
    """The f64 selector scores on the kernel's own candidates (so they compare entry by entry)."""
    w = as_f64(c.draft_spec)
    pred = ref_selector.predecessors(int(c.prefill.argmax[-1]), cand)
    unary = np.take_along_axis(ref.logits, cand, -1)
    return ref_selector.scores(pred, cand, unary, ref.g, w["candidate_selector.predecessor_codebook"],
                               w["candidate_selector.successor_codebook"])


def check_selector(report: Report, c: DraftCheck, got, ref, emu, lband: Band) -> None:
    d = c.draft_spec
    cand, idx = to_np(got.cand).astype(np.int64), to_np(got.idx).astype(np.int64)
    scores, ids = to_np(got.scores), np.asarray(got.ids, dtype=np.int64)
    j = len(ids)
    bad_sets = [s for s in range(j) if set(cand[s]) != set(ref.cand[s])]
    set_ok = [s for s in bad_sets if set_excused(ref.logits[s], d.selector_top_k, lband)]
    report.integer_match(f"{NAME} top-{d.selector_top_k} candidate sets", j, len(bad_sets), len(set_ok))
    ref_s, emu_s = selector_scores(c, cand, ref), emulate(c.dtype, lambda: selector_scores(c, cand, emu))
    sband = close(report, f"{NAME} selector scores [{j}x{cand.shape[1]}x{cand.shape[1]}]", scores, ref_s, emu_s,
                  c.dtype, dflash2_ops(c, d.num_layers, "scores"))
    host = ref_selector.walk(scores)
    report.integer_match(f"{NAME} walked path", j, int((host != idx).sum()), 0, ref="host walk of its own scores")
    differ = np.nonzero(ids != ref.ids)[0]
    excused = 0
    if len(differ):
        j0 = int(differ[0])
        prev = int(ref.idx[j0 - 1]) if j0 else 0
        if flip_excused(ref.scores[j0, prev], sband) or j0 in set_ok or (j0 - 1) in set_ok:
            excused = len(differ)          # later slots follow from a different predecessor
    report.integer_match(f"{NAME} walked path ids", j, len(differ), excused)


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    ref, emu = exact_and_emulated(c.dtype,
                                  lambda: ref_dflash2.forward(c.draft_spec, c.target_spec, kernel_taps(c), anchor))
    layer_out = to_np(got.layer_out)
    for i in range(layer_out.shape[0]):
        close(report, f"{NAME} layer {i} out [{layer_out.shape[1]}x{layer_out.shape[2]}]", layer_out[i],
              ref.layer_out[i], emu.layer_out[i], c.dtype, dflash2_ops(c, i + 1, "layer"))
    logits = to_np(got.logits)
    band = close(report, f"{NAME} logits [{logits.shape[0]}x{logits.shape[1]}]", logits, ref.logits, emu.logits,
                 c.dtype, dflash2_ops(c, layer_out.shape[0], "logits"))
    differ, excused = greedy_flips(logits, ref.logits, band)
    report.integer_match(f"{NAME} slot argmax ids", logits.shape[0], differ, excused)
    check_selector(report, c, got, ref, emu, band)
    check_ties(report, c)


def describe(d: DFlash2Spec) -> dict:
    return {"block": d.block_size, "target_layers": list(d.target_layer_ids), "layers": d.num_layers,
            "mask_id": d.mask_token_id, "conv_T": d.conv_kernel_size, "conv_g": d.conv_group_size,
            "selector_r": d.selector_rank, "selector_K": d.selector_top_k}


ANCHORS = (
    "anchor (external, DFlash2 blog, Inco AI / Z Lab, thinking on, T=1.0, lossless rejection sampling): "
    "DFlash2 tau 4.80 on Qwen3.8-27B at B=8 (MTP 4.28, DSpark 3.62)",
    "anchor (external, same source): DFlash2 tau 5.97 on Qwen3.5-4B, mean of GSM8K/MATH-500/HumanEval/MBPP/"
    "MT-Bench (DFlash 4.92, DSpark 5.49, MTP 4.54)",
)

GATE = GateDef(
    name="qwen3-dflash2", family="qwen3", draft_kind="dflash2",
    target=FIXTURES / "qwen3-tiny", draft=FIXTURES / "qwen3-tiny-dflash2-b8", prompts=PROMPTS,
    about="Qwen3 target + DFlash2 block drafter (dynamic depthwise conv, low-rank top-K path selector, B-1 drafts)",
    load_draft=lambda path, target: load_dflash2(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlash2Draft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft, anchors=ANCHORS,
    check_draft_oracle=check_dflash2,
    draft_state=DFLASH2_STATE,
)
