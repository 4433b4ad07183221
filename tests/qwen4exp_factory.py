"""A tiny random qwen4exp (Qwen3.8-Flash-Next) HF checkpoint made by transformers' own ``Qwen4ExpForCausalLM``
(docs/FAMILIES_MOE.md 4.5 "Tiny config"): H 64, 4 layers [lin, lin, lin, indexed], 8 experts top-2, HC 4 x rank 16,
PLE on layer 1 (1-based), QSA 2 heads x 16, budget 4, ratio 2. Every float tensor is redrawn (HF's init leaves the
zero-centred norms and the router at zero, which would make the routing a tie), then written as config.json +
model.safetensors and read back by the family's reader, so tests run on a spec the loaders produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bloomery_cli.families.qwen4exp.reader import qwen4exp_from_hf
from bloomery_gates.spec import Qwen4ExpSpec

V = 300
CONFIG: dict[str, Any] = {
    "model_type": "qwen4_exp", "vocab_size": V, "hidden_size": 64, "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "norm_topk_prob": True, "hc_count": 4, "hc_lowrank": 16,
    "ple_layer_ids": [1], "ple_embed_dim": 32, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 2,
    "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234, "split_ngram_parts": 1,
    "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 4,
    "indexer_compress_ratio": 2, "output_gate_type": "sigmoid", "eos_token_id": 1, "hidden_act": "silu"}
HASH_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")


def redraw(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A fresh random value for one HF parameter: O(1) activations through every block."""
    leaf = name.rsplit(".", 2)
    if name.endswith("A_log"):
        return torch.log(torch.rand(t.shape, generator=g) * 15 + 1)
    if name.endswith("dt_bias"):
        return 1 + 0.3 * torch.randn(t.shape, generator=g)
    if name.endswith("linear_attn.norm.weight"):
        return 1 + 0.2 * torch.randn(t.shape, generator=g)
    if t.ndim == 1:                                               # zero-centred norms: gain 1 + w
        return 0.2 * torch.randn(t.shape, generator=g)
    if "embed_tokens" in name or "ngram_embedding" in name:
        return torch.randn(t.shape, generator=g)
    if leaf[-1] == "weight" and "conv1d" in name:
        return torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5
    scale = 1.5 if name.endswith("mlp.gate.weight") else 1.0      # the router: clear top-k margins
    return scale * torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5


def write_qwen4exp(d: Path, seed: int = 0, tables: bool = False, **over: Any) -> Path:
    """config.json + model.safetensors of a random tiny ``Qwen4ExpForCausalLM`` (``over``: config keys changed), as
    the PLE hashing tables (HF's persistent int64 buffers, which ``save_pretrained`` would write) only with ``tables``:
    the reader refuses I64 tensors today (a gap for a real HF checkpoint that carries them)."""
    import transformers

    cfg = {**CONFIG, **over}
    text = {k: v for k, v in cfg.items() if k != "model_type"}
    model = transformers.Qwen4ExpForCausalLM(transformers.Qwen4ExpTextConfig(**text))
    g = torch.Generator().manual_seed(seed)
    state = {n: (redraw(n, t, g).to(torch.float32) if t.is_floating_point() else t).contiguous()
             for n, t in model.state_dict().items()
             if (tables or n.rsplit(".", 1)[-1] not in HASH_BUFFERS)
             and not (cfg["tie_word_embeddings"] and n == "lm_head.weight")}
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(d / "model.safetensors"))
    return d


def make_qwen4exp(d: Path, seed: int = 0, tables: bool = False, **over: Any) -> Qwen4ExpSpec:
    return qwen4exp_from_hf(write_qwen4exp(d, seed, tables, **over))


def mtp_tensors(spec: Qwen4ExpSpec, seed: int = 7) -> dict[str, torch.Tensor]:
    """Random ``mtp.*`` tensors of the HF MTP layout for ``spec`` (shapes from the family's reader), drawn as
    ``redraw`` draws the trunk's."""
    from bloomery_cli.families.qwen4exp.reader_mtp_hf import mtp_shapes

    g = torch.Generator().manual_seed(seed)
    return {n: redraw(n, torch.empty(shape), g).contiguous() for n, (shape, _) in mtp_shapes(spec).items()}


def make_qwen4exp_mtp(d: Path, seed: int = 0, **over: Any) -> Qwen4ExpSpec:
    """``make_qwen4exp`` with random ``mtp.*`` tensors added to model.safetensors (the HF MTP layout)."""
    from safetensors.torch import load_file

    write_qwen4exp(d, seed, **over)
    spec = qwen4exp_from_hf(d)
    state = load_file(str(d / "model.safetensors"))
    save_file({**state, **mtp_tensors(spec, seed + 7)}, str(d / "model.safetensors"))
    return qwen4exp_from_hf(d)
