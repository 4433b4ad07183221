"""Target families as the gates see them: the engine class, the f64 reference, the tier-3 oracle,
and the target's own (r) checks (each tapped layer, the logits, the greedy ids)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bloomery_cli.bands import flip_excused, layer_band, logits_band, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.spec import ModelSpec

from ..kernels.families.qwen3 import Pass, Qwen3Target
from ..reference.families import qwen3 as ref_qwen3


@dataclass(frozen=True)
class Family:
    key: str
    engine: type
    reference: Callable            # (spec, ids) -> RefOut
    oracle: Callable | None        # (spec, ids) -> logits [T, V] float64, from code nobody here wrote


def _hf_qwen3(spec: ModelSpec, ids: list[int]) -> np.ndarray:
    from bloomery_cli.oracle import hf_qwen3_logits
    return hf_qwen3_logits(spec, ids)


FAMILIES = {"qwen3": Family("qwen3", Qwen3Target, ref_qwen3.forward, _hf_qwen3)}


def to_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def greedy_flips(got_logits: np.ndarray, ref_logits: np.ndarray, band) -> tuple[int, int]:
    """(rows whose argmax differs, of those the ones excused by the reference's top-2 margin).
    Ties break to the lowest index on both sides (numpy and torch argmax)."""
    differ = np.nonzero(got_logits.argmax(-1) != ref_logits.argmax(-1))[0]
    return len(differ), sum(flip_excused(ref_logits[r], band) for r in differ)


def check_target(report: Report, spec: ModelSpec, prefill: Pass, ref, dtype: str) -> None:
    """(r) lines for every layer output, the logits and the greedy ids of the prompt rows."""
    shape, t = spec.layer, prefill.taps.shape[1]
    taps = to_np(prefill.taps)
    for l in range(1, spec.num_layers + 1):
        band = layer_band(dtype, shape, l, t)
        report.reference(f"target layer {l - 1} out [{t}x{spec.hidden_size}]", taps[l].size,
                         worst_rel(taps[l], ref.hidden[l]), band.value)
    band = logits_band(dtype, shape, spec.num_layers, t)
    got = to_np(prefill.logits)
    report.reference(f"target logits [{t}x{spec.vocab_size}]", got.size, worst_rel(got, ref.logits), band.value)
    differ, excused = greedy_flips(got, ref.logits, band)
    report.integer_match("target greedy ids", t, differ, excused)
