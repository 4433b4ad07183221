"""GLM-5.3's clamped SwiGLU, in float64 (docs/FAMILIES_MOE.md section 4.3 "Experts": ``gate.clamp(max=10)`` and
``up.clamp(+-10)``; ``swiglu_limit`` 10, GGUF ``swiglu_clamp_exp`` / ``swiglu_clamp_shexp``). The routed experts, the
shared expert and the dense MLPs all clamp:

    g = min(x Wg^T, L)            the gate is clamped from above only (silu is bounded below by -0.28)
    u = clip(x Wu^T, -L, L)       the up projection on both sides
    y = ( silu(g) * u ) Wd^T      x [T, H], Wg / Wu [I, H], Wd [H, I]; L = swiglu_limit

Routed experts as ``reference.ops.moe`` (fused gate_up [E, 2I, H], down [E, H, I]; out_t = st(sum_j w_tj y_tj)),
with the clamp inside each expert. Storage points (``st``, as ``kernels.ops.swiglu_clamp`` stores them): the two
projections, the clamped values (the limit rounded to the run dtype, as torch's clamp on a bf16 tensor gives it),
silu(g), the product, the down projection, the weighted sum.
"""

from __future__ import annotations

import numpy as np

from ..rounding import linear, st
from ..xp import common
from .mlp import silu
from .moe import Routing


def clamp_act(g: np.ndarray, u: np.ndarray, limit: float) -> np.ndarray:
    """silu(min(g, L)) * clip(u, -L, L): g, u [..., I] -> [..., I]."""
    xp, g, u = common(g, u)
    return st(st(silu(st(xp.minimum(g, limit)))) * st(xp.clip(u, -limit, limit)))


def swiglu_clamped(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
                   limit: float) -> np.ndarray:
    """x [T, H], w_gate / w_up [I, H], w_down [H, I] -> [T, H] (module docstring)."""
    return linear(clamp_act(linear(x, w_gate), linear(x, w_up), limit), w_down)


def routed_experts_clamped(x: np.ndarray, routing: Routing, gate_up: np.ndarray, down: np.ndarray,
                           limit: float) -> np.ndarray:
    """out_t = st(sum_j w_tj swiglu_clamped_{ids_tj}(x_t)): x [T, H], gate_up [E, 2I, H], down [E, H, I] -> [T, H]."""
    xp, x, ids, weights = common(x, routing.ids, routing.weights)
    i = down.shape[-1]
    acc = xp.zeros(x.shape)
    for e in (int(e) for e in xp.unique(ids)):
        rows, slots = xp.nonzero(ids == e)
        y = swiglu_clamped(x[rows], gate_up[e][:i], gate_up[e][i:], down[e], limit)
        acc[rows] += weights[rows, slots, None] * y
    return st(acc)
