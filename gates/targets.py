"""The target's own (r) checks (each tapped layer, the logits, the greedy ids), for any family of the registry
(``bloomery_gates.registry``: its engine, f64 reference, per-layer reference, final norm and extra lines)."""

from __future__ import annotations

import numpy as np
import torch

from bloomery_cli.bands import Op, flip_excused
from bloomery_cli.contract import Report
from bloomery_gates.kernels.families.qwen3.model import Pass
from bloomery_gates.reference.families.qwen3.model import head
from bloomery_gates.registry import Family
from bloomery_gates.spec import ModelSpec

from ..reference.rounding import emulate
from ..reference.xp import run
from .close import close, exact_and_emulated
from .routing_flips import chosen_layer, kernel_picks, state_choices


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
    computation re-run with the dtype's storage rounding, on the same inputs. A MoE layer the kernel routed
    (``prefill.routing``) runs through ``routing_flips.routed_layer``: its routing line, the emulation routed with
    the kernel's experts, and the exact run routed with them where a flip is inside the router's margin band."""
    shape, t = spec.layer, prefill.taps.shape[1]
    taps = to_np(prefill.taps)
    ops = family.layer_ops(shape, t)
    routing, choices = getattr(prefill, "routing", None) or {}, getattr(prefill, "choices", None) or {}
    decided: dict = {}
    # every family's reference_layer takes the pass's layer inputs (glm5next's shared indexer reads its full layer's)
    # and the prompt ids (qwen4exp's PLE layer hashes them); the others ignore both
    for l in range(spec.num_layers):
        layer = lambda l=l: family.reference_layer(spec, l, taps[l], taps=taps, ids=prompt)  # noqa: E731
        picks = kernel_picks(l, routing, choices)
        if picks:
            want, emu = chosen_layer(report, l, layer, picks, decided, dtype, ops)
        else:
            want, emu = exact_and_emulated(dtype, layer)
        close(report, f"target layer {l} out [{t}x{taps.shape[-1]}] from the kernel's input", taps[l + 1], want,
              emu, dtype, ops)
    got = to_np(prefill.logits)
    want, emu = exact_and_emulated(dtype, lambda: head_logits(family, spec, taps[-1]))
    close(report, f"target logits [{t}x{spec.vocab_size}] from the kernel's last hidden", got, want, emu, dtype,
          head_ops(spec))
    if routing or choices:          # the end-to-end runs make the prefill's excused choices (routing_flips)
        ref, emu_ref = state_choices(report, "end to end: ", lambda: family.reference(spec, prompt),
                                     {l: r.ids.detach().cpu().numpy() for l, r in routing.items()},
                                     {n: None if c is None else c.detach().cpu().numpy()
                                      for n, c in choices.items()}, dtype,
                                     lambda l: ops * (l + 1))
    else:
        emu_ref = emulate(dtype, lambda: run(lambda: family.reference(spec, prompt)))
    band = close(report, f"target logits [{t}x{spec.vocab_size}]", got, ref.logits, emu_ref.logits, dtype,
                 ops * spec.num_layers + head_ops(spec))
    differ, excused = greedy_flips(got, ref.logits, band)
    report.integer_match("target greedy ids", t, differ, excused)
    if family.check_extra is not None:
        family.check_extra(report, spec, prefill, dtype)
