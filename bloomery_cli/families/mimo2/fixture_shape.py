"""The tiny mimo2 (MiMo-V2-Flash) fixture's shape, its initial weights, and its config.json (MiMo's own keys and
transformers' both, agreeing, as ``formats.mimo2`` checks).

FAMILIES_MOE.md section 9.2's invariants are kept: head_dim != v_head_dim, a window below the prompt length, a dense
first layer, SWA layers with twice the kv heads and sinks, 3 MTP layers; routing wide enough to exercise the group
limit (E 8, top-2, n_group 2, topk_group 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bloomery_gates.spec import AttnShape, LayerShape, Mimo2Spec, MimoShape, MoEShape


@dataclass(frozen=True)
class Mimo2Shape:
    hidden_size: int = 64
    layer_types: tuple[str, ...] = ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    mlp_types: tuple[str, ...] = ("dense", "sparse", "sparse", "sparse")
    num_heads: int = 4
    num_kv_heads: int = 1
    head_dim: int = 32
    v_head_dim: int = 16
    intermediate_size: int = 192
    vocab_size: int = 4096
    window: int = 17                      # keys per SWA query counting itself (sliding_window_size 16)
    partial_rotary_factor: float = 0.334
    rope_theta: float = 5_000_000.0
    swa_rope_theta: float = 10_000.0
    value_scale: float = 0.707
    rms_eps: float = 1e-5
    n_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 64
    n_group: int = 2
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    max_position: int = 1024
    mtp_layers: int = 3
    extra: dict = field(default_factory=dict)

    def attn(self, swa: bool) -> AttnShape:
        rot = int(self.head_dim * self.partial_rotary_factor)
        return AttnShape(self.num_heads, self.num_kv_heads * (2 if swa else 1), self.head_dim, self.v_head_dim,
                         self.swa_rope_theta if swa else self.rope_theta, rot, self.window if swa else None, swa)

    def spec(self, params: Mapping[str, torch.Tensor], source: Path = Path("fixtures/mimo2-tiny"),
             mtp_layers: int | None = None) -> Mimo2Spec:
        layer = LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size, self.rms_eps, self.rope_theta)
        moe = MoEShape(num_experts=self.n_experts, top_k=self.top_k, expert_ff=self.moe_intermediate_size,
                       router="sigmoid", n_group=self.n_group, topk_group=self.topk_group, norm_topk=True,
                       routed_scale=self.routed_scaling_factor) if "sparse" in self.mlp_types else None
        m = MimoShape(self.layer_types, self.mlp_types, self.attn(False), self.attn(True), self.value_scale,
                      self.partial_rotary_factor, moe, self.mtp_layers if mtp_layers is None else mtp_layers)
        return Mimo2Spec(family="mimo2", source=source, source_format="hf", layer=layer,
                         num_layers=len(self.layer_types), vocab_size=self.vocab_size, tie_word_embeddings=False,
                         max_position=self.max_position, tensors=params, mimo=m)


def _attn_params(p: str, a: AttnShape, H: int, r) -> dict[str, torch.Tensor]:
    out = {p + "q_proj.weight": r(a.num_heads * a.head_dim, H),
           p + "k_proj.weight": r(a.num_kv_heads * a.head_dim, H),
           p + "v_proj.weight": r(a.num_kv_heads * a.v_head_dim, H),
           p + "o_proj.weight": r(H, a.num_heads * a.v_head_dim)}
    if a.sinks:
        out[p + "attention_sink_bias"] = torch.zeros(a.num_heads)
    return out


def _mlp_params(p: str, H: int, inter: int, r) -> dict[str, torch.Tensor]:
    return {p + "gate_proj.weight": r(inter, H), p + "up_proj.weight": r(inter, H), p + "down_proj.weight": r(H, inter)}


def init_mimo2(shape: Mimo2Shape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Checkpoint-named float32 CPU tensors of the trunk (norms 1, sinks 0, router bias 0)."""
    gen = torch.Generator().manual_seed(seed)
    H = shape.hidden_size

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen) * std

    p = {"model.embed_tokens.weight": r(shape.vocab_size, H), "model.norm.weight": torch.ones(H),
         "lm_head.weight": r(shape.vocab_size, H)}
    for i, kind in enumerate(shape.layer_types):
        b = f"model.layers.{i}."
        p.update({b + "input_layernorm.weight": torch.ones(H), b + "post_attention_layernorm.weight": torch.ones(H)})
        p.update(_attn_params(b + "self_attn.", shape.attn(kind == "sliding_attention"), H, r))
        if shape.mlp_types[i] == "dense":
            p.update(_mlp_params(b + "mlp.", H, shape.intermediate_size, r))
        else:
            p[b + "mlp.gate.weight"] = r(shape.n_experts, H) * 5
            p[b + "mlp.gate.e_score_correction_bias"] = torch.zeros(shape.n_experts)
            for e in range(shape.n_experts):
                p.update(_mlp_params(f"{b}mlp.experts.{e}.", H, shape.moe_intermediate_size, r))
    return p


