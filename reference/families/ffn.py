"""The FFN slot of a decoder layer, pluggable per family, float64 (mirror of ``kernels.families.ffn``).

``ffn_for(spec)(spec, w, p, a)``: normed rows a [T, H] -> [T, H]; ``p`` the layer prefix, tensors under p + "mlp.":
  dense: swiglu(a; mlp.{gate,up,down}_proj)
  MoE (spec.moe): moe_block(a) = routed experts (router mlp.gate.weight, + mlp.gate.e_score_correction_bias for the
      sigmoid router) + the shared expert (mlp.shared_expert.*, gated by mlp.shared_expert_gate when the shape says)
The routing is the reference's own, on its own float64 logits (``reference.ops.moe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from bloomery_gates.spec import MoEShape

from ..ops import moe as rmoe
from ..ops.mlp import swiglu

FFN = Callable[[object, Mapping[str, np.ndarray], str, np.ndarray], np.ndarray]


def dense_ffn(spec, w: Mapping[str, np.ndarray], p: str, a: np.ndarray) -> np.ndarray:
    m = p + "mlp."
    return swiglu(a, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])


def route(moe: MoEShape, w: Mapping[str, np.ndarray], m: str, x: np.ndarray) -> rmoe.Routing:
    """The router of ``moe`` on rows x [T, H] (tensors under ``m`` = p + "mlp.")."""
    logits = rmoe.router_logits(x, w[m + "gate.weight"])
    if moe.router == "softmax":
        return rmoe.softmax_topk(logits, moe.top_k)
    return rmoe.sigmoid_group_topk(logits, w[m + "gate.e_score_correction_bias"], moe.top_k, moe.n_group,
                                   moe.topk_group, moe.norm_topk, moe.routed_scale)


def moe_ffn(spec, w: Mapping[str, np.ndarray], p: str, a: np.ndarray) -> np.ndarray:
    moe: MoEShape = spec.moe
    m = p + "mlp."
    shared = None
    if moe.shared_ff is not None:
        s = m + "shared_expert."
        shared = (w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"],
                  w[m + "shared_expert_gate.weight"] if moe.shared_gated else None)
    return rmoe.moe_block(a, route(moe, w, m, a), w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"], shared)


def ffn_for(spec) -> FFN:
    """MoE when the spec carries ``moe``, else dense SwiGLU."""
    return dense_ffn if getattr(spec, "moe", None) is None else moe_ffn
