"""Tiny random qwen38 targets with an MTP head, in memory and as HF / GGUF files (tests only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bloomery_gates.spec import HybridShape, LayerShape, Qwen38Spec

TYPES = ("linear_attention", "full_attention", "linear_attention", "full_attention")


def _attn(t: dict, p: str, s: LayerShape, r, n) -> None:
    h, d = s.hidden_size, s.head_dim
    a, nh, nkv = p + "self_attn.", s.num_heads, s.num_kv_heads
    t.update({a + "q_proj.weight": r(2 * nh * d, h), a + "k_proj.weight": r(nkv * d, h),
              a + "v_proj.weight": r(nkv * d, h), a + "o_proj.weight": r(h, nh * d),
              a + "q_norm.weight": n(d), a + "k_norm.weight": n(d)})


def _common(t: dict, p: str, s: LayerShape, r, n) -> None:
    h, i = s.hidden_size, s.intermediate_size
    t.update({p + "input_layernorm.weight": n(h), p + "post_attention_layernorm.weight": n(h),
              p + "mlp.gate_proj.weight": r(i, h), p + "mlp.up_proj.weight": r(i, h),
              p + "mlp.down_proj.weight": r(h, i)})


def make_qwen38(seed: int = 0, vocab: int = 97, hidden: int = 32, mtp: bool = True, scale: float = 0.1) -> Qwen38Spec:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen) * scale

    def n(k):
        return 0.1 * torch.randn(k, generator=gen)             # zero-centred: gain 1 + w

    s = LayerShape(hidden, 4, 2, 8, 2 * hidden, 1e-6, 10000.0)
    hy = HybridShape(TYPES, 0.5, 4, 2, 4, 8, 8, 4, 1 if mtp else 0)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
                                  "model.norm.weight": n(hidden)}
    for i, kind in enumerate(TYPES):
        p = f"model.layers.{i}."
        _common(t, p, s, r, n)
        if kind == "full_attention":
            _attn(t, p, s, r, n)
        else:
            a, c = p + "linear_attn.", hy.conv_dim
            t.update({a + "in_proj_qkv.weight": r(c, hidden), a + "in_proj_z.weight": r(hy.value_dim, hidden),
                      a + "in_proj_a.weight": r(4, hidden), a + "in_proj_b.weight": r(4, hidden),
                      a + "conv1d.weight": r(c, 1, 4) * 3, a + "A_log": torch.rand(4, generator=gen),
                      a + "dt_bias": torch.ones(4), a + "norm.weight": 1 + n(8),
                      a + "out_proj.weight": r(hidden, hy.value_dim)})
    if mtp:
        t.update({"mtp.fc.weight": r(hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": n(hidden),
                  "mtp.pre_fc_norm_hidden.weight": n(hidden), "mtp.norm.weight": n(hidden)})
        _common(t, "mtp.layers.0.", s, r, n)
        _attn(t, "mtp.layers.0.", s, r, n)
    return Qwen38Spec(family="qwen38", source=Path("memory"), source_format="hf", layer=s, num_layers=len(TYPES),
                      vocab_size=vocab, tie_word_embeddings=True, max_position=4096, tensors=t, hybrid=hy)


def qwen38_config(spec: Qwen38Spec) -> dict:
    s, hy = spec.layer, spec.hybrid
    return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": s.hidden_size,
            "num_hidden_layers": spec.num_layers, "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim, "intermediate_size": s.intermediate_size,
            "vocab_size": spec.vocab_size, "rms_norm_eps": s.rms_eps, "layer_types": list(hy.layer_types),
            "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta,
                                "partial_rotary_factor": hy.partial_rotary_factor},
            "linear_num_key_heads": hy.linear_num_key_heads, "linear_num_value_heads": hy.linear_num_value_heads,
            "linear_key_head_dim": hy.linear_key_head_dim, "linear_value_head_dim": hy.linear_value_head_dim,
            "linear_conv_kernel_dim": hy.linear_conv_kernel_dim, "mtp_num_hidden_layers": hy.mtp_num_hidden_layers,
            "max_position_embeddings": spec.max_position, "tie_word_embeddings": spec.tie_word_embeddings,
            "hidden_act": "silu"}


def write_qwen38(spec: Qwen38Spec, directory: Path, drop: tuple[str, ...] = (), config: dict | None = None) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    kept = {k: v.contiguous() for k, v in spec.tensors.items() if k not in drop}
    save_file(kept, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config or qwen38_config(spec)))
    return directory
