"""The shape table of the V4 MTP block (``mtp.0.*``, the names ``reader_mtp`` and ``reader_mtp_gguf`` hand out)."""

from __future__ import annotations

from typing import Any

from bloomery_gates.spec import Deepseek4Spec

from .reader import tensor_shapes

P = "mtp.0."


def block_shapes(target: Deepseek4Spec) -> dict[str, Any]:
    """The shape table of the mtp.0.* tensors, from the trunk's table of a sliding, non-hash layer."""
    fields = {"layer": target.layer, "attn": target.attn, "hc": target.hc, "moe": target.moe, "num_layers": 1,
              "layer_types": ("sliding",), "mlp_types": ("moe",)}
    one = tensor_shapes(fields, target.vocab_size, True)
    H, S = target.hidden_size, target.hc.count
    out = {P + n[len("model.layers.0."):]: (shape, why.replace("layer 0", "the MTP block"))
           for n, (shape, why) in one.items() if n.startswith("model.layers.0.")}
    out |= {P + n: ((H,), "[hidden_size]") for n in ("enorm.weight", "hnorm.weight", "norm.weight",
                                                    "input_layernorm.weight", "post_attention_layernorm.weight")}
    out |= {P + "e_proj.weight": ((H, H), "[hidden_size, hidden_size] (eh_proj's embedding half)"),
            P + "h_proj.weight": ((H, H), "[hidden_size, hidden_size] (eh_proj's hidden half)"),
            P + "hc_head.hc_fn": ((S, S * H), "[hc_mult, hc_mult*hidden_size]"),
            P + "hc_head.hc_base": ((S,), "[hc_mult]"), P + "hc_head.hc_scale": ((1,), "[1]")}
    hc = (2 + S) * S
    for m in ("attn_hc.", "ffn_hc."):
        out |= {P + m + "base": ((hc,), "[(2+hc_mult)*hc_mult]"), P + m + "scale": ((3,), "[3]")}
    sh, ff = P + "mlp.shared_experts.", target.moe.shared_ff or target.moe.expert_ff
    out |= {sh + "gate_proj.weight": ((ff, H), "[moe_intermediate_size, hidden_size]"),
            sh + "up_proj.weight": ((ff, H), "[moe_intermediate_size, hidden_size]"),
            sh + "down_proj.weight": ((H, ff), "[hidden_size, moe_intermediate_size]")}
    return out
