"""HF exports: the Qwen3 target (config.json + model.safetensors + tokenizer.json) and the DFlash draft
(z-lab layout). Tensors are written in bf16 under their canonical names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .tokenizer_train import EOT
from .train import DraftShape, TargetShape

TRANSFORMERS_VERSION = "4.56.0"   # the layout written matches this transformers release's Qwen3Config


def target_config(shape: TargetShape, eot_id: int = 0) -> dict:
    """config.json in the exact key layout transformers writes for Qwen3ForCausalLM."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "layer_types": ["full_attention"] * shape.num_layers,
        "max_position_embeddings": shape.max_position,
        "max_window_layers": shape.num_layers,
        "model_type": "qwen3",
        "num_attention_heads": shape.num_heads,
        "num_hidden_layers": shape.num_layers,
        "num_key_value_heads": shape.num_kv_heads,
        "rms_norm_eps": shape.rms_eps,
        "rope_scaling": None,
        "rope_theta": int(shape.rope_theta) if float(shape.rope_theta).is_integer() else shape.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": shape.vocab_size,
    }


def draft_config(shape: TargetShape, dshape: DraftShape, eot_id: int = 0) -> dict:
    """config.json in z-lab's DFlash layout (a Qwen3 config of the draft stack + dflash_config)."""
    cfg = target_config(shape, eot_id)
    cfg.update({
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": dshape.block_size,
        "dflash_config": {"mask_token_id": dshape.mask_token_id,
                          "target_layer_ids": list(dshape.target_layer_ids)},
        "layer_types": ["full_attention"] * dshape.num_layers,
        "max_window_layers": dshape.num_layers,
        "num_hidden_layers": dshape.num_layers,
        "num_target_layers": shape.num_layers,
        "tie_word_embeddings": False,
    })
    return cfg


def _json(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    out = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sorted(tensors.items())}
    save_file(out, str(path), metadata={"format": "pt"})


def write_target(out: Path, shape: TargetShape, params: Mapping[str, torch.Tensor], tokenizer_json: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(_json(target_config(shape)))
    (out / "generation_config.json").write_text(_json({
        "bos_token_id": 0, "eos_token_id": 0, "do_sample": False, "transformers_version": TRANSFORMERS_VERSION}))
    (out / "tokenizer_config.json").write_text(_json({
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": EOT,
        "pad_token": EOT, "model_max_length": shape.max_position, "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False}))
    (out / "tokenizer.json").write_text(tokenizer_json)
    write_safetensors(out / "model.safetensors", params)
    return [out / n for n in ("config.json", "generation_config.json", "model.safetensors",
                              "tokenizer.json", "tokenizer_config.json")]


def write_draft(out: Path, shape: TargetShape, dshape: DraftShape, dparams: Mapping[str, torch.Tensor]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(_json(draft_config(shape, dshape)))
    write_safetensors(out / "model.safetensors", dparams)
    return [out / "config.json", out / "model.safetensors"]


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
