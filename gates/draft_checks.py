"""(r) checks of block drafters against their f64 reference, on the first block after the prompt."""

from __future__ import annotations

from bloomery_cli.bands import layer_band, logits_band, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gate import DraftCheck

from .targets import greedy_flips, to_np


def draft_depth_band(c: DraftCheck, extra_layers: int, logits: bool):
    """The draft reads target taps up to layer max(l_j)+1, then fc (one layer's worth) and its own layers."""
    depth = max(c.draft_spec.target_layer_ids) + 1 + 1 + extra_layers
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
