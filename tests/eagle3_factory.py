"""Tiny random EAGLE-3 drafters (in memory and as speculators-layout directories) for the tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from bloomery_gates.spec import Eagle3Spec, LayerShape, ModelSpec


def make_eagle3(target: ModelSpec, seed: int = 5, qk_norm: bool = True, draft_vocab: int | None = None,
                aux: tuple[int, ...] = (1, 2, 3), width: int = 3, norm_before_residual: bool = False,
                norm_output: bool = False, llama_head_dim: int | None = None) -> Eagle3Spec:
    """Random weights of the target's layer shape (a Llama layer may pick another head_dim); ``draft_vocab``
    < V picks every other target id from 1 (d2t offsets)."""
    gen = torch.Generator().manual_seed(seed)
    s = target.layer if llama_head_dim is None else replace(target.layer, head_dim=llama_head_dim)
    h, d, i, V = s.hidden_size, s.head_dim, s.intermediate_size, target.vocab_size
    vd = V if draft_vocab is None else draft_vocab

    def r(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    a = "layers.0.self_attn."
    t = {"fc.weight": r(h, len(aux) * h, scale=0.05), "layers.0.hidden_norm.weight": norm(h),
         "layers.0.input_layernorm.weight": norm(h), "layers.0.post_attention_layernorm.weight": norm(h),
         a + "q_proj.weight": r(s.num_heads * d, 2 * h), a + "k_proj.weight": r(s.num_kv_heads * d, 2 * h),
         a + "v_proj.weight": r(s.num_kv_heads * d, 2 * h), a + "o_proj.weight": r(h, s.num_heads * d),
         "layers.0.mlp.gate_proj.weight": r(i, h), "layers.0.mlp.up_proj.weight": r(i, h),
         "layers.0.mlp.down_proj.weight": r(h, i), "norm.weight": norm(h), "lm_head.weight": r(vd, h, scale=0.3)}
    if qk_norm:
        t[a + "q_norm.weight"] = norm(d)
        t[a + "k_norm.weight"] = norm(d)
    d2t = None
    if vd != V:
        chosen = torch.arange(1, V, 2)[:vd] if vd <= (V - 1) // 2 else torch.arange(vd)
        d2t = chosen - torch.arange(vd)
    return Eagle3Spec("eagle3", Path("memory"), s, qk_norm, tuple(aux), vd, V, norm_before_residual, norm_output,
                      width, t, d2t)


def eagle3_config(d: Eagle3Spec, target: ModelSpec, **top) -> dict:
    """config.json as speculators' Eagle3SpeculatorConfig.save_pretrained writes it."""
    s: LayerShape = d.layer
    tl = {"model_type": "qwen3" if d.qk_norm else "llama", "hidden_size": s.hidden_size,
          "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
          "intermediate_size": s.intermediate_size, "num_hidden_layers": 1, "vocab_size": target.vocab_size,
          "rms_norm_eps": s.rms_eps, "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
          "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 4096,
          "layer_types": ["full_attention"], "use_sliding_window": False, "tie_word_embeddings": True}
    cfg = {"architectures": ["Eagle3Speculator"], "auto_map": {"": "config.Eagle3SpeculatorConfig"},
           "speculators_model_type": "eagle3", "draft_vocab_size": d.draft_vocab_size,
           "eagle_aux_hidden_state_layer_ids": list(d.aux_layer_ids), "norm_before_residual": d.norm_before_residual,
           "norm_output": d.norm_output, "norm_before_fc": False, "fc_norm": False, "embed_requires_grad": False,
           "target_hidden_size": None, "transformer_layer_config": tl,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens":
                                                        d.speculative_tokens, "accept_tolerance": 0.0,
                                                        "verifier_accept_k": 1}],
                                  "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": None}}}
    cfg.update(top)
    return cfg


def write_eagle3(d: Eagle3Spec, target: ModelSpec, directory: Path, config: dict | None = None,
                 drop: tuple[str, ...] = (), extra: dict | None = None, t2d: bool = True) -> Path:
    """A speculators-layout directory: config.json + model.safetensors (d2t int64, t2d bool when mapped)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in d.tensors.items()}
    if d.d2t is not None:
        tensors["d2t"] = d.d2t.long().contiguous()
        if t2d:
            mark = torch.zeros(target.vocab_size, dtype=torch.bool)
            mark[d.target_ids()] = True
            tensors["t2d"] = mark
    tensors.update(extra or {})
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config or eagle3_config(d, target)))
    return directory
