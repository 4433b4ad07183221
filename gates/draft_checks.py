"""(r) checks of block drafters against their f64 reference, on the first block after the prompt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck
from bloomery_gates.reference.families.qwen3.model import RefOut

from .close import close, exact_and_emulated
from .targets import greedy_flips, to_np


def kernel_taps(c: DraftCheck) -> RefOut:
    """The engine's own target taps over the prompt, in float64, shaped as the reference's RefOut (``final``
    through the family's own final norm: plain for qwen3, zero-centred (1+w) for qwen38).

    The draft's reference reads these (not the target reference's taps), so a draft line measures the
    draft alone: the target's error was already checked layer by layer."""
    from bloomery_gates.registry import FAMILIES

    hidden = to_np(c.prefill.taps)
    final = FAMILIES[c.target_spec.family].final_norm(c.target_spec, hidden[-1])
    return RefOut(logits=to_np(c.prefill.logits), hidden=hidden, final=final)


def draft_ops(c: DraftCheck, extra_layers: int, logits: bool) -> list[Op]:
    """The chained ops behind a draft tap: fc + hidden_norm (one layer's worth), the draft's own layers, and
    for logits the final norm and the head (their reduction lengths give the band's accumulation term)."""
    shape = c.target_spec.layer
    ops = layer_ops(shape, len(c.prompt) + c.draft_spec.block_size) * (1 + extra_layers)
    return ops + [Op("final norm", shape.hidden_size), Op("lm head", shape.hidden_size)] * logits


def check_block(report: Report, c: DraftCheck, name: str, got, reference: Callable[[], Any]) -> Any:
    """got: the kernel Proposal (detail=True); reference(): the reference's DraftRefOut for the same anchor,
    reading ``kernel_taps(c)`` (run once exactly and once under the dtype's storage rounding for the bands).
    Returns the exact DraftRefOut."""
    ref, emu = exact_and_emulated(c.dtype, reference)
    layer_out = to_np(got.layer_out)
    for i in range(layer_out.shape[0]):
        close(report, f"{name} layer {i} out [{layer_out.shape[1]}x{layer_out.shape[2]}]", layer_out[i],
              ref.layer_out[i], emu.layer_out[i], c.dtype, draft_ops(c, i + 1, logits=False))
    logits = to_np(got.logits)
    band = close(report, f"{name} logits [{logits.shape[0]}x{logits.shape[1]}]", logits, ref.logits, emu.logits,
                 c.dtype, draft_ops(c, layer_out.shape[0], logits=True))
    differ, excused = greedy_flips(logits, ref.logits, band)
    report.integer_match(f"{name} draft ids", logits.shape[0], differ, excused)
    return ref
