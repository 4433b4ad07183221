"""Tier-3 oracle for qwen35moe targets: transformers' own ``Qwen3_5MoeForCausalLM`` on the spec's weights, CPU,
float64, routed experts on HF's eager path (``experts_implementation="eager"``: the default grouped_mm refuses
float64), built and run under ``oracle.Float32AsFloat64`` so that its float32 islands (norms, router softmax, the
DeltaNet, rotary) compute in float64 too: a truly float64 forward of HF's own wiring (FAMILIES_MOE.md 2.2)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bloomery_gates.spec import ModelSpec

from ...oracle.hf import Float32AsFloat64, HFOut, _transformers, build_hf_model, hybrid_config_keys


def qwen35moe_hf_config(spec: ModelSpec) -> Any:
    """``Qwen3_5MoeTextConfig`` carrying the spec's numbers (eager attention and experts)."""
    tf = _transformers()
    moe = spec.moe
    config = tf.Qwen3_5MoeTextConfig(
        **hybrid_config_keys(spec), num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
        moe_intermediate_size=moe.expert_ff,
        shared_expert_intermediate_size=moe.shared_ff or 0,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def build_hf_qwen35moe(spec: ModelSpec, promote_f32: bool = True) -> torch.nn.Module:
    """A float64 ``Qwen3_5MoeForCausalLM`` carrying the spec's trunk weights (``mtp.*`` left out, as HF's loader)."""
    return build_hf_model(spec, "Qwen3_5MoeForCausalLM", qwen35moe_hf_config(spec), "qwen35moe",
                          promote_f32=promote_f32)


def hf_qwen35moe(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> HFOut:
    """HF's logits and hidden_states for one sequence (positions 0..T-1, no cache)."""
    model = build_hf_qwen35moe(spec, promote_f32)
    with torch.no_grad(), Float32AsFloat64() if promote_f32 else contextlib.nullcontext():
        out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)
    return HFOut(logits=out.logits[0].numpy(), hidden_states=torch.stack([h[0] for h in out.hidden_states]).numpy())


def hf_qwen35moe_logits(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> np.ndarray:
    return hf_qwen35moe(spec, ids, promote_f32).logits
