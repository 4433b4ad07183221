"""Mixture-of-experts blocks in float64: routers, routed experts (exact eager loop), the shared expert.

Rows x [T, H]; E experts, k chosen per row; expert e's weights are stored fused, as HF saves them:
gate_up [E, 2I, H] (gate rows 0..I-1, then up rows), down [E, H, I].

Routers (``Routing``: ids [T, k] int64, weights [T, k] float64, ``choice`` [T, E]: the scores the choice is
made on). Every choice is ``topk_stable``: value descending, equal values by lower expert index (the stated
tie rule; the device's ``kernels.ops.moe`` applies the same rule, and the gates' tier-1 check runs these
functions on the device's own float32 scores, where they reproduce its choice exactly).

  softmax top-k (Qwen3.5/3.6-MoE, Qwen3-MoE with norm_topk_prob), l = x Wr^T [T, E]:
      ids = topk_stable(l, k)            (softmax is monotone: choosing on l is choosing on softmax(l))
      w_j = softmax(l)_{ids_j} / sum_i softmax(l)_{ids_i} = exp(l_{ids_j}) / sum_i exp(l_{ids_i})

  sigmoid + bias, group-limited (DeepSeek-V3 style: MiMo-V2, GLM-5, Nemotron-H), E split into G groups of E/G:
      s = sigmoid(l);  c = s + b                        b = e_score_correction_bias: the CHOICE only
      group score g_q = sum of the 2 largest c in group q;  keep the ``topk_group`` best groups (topk_stable)
      ids = topk_stable(c with experts of the other groups at -inf, k)
      w_j = s_{ids_j} (unbiased);  if norm: w_j /= (sum_i w_i + 1e-20);  w_j *= routed_scaling_factor

Routed experts (SwiGLU per expert, each stored op output rounded by ``st``):
      y_tj = down_e ( st(silu(x_t G_e^T)) * (x_t U_e^T) ),  e = ids_tj;    out_t = st( sum_j w_tj y_tj )

Shared expert: s_t = swiglu(x_t), scaled by sigmoid(x_t Wsg^T) (Wsg [1, H], Qwen's shared_expert_gate) or not.
The router logits are float32 on the device (not stored in the run dtype), so no ``st`` is applied to them.

Pinned choices (``pinned``, the gates' teacher-forced choice; CONTRACT.md "Routing flips on the layer lines"):
inside ``pinned({key: ids})`` each discrete choice of the block named ``key`` records its scores [T, n] and its own
ids [T, k] on the ``Pin`` and continues with the pinned ids instead (a router's weights recomputed from its own
scores at those ids); a key not pinned only records. Every ranking router here (softmax_topk, sigmoid_group_topk,
``router_v4.sqrtsoftplus_topk``) goes through ``chosen`` under the key ``ROUTER`` (one router per block); other
choices name their own key (V4.1's stream top-k: ``reference.ops.v4_attention.indexer_choice``'s ``key``).

A whole forward under ``pinned(pins, layered=True)`` (the state after the loop: ``gates.routing_flips.state_choices``)
keys each choice by (key, l), l the layer the forward runs it in (``at_layer``, set by each family's ``forward``), so
one pin covers every layer's router.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..rounding import linear, st
from ..xp import common, ns
from .mlp import swiglu

NEG = -np.inf


@dataclass
class Routing:
    """ids [T, k] int64 (the chosen experts, in choice order), weights [T, k], choice [T, E] (what was ranked)."""

    ids: np.ndarray
    weights: np.ndarray
    choice: np.ndarray


ROUTER = "router"


@dataclass
class Pin:
    """Pinned choices: ``pins`` key -> ids [T, k] to continue with; ``seen`` key -> (scores [T, n], own ids [T, k])
    of each choice the block made."""

    pins: dict[Any, np.ndarray] = field(default_factory=dict)
    seen: dict[Any, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    rules: dict[Any, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)   # a choice's own rule
    layered: bool = False                     # keys are (key, layer): a whole forward


_PIN: ContextVar[Pin | None] = ContextVar("bloomery_reference_pinned_choices", default=None)
_LAYER: ContextVar[int | None] = ContextVar("bloomery_reference_layer", default=None)


@contextmanager
def pinned(pins: dict | None = None, layered: bool = False) -> Iterator[Pin]:
    """Within the block each named choice continues with ``pins[key]`` (where given) and records on the Pin;
    ``layered``: the keys are (key, layer) (module docstring)."""
    token = _PIN.set(Pin(dict(pins or {}), layered=layered))
    try:
        yield _PIN.get()
    finally:
        _PIN.reset(token)


@contextmanager
def at_layer(l: int) -> Iterator[None]:
    """The choices made inside are layer l's (a forward's layer loop; a ``layered`` pin keys them by it)."""
    token = _LAYER.set(l)
    try:
        yield
    finally:
        _LAYER.reset(token)


def chosen(scores: np.ndarray, ids: np.ndarray, key: str = ROUTER,
           rule: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """The ids a choice continues with: its own ``ids`` [T, k] chosen on ``scores`` [T, n], or inside ``pinned`` the
    pinned ones for ``key`` (recording both, and ``rule``: scores -> ids, where the choice is not a plain top-k,
    for ``bands.routing_flip_excused``). A key made twice inside one block raises (a pin covers one choice)."""
    pin = _PIN.get()
    if pin is None:
        return ids
    if pin.layered:
        key = (key, _LAYER.get())
    if key in pin.seen:
        raise ValueError(f"the choice {key!r} was made twice inside one pinned block")
    pin.seen[key] = (scores, ids)
    if rule is not None:
        pin.rules[key] = rule
    if key not in pin.pins:
        return ids
    forced = ns(ids).asarray(pin.pins[key]).astype(np.int64)
    if forced.shape != ids.shape or int(forced.max(initial=-1)) >= scores.shape[-1]:
        raise ValueError(f"pinned ids {tuple(forced.shape)} for the choice {key!r} of {tuple(ids.shape)} over "
                         f"{scores.shape[-1]} entries")
    return forced


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in the tanh form (no overflow)."""
    return 0.5 * (1.0 + ns(x).tanh(0.5 * x))


