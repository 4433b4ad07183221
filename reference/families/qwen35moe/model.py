"""Qwen3.5 / 3.6-MoE ("qwen35moe"), float64 host reference: the qwen38 hybrid
(``reference.families.qwen38.model``, whose docstring has the layer math) with every FFN the MoE of ``spec.moe``
(``reference.families.ffn.moe_ffn``):

    h = h + moe(n1(h, post_attention_layernorm))
    moe(a) = sum_j w_j expert_{e_j}(a) + sigmoid(a Wsg^T) shared(a)        e, w: softmax top-k, renormalised

The routing is the reference's own (its float64 logits); the KV rows and recurrent state do not depend on the FFN
kind and are qwen38's.
"""

from __future__ import annotations

from ..qwen38.model import RefOut, forward, hf_hidden_states, kv_rows, recurrent_state, reference_layer

__all__ = ["RefOut", "forward", "hf_hidden_states", "kv_rows", "recurrent_state", "reference_layer"]
