"""Does every configured option of a fixture change its outputs? (issue 29, part 5)

A fixture exercises a path only where its configuration makes the path matter: a MiMo routed scaling factor of 1.0
makes "the factor applied before the renormalisation" (which cancels it) indistinguishable from the right order,
so no gate on that fixture can see the defect. This check runs the float64 reference over a window of ids on the
fixture's spec and once more per option with the option removed (set to the value at which its code path does
nothing); an option whose removal leaves every logit within ``TOL`` (relative to max |logit|) is inert and is
reported at build time.

    inert(spec, ids, options) -> list[Effect]       every option, with its effect; ``Effect.inert`` when it hides
    MIMO2_OPTIONS                                    a mimo2 target's options and their removal

Shapes: ids [T] ints; the reference's logits [T, V] float64; effect = max |logits - logits_removed| / max |logits|.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

TOL = 1e-12          # float64 orders of summation differ by a few ulps; a removed path moves logits by far more


@dataclass(frozen=True)
class Effect:
    option: str
    value: Any            # the configured value
    removed: Any          # the value its removal sets
    effect: float         # max |logits - logits_removed| / max |logits|

    @property
    def inert(self) -> bool:
        return self.effect <= TOL

    def line(self) -> str:
        verdict = "changes nothing: a defect on its path cannot be seen on this fixture" if self.inert else "acts"
        return (f"option {self.option}={self.value} (removed: {self.removed}): max rel change of the logits "
                f"{self.effect:.3e}, {verdict}")


def _moe(spec: Any, **changes: Any) -> Any:
    return replace(spec, mimo=replace(spec.mimo, moe=replace(spec.mimo.moe, **changes)))


def _windows_off(spec: Any) -> Any:
    return replace(spec, mimo=replace(spec.mimo, swa=replace(spec.mimo.swa, window=None)))


def _no_bias(spec: Any) -> Any:
    import torch

    t = dict(spec.tensors)
    for k in [k for k in t if k.endswith("mlp.gate.e_score_correction_bias")]:
        t[k] = torch.zeros_like(t[k])
    return replace(spec, tensors=t)


# option -> (configured value, removed value, spec -> spec with it removed); a mimo2 target with routed experts
MIMO2_OPTIONS: dict[str, tuple[Callable[[Any], Any], Any, Callable[[Any], Any]]] = {
    "routed_scaling_factor": (lambda s: s.mimo.moe.routed_scale, 1.0, lambda s: _moe(s, routed_scale=1.0)),
    "norm_topk_prob": (lambda s: s.mimo.moe.norm_topk, False, lambda s: _moe(s, norm_topk=False)),
    "n_group/topk_group": (lambda s: f"{s.mimo.moe.n_group}/{s.mimo.moe.topk_group}", "1/1",
                           lambda s: _moe(s, n_group=1, topk_group=1)),
    "e_score_correction_bias": (lambda s: "trained", "zeros", _no_bias),
    "attention_value_scale": (lambda s: s.mimo.value_scale, 1.0,
                              lambda s: replace(s, mimo=replace(s.mimo, value_scale=1.0))),
    "sliding_window": (lambda s: s.mimo.swa.window, None, _windows_off),
}


def inert(spec: Any, ids: Sequence[int], options: dict[str, tuple[Callable, Any, Callable]],
          forward: Callable[[Any, Sequence[int]], Any]) -> list[Effect]:
    """Every option's effect on ``forward(spec, ids).logits`` (the family's float64 reference)."""
    import numpy as np

    base = np.asarray(forward(spec, ids).logits)
    scale = float(np.abs(base).max())
    out = []
    for name, (value, removed, remove) in options.items():
        got = np.asarray(forward(remove(spec), ids).logits)
        out.append(Effect(name, value(spec), removed, float(np.abs(got - base).max()) / scale))
    return out