def init_mtp(shape: Mimo2Shape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """The 3 MTP layers (checkpoint names model.mtp.layers.{k}.*): enorm, hnorm, eh_proj [H, 2H], an SWA decoder
    layer (input_layernorm, self_attn.*, pre_mlp_layernorm, dense mlp.*) and final_layernorm."""
    gen = torch.Generator().manual_seed(seed)
    H = shape.hidden_size

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen) * std

    p = {}
    for k in range(shape.mtp_layers):
        b = f"model.mtp.layers.{k}."
        p.update({b + "enorm.weight": torch.ones(H), b + "hnorm.weight": torch.ones(H),
                  b + "eh_proj.weight": r(H, 2 * H) * math.sqrt(2), b + "input_layernorm.weight": torch.ones(H),
                  b + "pre_mlp_layernorm.weight": torch.ones(H), b + "final_layernorm.weight": torch.ones(H)})
        p.update(_attn_params(b + "self_attn.", shape.attn(True), H, r))
        p.update(_mlp_params(b + "mlp.", H, shape.intermediate_size, r))
    return p


def hf_config(shape: Mimo2Shape, eot_id: int = 0) -> dict:
    """config.json: model_type mimo_v2_flash with MiMo's own keys (as XiaomiMiMo ships them) and transformers'
    spelling of the same numbers beside them (``MiMoV2FlashConfig`` reads only the latter)."""
    types, mlps = list(shape.layer_types), list(shape.mlp_types)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": shape.rope_theta,
                               "partial_rotary_factor": shape.partial_rotary_factor},
            "sliding_attention": {"rope_type": "default", "rope_theta": shape.swa_rope_theta,
                                  "partial_rotary_factor": shape.partial_rotary_factor}}
    return {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": None,
            "hidden_act": "silu", "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": len(types), "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim, "v_head_dim": shape.v_head_dim,
            "vocab_size": shape.vocab_size, "max_position_embeddings": shape.max_position,
            "tie_word_embeddings": False, "initializer_range": 0.02, "dtype": "bfloat16", "use_cache": True,
            "attention_value_scale": shape.value_scale,
            # transformers' spelling
            "layer_types": types, "mlp_layer_types": mlps, "sliding_window": shape.window,
            "rms_norm_eps": shape.rms_eps, "rope_parameters": rope,
            # MiMo's own spelling
            "hybrid_layer_pattern": [int(t == "sliding_attention") for t in types],
            "moe_layer_freq": [int(m == "sparse") for m in mlps], "sliding_window_size": shape.window - 1,
            "layernorm_epsilon": shape.rms_eps, "rope_theta": shape.rope_theta, "swa_rope_theta": shape.swa_rope_theta,
            "partial_rotary_factor": shape.partial_rotary_factor, "swa_num_attention_heads": shape.num_heads,
            "swa_num_key_value_heads": 2 * shape.num_kv_heads, "swa_head_dim": shape.head_dim,
            "swa_v_head_dim": shape.v_head_dim, "add_swa_attention_sink_bias": True,
            "add_full_attention_sink_bias": False,
            # routed experts
            "n_routed_experts": shape.n_experts, "num_experts_per_tok": shape.top_k,
            "moe_intermediate_size": shape.moe_intermediate_size, "n_group": shape.n_group,
            "topk_group": shape.topk_group, "norm_topk_prob": True,
            "routed_scaling_factor": shape.routed_scaling_factor,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_shared_experts": None,
            **shape.extra}
