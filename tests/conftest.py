"""Shared test factories: tiny random qwen3 targets and DFlash drafts built in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bloomery_gates.spec import DFlashSpec, LayerShape, ModelSpec


def random_layer(t: dict, prefix: str, s: LayerShape, gen: torch.Generator, scale: float = 0.08) -> None:
    def r(*shape):
        return torch.randn(*shape, generator=gen) * scale

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    h, d, i = s.hidden_size, s.head_dim, s.intermediate_size
    t[prefix + "input_layernorm.weight"] = norm(h)
    t[prefix + "post_attention_layernorm.weight"] = norm(h)
    t[prefix + "self_attn.q_proj.weight"] = r(s.num_heads * d, h)
    t[prefix + "self_attn.k_proj.weight"] = r(s.num_kv_heads * d, h)
    t[prefix + "self_attn.v_proj.weight"] = r(s.num_kv_heads * d, h)
    t[prefix + "self_attn.o_proj.weight"] = r(h, s.num_heads * d)
    t[prefix + "self_attn.q_norm.weight"] = norm(d)
    t[prefix + "self_attn.k_norm.weight"] = norm(d)
    t[prefix + "mlp.gate_proj.weight"] = r(i, h)
    t[prefix + "mlp.up_proj.weight"] = r(i, h)
    t[prefix + "mlp.down_proj.weight"] = r(h, i)


def make_target(seed: int = 0, layers: int = 3, vocab: int = 101, hidden: int = 32) -> ModelSpec:
    gen = torch.Generator().manual_seed(seed)
    shape = LayerShape(hidden, 4, 2, 8, 2 * hidden, 1e-6, 10000.0)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
                                  "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        random_layer(t, f"model.layers.{i}.", shape, gen)
    return ModelSpec("qwen3", Path("memory"), "hf", shape, layers, vocab, True, 4096, t)


def make_dflash(target: ModelSpec, seed: int = 1, layers: int = 1, block: int = 4,
                layer_ids: tuple[int, ...] = (0, 1)) -> DFlashSpec:
    gen = torch.Generator().manual_seed(seed)
    s, h = target.layer, target.hidden_size
    t: dict[str, torch.Tensor] = {"fc.weight": torch.randn(h, len(layer_ids) * h, generator=gen) * 0.1,
                                  "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    for i in range(layers):
        random_layer(t, f"layers.{i}.", s, gen)
    return DFlashSpec("dflash", Path("memory"), s, layers, block, target.vocab_size - 1, layer_ids,
                      target.vocab_size, t)


@pytest.fixture
def tiny_target() -> ModelSpec:
    return make_target()


@pytest.fixture
def tiny_dflash(tiny_target) -> DFlashSpec:
    return make_dflash(tiny_target)


def write_hf(spec, directory: Path, config: dict) -> Path:
    """Write a spec's tensors (bf16-exact f32 kept as f32) and a config.json: an HF checkpoint dir."""
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in spec.tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def qwen3_config(spec: ModelSpec) -> dict:
    s = spec.layer
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": s.hidden_size,
            "num_hidden_layers": spec.num_layers, "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim, "intermediate_size": s.intermediate_size,
            "vocab_size": spec.vocab_size, "rms_norm_eps": s.rms_eps, "rope_theta": s.rope_theta,
            "max_position_embeddings": spec.max_position, "tie_word_embeddings": spec.tie_word_embeddings,
            "hidden_act": "silu", "torch_dtype": "float32"}


def dflash_config(d: DFlashSpec, target: ModelSpec) -> dict:
    cfg = qwen3_config(target)
    cfg.update(architectures=["DFlashDraftModel"], num_hidden_layers=d.num_layers, block_size=d.block_size,
               dflash_config={"mask_token_id": d.mask_token_id, "target_layer_ids": list(d.target_layer_ids)})
    return cfg


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture_path(rel: str) -> Path:
    """A bundled fixture by its name under fixtures/; a derived one (MANIFEST.json ``derived``: the target's GGUF)
    made on first use by ``fixturegen.derived``, its sha256 checked."""
    from bloomery_cli.fixturegen.derived import WRITERS, derived

    return derived(rel, FIXTURES) if rel in WRITERS else FIXTURES / rel
