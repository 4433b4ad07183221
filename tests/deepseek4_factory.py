"""Tiny random deepseek4 (DeepSeek V4) trunk checkpoints for the tests, made here: config.json (HF ``deepseek_v4``
keys, docs/FAMILIES_MOE.md 4.4's tiny shape: [sliding, CSA, HCA, CSA], CSA rate 2, HCA rate 4, window 4, 4 heads
of 32 over one KV head, rope 8, q_lora 24, 2 output groups x 16, indexer 2 x 16 top-2, 8 experts top-2, layer 0 a
hash layer, 4 mHC streams, a YaRN compress rope) and a safetensors file under HF's module names (``model.`` prefix,
``lm_head.weight``). Trained-looking: norms away from 1, sinks, position biases, router bias and mHC / HC-head base
away from their zero init, ``tid2eid`` filled (2 distinct experts per token; HF's init is all zeros)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

H, V, L, NH, D, R, QL, G, OL, NI, DI, TOPK, E, K, FF, S = 64, 128, 4, 4, 32, 8, 24, 2, 16, 2, 16, 2, 8, 2, 32, 4
CSA, HCA, WINDOW = 2, 4, 4
TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention"]
MLP = ["hash_moe", "moe", "moe", "moe"]
CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v4", "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
    "num_attention_heads": NH, "num_key_value_heads": 1, "head_dim": D, "qk_rope_head_dim": R, "q_lora_rank": QL,
    "o_groups": G, "o_lora_rank": OL, "sliding_window": WINDOW, "layer_types": TYPES,
    "compress_rates": {"compressed_sparse_attention": CSA, "heavily_compressed_attention": HCA},
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                     "beta_slow": 1},
    "index_n_heads": NI, "index_head_dim": DI, "index_topk": TOPK, "n_routed_experts": E, "num_experts_per_tok": K,
    "n_shared_experts": 1, "moe_intermediate_size": FF, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "mlp_layer_types": MLP, "hc_mult": S,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "hidden_act": "silu"}


def compressor(p: str, width: int, c: int, rate: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {p + "kv_proj.weight": ((c * width, H), "lin"), p + "gate_proj.weight": ((c * width, H), "lin"),
            p + "position_bias": ((rate, c * width), "base"), p + "kv_norm.weight": ((width,), "norm")}


def shapes() -> dict[str, tuple[tuple[int, ...], str]]:
    """Every trunk tensor: name -> (shape, kind), kind "lin" (scaled by 1/sqrt(in)), "norm", or a named init."""
    hc = (2 + S) * S
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((V, H), "emb"), "model.norm.weight": ((H,), "norm"),
        "lm_head.weight": ((V, H), "lin"), "model.hc_head.hc_fn": ((S, S * H), "lin"),
        "model.hc_head.hc_base": ((S,), "base"), "model.hc_head.hc_scale": ((1,), "scale")}
    for layer in range(L):
        p = f"model.layers.{layer}."
        t = {"input_layernorm.weight": ((H,), "norm"), "post_attention_layernorm.weight": ((H,), "norm")}
        for h in ("attn_hc.", "ffn_hc."):
            t |= {h + "fn": ((hc, S * H), "lin"), h + "base": ((hc,), "base"), h + "scale": ((3,), "scale")}
        a = "self_attn."
        t |= {a + "q_a_proj.weight": ((QL, H), "lin"), a + "q_a_norm.weight": ((QL,), "norm"),
              a + "q_b_proj.weight": ((NH * D, QL), "lin"), a + "kv_proj.weight": ((D, H), "lin"),
              a + "kv_norm.weight": ((D,), "norm"), a + "o_a_proj.weight": ((G * OL, NH * D // G), "lin"),
              a + "o_b_proj.weight": ((H, G * OL), "lin"), a + "sinks": ((NH,), "sink")}
        if TYPES[layer] == "compressed_sparse_attention":
            c = a + "compressor."
            t |= compressor(c, D, 2, CSA) | compressor(c + "indexer.", DI, 2, CSA)
            t |= {c + "indexer.q_b_proj.weight": ((NI * DI, QL), "lin"),
                  c + "indexer.scorer.weights_proj.weight": ((NI, H), "lin")}
        elif TYPES[layer] == "heavily_compressed_attention":
            t |= compressor(a + "compressor.", D, 1, HCA)
        m = "mlp."
        t |= {m + "gate.weight": ((E, H), "router"), m + "experts.gate_up_proj": ((E, 2 * FF, H), "lin"),
              m + "experts.down_proj": ((E, H, FF), "lin"), m + "shared_experts.gate_proj.weight": ((FF, H), "lin"),
              m + "shared_experts.up_proj.weight": ((FF, H), "lin"),
              m + "shared_experts.down_proj.weight": ((H, FF), "lin")}
        t[m + ("gate.tid2eid" if MLP[layer] == "hash_moe" else "gate.e_score_correction_bias")] = (
            ((V, K), "table") if MLP[layer] == "hash_moe" else ((E,), "bias"))
        out |= {p + k: v for k, v in t.items()}
    return out


def params(seed: int = 0, gain: float = 1.0) -> dict[str, torch.Tensor]:
    """Random float32 weights (int64 ``tid2eid``) for ``shapes()``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    affine = {"norm": (1.0, 0.2), "emb": (0.0, 1.0), "base": (0.0, 0.3), "scale": (1.0, 0.3), "bias": (0.0, 0.5),
              "sink": (0.0, 1.0), "router": (0.0, 4.0 / H ** 0.5)}
    for name, (shape, kind) in shapes().items():
        if kind == "table":
            out[name] = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(shape[0])]).long()
            continue
        r = torch.randn(shape, generator=g)
        a, b = affine.get(kind, (0.0, gain / shape[-1] ** 0.5))
        out[name] = a + b * r
    return out


def write(d: Path, dtype: torch.dtype = torch.float32, seed: int = 0, edit=None, config: dict | None = None) -> Path:
    """The checkpoint in ``d`` with its float weights stored in ``dtype``; ``edit(params)`` changes them first,
    ``config`` replaces config.json's keys."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG | (config or {})))
    p = params(seed)
    if edit is not None:
        edit(p)
    save_file({k: (v if not v.is_floating_point() else v.to(dtype)).contiguous() for k, v in p.items()},
              str(d / "model.safetensors"))
    return d
