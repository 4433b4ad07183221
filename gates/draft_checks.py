"""(r) checks of block drafters against their f64 reference, on the first block after the prompt."""

from __future__ import annotations

from bloomery_cli.bands import layer_band, logits_band, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gate import DraftCheck

from ..reference.families.qwen3 import RefOut
from .targets import greedy_flips, to_np


def kernel_taps(c: DraftCheck) -> RefOut:
    """The engine's own target taps over the prompt, in float64, shaped as the reference's RefOut (``final``
    through the family's own final norm: plain for qwen3, zero-centred (1+w) for qwen38).

    The draft's reference reads these (not the target reference's taps), so a draft line measures the
    draft alone: the target's error was already checked layer by layer."""
    from .targets import FAMILIES

    hidden = to_np(c.prefill.taps)
    final = FAMILIES[c.target_spec.family].final_norm(c.target_spec, hidden[-1])
    return RefOut(logits=to_np(c.prefill.logits), hidden=hidden, final=final)


def draft_depth_band(c: DraftCheck, extra_layers: int, logits: bool):
    """From the target taps: fc + hidden_norm (one layer's worth of ops), then the draft's own layers."""
    depth = 1 + extra_layers
    seq = len(c.prompt) + c.draft_spec.block_size
    fn = logits_band if logits else layer_band
    return fn(c.dtype, c.target_spec.layer, depth, seq)


def check_block(report: Report, c: DraftCheck, name: str, got, ref) -> None:
    """got: the kernel Proposal (detail=True); ref: the reference's DraftRefOut, same anchor."""
    layer_out = to_np(got.layer_out)
    for i in range(layer_out.shape[0]):
        band = draft_depth_band(c, i + 1, logits=False)
        report.reference(f"{name} layer {i} out [{layer_out.shape[1]}x{layer_out.shape[2]}]", layer_out[i].size,
                         worst_rel(layer_out[i], ref.layer_out[i]), band.value)
    band = draft_depth_band(c, layer_out.shape[0], logits=True)
    logits = to_np(got.logits)
    report.reference(f"{name} logits [{logits.shape[0]}x{logits.shape[1]}]", logits.size,
                     worst_rel(logits, ref.logits), band.value)
    differ, excused = greedy_flips(logits, ref.logits, band)
    report.integer_match(f"{name} draft ids", logits.shape[0], differ, excused)
