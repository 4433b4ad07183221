"""Tier-3 oracle for the glm5next trunk: transformers' own ``Glm5NextTextModel`` (the text model; HF has no
``*ForCausalLM`` for glm5_next, docs/FAMILIES_MOE.md 2.1) plus the spec's own head, on the spec's weights, CPU
float64, eager attention and eager experts. Built from the spec's numbers, never from a hub name; the NextN blocks
(``layers.{n + j}``) are left out, as HF's own loader ignores them.

``lift`` (default True) builds and runs it under ``oracle.Float32AsFloat64``, so its float32 islands (section 2.2:
the RMSNorms, the mHC mixes, the router, the KDA kernel, the indexer scores, the softmax) run in float64 too: a true
float64 forward. With ``lift=False`` it runs as transformers ships it: a ``.to(float64)`` model whose islands compute
in float32, about 1e-7 relative from a true float64 forward (section 2.2 measured 4.4e-8 on logits of 0.54).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import Glm5NextSpec

from ...oracle.hf import Float32AsFloat64, _transformers


def hf_config(spec: Glm5NextSpec) -> Any:
    """transformers' ``Glm5NextTextConfig`` carrying the spec's numbers (eager attention and experts)."""
    tf = _transformers()
    ls, mla, d, k, m = spec.layer, spec.mla, spec.dsa, spec.kda, spec.moe
    config = tf.Glm5NextTextConfig(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, intermediate_size=ls.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=ls.num_heads, num_key_value_heads=ls.num_heads,
        rms_norm_eps=ls.rms_eps, max_position_embeddings=spec.max_position, hidden_act="silu", pad_token_id=0,
        tie_word_embeddings=spec.tie_word_embeddings, layer_types=list(spec.layer_types),
        mlp_layer_types=list(spec.mlp_types), q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
        qk_nope_head_dim=mla.qk_nope_head_dim, v_head_dim=mla.v_head_dim, qk_rope_head_dim=0,
        index_topk=d.topk, index_head_dim=d.head_dim, index_n_heads=d.num_heads, index_kpool=d.kpool,
        index_kpool_always_select_tail=d.select_tail, indexer_types=[t or "full" for t in d.types],
        linear_head_dim=k.head_dim, linear_num_heads=k.num_heads, linear_conv_kernel_dim=k.conv_kernel,
        linear_lower_bound=k.lower_bound, n_routed_experts=m.num_experts, num_experts_per_tok=m.top_k,
        n_shared_experts=(m.shared_ff or 0) // m.expert_ff, moe_intermediate_size=m.expert_ff,
        routed_scaling_factor=m.routed_scale, n_group=m.n_group, topk_group=m.topk_group,
        norm_topk_prob=m.norm_topk, swiglu_limit=spec.swiglu_limit, hc_mult=spec.hc.count,
        hc_sinkhorn_iters=spec.hc.sinkhorn_iters, hc_eps=spec.hc.eps, num_nextn_predict_layers=0)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def build_hf_glm5next(spec: Glm5NextSpec, lift: bool = True) -> torch.nn.Module:
    """A float64 ``Glm5NextTextModel`` carrying the trunk, loaded strictly (every module tensor present, nothing
    unexpected); the spec's tensors under ``model.`` / ``model.language_model.`` renamed to the text model's."""
    if spec.family != "glm5next":               # HF checkpoints, and GGUFs (their reader renames to HF's names)
        raise InputError(spec.source, "the HF glm5next oracle covers glm5next checkpoints only")
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in spec.tensors else "model."
    trunk = tuple(f"layers.{i}." for i in range(spec.num_layers))
    state = {}
    for name, t in spec.tensors.items():
        if not name.startswith(pre):
            continue
        rest = name[len(pre):]
        if rest.startswith("layers.") and not rest.startswith(trunk):
            continue                                                  # a NextN block: not part of the text model
        state[rest] = t.detach().to(torch.float64)
    tf = _transformers()
    with Float32AsFloat64() if lift else contextlib.nullcontext():
        model = tf.Glm5NextTextModel(hf_config(spec)).to(torch.float64).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(spec.source, f"HF Glm5NextTextModel state dict mismatch: missing {sorted(missing)}, "
                                      f"unexpected {sorted(unexpected)}")
    return model


def hf_glm5next_taps(spec: Glm5NextSpec, ids: Sequence[int], lift: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """transformers' float64 (final [T, H], logits [T, V]) over ids (positions 0..T-1, no cache): final is the
    text model's last hidden state, norm(mean of the streams); logits = final head^T with the spec's head."""
    model = build_hf_glm5next(spec, lift)
    head = spec.tensors[("model.language_model.embed_tokens.weight" if "model.language_model.embed_tokens.weight"
                         in spec.tensors else "model.embed_tokens.weight") if spec.tie_word_embeddings
                        else "lm_head.weight"].detach().to(torch.float64)
    with torch.no_grad(), Float32AsFloat64() if lift else contextlib.nullcontext():
        final = model(input_ids=torch.tensor([list(ids)]), use_cache=False).last_hidden_state[0]
        logits = final @ head.T
    return final.numpy(), logits.numpy()


def hf_glm5next_logits(spec: Glm5NextSpec, ids: Sequence[int]) -> np.ndarray:
    """transformers' true-float64 logits [T, V] over ids (the registry's oracle role)."""
    return hf_glm5next_taps(spec, ids)[1]