def topk_stable(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' indices along the last axis: value descending, equal values by lower index.
    x [..., n] -> [..., k] int64. Exact in x's own dtype (only comparisons)."""
    if not 0 < k <= x.shape[-1]:
        raise ValueError(f"top-{k} of {x.shape[-1]} entries")
    return ns(x).argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int64)


def router_logits(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """l = x Wr^T: x [T, H], Wr [E, H] -> [T, E] (float32 on the device, so not rounded to the run dtype)."""
    _, x, w = common(x, w)
    return x @ w.T


def softmax_topk(logits: np.ndarray, k: int) -> Routing:
    """Softmax over all experts, top-k, renormalised (see the module docstring); logits [T, E]."""
    xp = ns(logits)
    ids = chosen(logits, topk_stable(logits, k))
    top = xp.take_along_axis(logits, ids, axis=-1).astype(np.float64)
    e = xp.exp(top - top.max(axis=-1, keepdims=True))
    return Routing(ids, e / e.sum(axis=-1, keepdims=True), logits)


def group_limited_choice(choice: np.ndarray, k: int, n_group: int, topk_group: int) -> np.ndarray:
    """ids [T, k] from choice scores c [T, E]: keep the ``topk_group`` groups with the largest sum of their 2 best
    scores, then top-k over the kept experts. Computed in c's own dtype (float32 for the tier-1 transcription of
    the device's rule: its pair sums are the same correctly rounded float32 additions)."""
    xp = ns(choice)
    t, e = choice.shape
    if e % n_group:
        raise ValueError(f"{e} experts do not split into {n_group} groups")
    per = e // n_group
    if not 0 < topk_group <= n_group or k > topk_group * per:
        raise ValueError(f"top-{k} from {topk_group} of {n_group} groups of {per} experts")
    grouped = choice.reshape(t, n_group, per)
    if per >= 2:
        top2 = xp.take_along_axis(grouped, topk_stable(grouped, 2), axis=-1)
        gscore = top2[..., 0] + top2[..., 1]
    else:
        gscore = grouped[..., 0]
    keep = xp.zeros((t, n_group), dtype=bool)
    keep[xp.arange(t)[:, None], topk_stable(gscore, topk_group)] = True
    masked = xp.where(xp.repeat(keep, per, axis=-1), choice, xp.asarray(NEG, dtype=choice.dtype))
    return topk_stable(masked, k)


def sigmoid_group_topk(logits: np.ndarray, bias: np.ndarray, k: int, n_group: int = 1, topk_group: int = 1,
                       norm: bool = True, scale: float = 1.0) -> Routing:
    """Sigmoid scores, bias for the choice only, group-limited top-k, renormalised, scaled (module docstring)."""
    xp, logits, bias = common(logits, bias)
    s = sigmoid(logits)
    c = s + bias
    ids = chosen(c, group_limited_choice(c, k, n_group, topk_group),
                 rule=lambda x: group_limited_choice(x, k, n_group, topk_group))
    w = xp.take_along_axis(s, ids, axis=-1)
    if norm:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    return Routing(ids, w * scale, c)


def expert_ffn(x: np.ndarray, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """One expert on rows x [n, H]: gate_up [2I, H], down [H, I] -> [n, H] (SwiGLU, stored outputs rounded)."""
    i = down.shape[-1]
    return swiglu(x, gate_up[:i], gate_up[i:], down)


def routed_experts(x: np.ndarray, routing: Routing, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """The eager loop: out_t = st(sum_j w_tj expert_{ids_tj}(x_t)). x [T, H], gate_up [E, 2I, H], down [E, H, I]."""
    xp, x, ids, weights = common(x, routing.ids, routing.weights)
    t, k = ids.shape
    acc = xp.zeros((t, x.shape[-1]))
    for e in (int(e) for e in xp.unique(ids)):
        rows, slots = xp.nonzero(ids == e)
        acc[rows] += weights[rows, slots, None] * expert_ffn(x[rows], gate_up[e], down[e])
    return st(acc)


def shared_expert(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
                  gate: np.ndarray | None) -> np.ndarray:
    """swiglu(x) [T, H], times st(sigmoid(x Wsg^T)) [T, 1] when ``gate`` Wsg [1, H] is given (Qwen), else plain."""
    y = swiglu(x, w_gate, w_up, w_down)
    if gate is None:
        return y
    return st(y * st(sigmoid(linear(x, gate))))


def moe_block(x: np.ndarray, routing: Routing, gate_up: np.ndarray, down: np.ndarray,
              shared: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None) -> np.ndarray:
    """routed_experts(x) + shared_expert(x) (when ``shared`` = (Wg, Wu, Wd, gate or None)), stored: [T, H]."""
    out = routed_experts(x, routing, gate_up, down)
    return out if shared is None else st(out + shared_expert(x, *shared))
