"""Target families as the gates see them: the engine class, the f64 reference, the tier-3 oracle,
and the target's own (r) checks (each tapped layer, the logits, the greedy ids)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bloomery_cli.bands import Op, flip_excused, layer_ops
from bloomery_cli.contract import Report
from bloomery_gates.spec import ModelSpec

from ..kernels.families.mimo2 import Mimo2Target
from ..kernels.families.qwen3 import Pass, Qwen3Target
from ..kernels.families.qwen35moe import Qwen35MoeTarget
from ..kernels.families.qwen38 import Qwen38Target
from ..reference.families import mimo2 as ref_mimo2
from ..reference.families import qwen3 as ref_qwen3
from ..reference.families import qwen35moe as ref_qwen35moe
from ..reference.families import qwen38 as ref_qwen38
from ..reference.families.qwen3 import head
from ..reference.ops.attention import causal_mask
from ..reference.ops.norm import rms_norm
from ..reference.rounding import emulate
from ..reference.weights import as_f64
from ..reference.xp import run
from .close import close, exact_and_emulated
from .moe_checks import check_routing
from .state_decls import QWEN3_STATE, QWEN38_STATE
from .state_decls_mimo2 import MIMO2_STATE


@dataclass(frozen=True)
class Family:
    key: str
    engine: type
    reference: Callable            # (spec, ids) -> RefOut
    reference_layer: Callable      # (spec, l, h_in [T, H] f64) -> layer l's output [T, H], positions 0..T-1
    oracle: Callable | None        # (spec, ids) -> logits [T, V] float64, from code nobody here wrote
    final_norm: Callable           # (spec, h [T, H] f64) -> the rows that enter the head (the family's final norm)
    state: tuple = ()              # StateDecls of the engine's state after a run (KV, recurrent): state_decls
    check_extra: Callable | None = None   # (report, spec, prefill Pass, dtype) -> the family's own lines (MoE routing)


def _hf_qwen3(spec: ModelSpec, ids: list[int]) -> np.ndarray:
    from bloomery_cli.oracle import hf_qwen3_logits
    return hf_qwen3_logits(spec, ids)


def _qwen3_layer(spec: ModelSpec, l: int, h: np.ndarray) -> np.ndarray:
    t = len(h)
    return ref_qwen3.decoder_layer(spec.layer, as_f64(spec), f"model.layers.{l}.", h, np.arange(t), causal_mask(t))


def _hf_qwen38(spec: ModelSpec, ids: list[int]) -> np.ndarray:
    from bloomery_cli.oracle import hf_qwen38_logits
    return hf_qwen38_logits(spec, ids)


def _hf_mimo2(spec: ModelSpec, ids: list[int]) -> np.ndarray:
    from bloomery_cli.oracle_mimo2 import hf_mimo2_logits
    return hf_mimo2_logits(spec, ids)


def _hf_qwen35moe(spec: ModelSpec, ids: list[int]) -> np.ndarray:
    from bloomery_cli.oracle_qwen35moe import hf_qwen35moe_logits
    return hf_qwen35moe_logits(spec, ids)


def _final(norm: Callable) -> Callable:
    def final(spec: ModelSpec, h: np.ndarray) -> np.ndarray:
        return norm(h, as_f64(spec)["model.norm.weight"], spec.layer.rms_eps)
    return final


FAMILIES = {"qwen3": Family("qwen3", Qwen3Target, ref_qwen3.forward, _qwen3_layer, _hf_qwen3, _final(rms_norm),
                            QWEN3_STATE),
            "qwen38": Family("qwen38", Qwen38Target, ref_qwen38.forward, ref_qwen38.reference_layer, _hf_qwen38,
                             _final(ref_qwen38.norm1p), QWEN38_STATE),
            "mimo2": Family("mimo2", Mimo2Target, ref_mimo2.forward, ref_mimo2.reference_layer, _hf_mimo2,
                            _final(rms_norm), MIMO2_STATE),
            "qwen35moe": Family("qwen35moe", Qwen35MoeTarget, ref_qwen35moe.forward, ref_qwen35moe.reference_layer,
                                _hf_qwen35moe, _final(ref_qwen38.norm1p), QWEN38_STATE, check_routing)}


def to_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def greedy_flips(got_logits: np.ndarray, ref_logits: np.ndarray, band) -> tuple[int, int]:
    """(rows whose argmax differs, of those the ones excused by the reference's top-2 margin).
    Ties break to the lowest index on both sides (numpy and torch argmax)."""
    differ = np.nonzero(got_logits.argmax(-1) != ref_logits.argmax(-1))[0]
    return len(differ), sum(flip_excused(ref_logits[r], band) for r in differ)


def head_logits(family: Family, spec: ModelSpec, h: np.ndarray) -> np.ndarray:
    """The family's final norm and the LM head on last-layer rows h [T, H] -> logits [T, V]."""
    return head(spec, family.final_norm(spec, h))


def head_ops(spec: ModelSpec) -> list[Op]:
    h = spec.hidden_size
    return [Op("final norm", h), Op("lm head", h)]


def check_target(report: Report, family: Family, spec: ModelSpec, prefill: Pass, ref, dtype: str,
                 prompt: list[int]) -> None:
    """(r) lines: each layer on its own (the kernel's input to layer l fed to the reference's layer l,
    so a deep model's accumulated error cannot hide a broken layer), the head on its own (the kernel's
    last hidden through the reference's final norm and head), then the logits end to end and the greedy
    ids of the prompt rows. Every band is the emulated one (``gates.close``): the same reference
    computation re-run with the dtype's storage rounding, on the same inputs."""
    shape, t = spec.layer, prefill.taps.shape[1]
    taps = to_np(prefill.taps)
    ops = layer_ops(shape, t)
    for l in range(spec.num_layers):
        want, emu = exact_and_emulated(dtype, lambda l=l: family.reference_layer(spec, l, taps[l]))
        close(report, f"target layer {l} out [{t}x{spec.hidden_size}] from the kernel's input", taps[l + 1], want,
              emu, dtype, ops)
    got = to_np(prefill.logits)
    want, emu = exact_and_emulated(dtype, lambda: head_logits(family, spec, taps[-1]))
    close(report, f"target logits [{t}x{spec.vocab_size}] from the kernel's last hidden", got, want, emu, dtype,
          head_ops(spec))
    emu_ref = emulate(dtype, lambda: run(lambda: family.reference(spec, prompt)))
    band = close(report, f"target logits [{t}x{spec.vocab_size}]", got, ref.logits, emu_ref.logits, dtype,
                 ops * spec.num_layers + head_ops(spec))
    differ, excused = greedy_flips(got, ref.logits, band)
    report.integer_match("target greedy ids", t, differ, excused)
    if family.check_extra is not None:
        family.check_extra(report, spec, prefill, dtype)
