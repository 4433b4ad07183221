"""Gate qwen38-dflash2: a qwen38 (Qwen3.5/3.8 dense hybrid) target with a DFlash2 block drafter.

The drafter code is qwen3-dflash2's (``kernels.drafts.dflash2``, ``reference.drafts.dflash2``): its context
features are the hybrid stack's layer outputs, and a feature from the last layer goes through the target's
zero-centred final norm (``qwen38_dflash.kernel_taps``; the engine's ``final_norm`` is the gain 1 + w). The
(r) lines, bands and selector checks are qwen3-dflash2's (``qwen3_dflash2.dflash2_band`` / ``check_selector``),
on the first block after the first prompt, the f64 reference reading the engine's own taps. Block 8, as the
qwen38-dflash fixture, so the two gates' accept_mean compare; the published figures are printed beside ours,
marked external.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.bands import worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gate import DraftCheck, GateDef
from bloomery_cli.loading import load_dflash2

from ..kernels.drafts.dflash2 import DFlash2Draft
from ..reference.drafts import dflash2 as ref_dflash2
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dflash2 import ANCHORS, NAME, check_selector, describe, dflash2_band
from .qwen38_dflash import kernel_taps
from .targets import greedy_flips, to_np


def check_draft(report: Report, c: DraftCheck) -> None:
    """qwen3-dflash2's checks, the reference reading the hybrid engine's taps (zero-centred final norm)."""
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    ref = ref_dflash2.forward(c.draft_spec, c.target_spec, kernel_taps(c), anchor)
    layer_out = to_np(got.layer_out)
    for i in range(layer_out.shape[0]):
        band = dflash2_band(c, i + 1, "layer")
        report.reference(f"{NAME} layer {i} out [{layer_out.shape[1]}x{layer_out.shape[2]}]", layer_out[i].size,
                         worst_rel(layer_out[i], ref.layer_out[i]), band.value)
    band = dflash2_band(c, layer_out.shape[0], "logits")
    logits = to_np(got.logits)
    report.reference(f"{NAME} logits [{logits.shape[0]}x{logits.shape[1]}]", logits.size,
                     worst_rel(logits, ref.logits), band.value)
    differ, excused = greedy_flips(logits, ref.logits, band)
    report.integer_match(f"{NAME} slot argmax ids", logits.shape[0], differ, excused)
    check_selector(report, c, got, ref)


GATE = GateDef(
    name="qwen38-dflash2", family="qwen38", draft_kind="dflash2",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny-dflash2-b8", prompts=PROMPTS,
    about="qwen38 hybrid target + DFlash2 block drafter (dynamic depthwise conv, low-rank top-K path selector, "
          "B-1 drafts)",
    load_draft=lambda path, target: load_dflash2(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlash2Draft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft, anchors=ANCHORS,
)
