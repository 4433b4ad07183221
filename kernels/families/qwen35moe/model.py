"""Qwen3.5 / 3.6-MoE ("qwen35moe") on the device: the qwen38 hybrid engine (``kernels.families.qwen38.model``: Gated
DeltaNet and gated attention layers, state and rollback unchanged) whose FFNs are the MoE of ``spec.moe``
(``kernels.families.ffn.moe_ffn``: softmax top-k router, gather-based routed experts, sigmoid-gated shared expert).

Each pass keeps the chosen experts of every layer (``Qwen38Pass.routing``: layer index -> ``ops.moe.Routing`` over
the pass's rows, padding included) for the gates' tier-1 check.
"""

from __future__ import annotations

from ..ffn import record_routing
from ..qwen38.model import Qwen38Pass, Qwen38Target
from ..qwen38.model import forward_train as forward_train

__all__ = ["Qwen35MoeTarget", "forward_train"]


class Qwen35MoeTarget(Qwen38Target):
    """``Qwen38Target`` over a ``Qwen35MoeSpec`` (the FFN follows the spec); passes carry their routing."""

    def _run(self, ids: list[int], want_logits: bool, keep_rows: bool) -> Qwen38Pass:
        with record_routing() as rec:
            out = super()._run(ids, want_logits, keep_rows)
        out.routing = {int(p.split(".")[2]): r for p, r in rec}
        return out
