"""Tiny random glm5next (GLM-5.3) trunk checkpoints for the tests, made here: config.json (the HF text config's keys,
docs/FAMILIES_MOE.md 4.3's tiny shape: [KDA, MLA full, MLA shared, KDA], 4 streams, k-pool 2 / top-4, 8 experts
top-2 in 2 groups) and a safetensors file under HF's text-model names (``model.`` prefix, ``lm_head.weight``).
Trained-looking: norms away from 1, router bias and mHC base away from their zero init, the KDA gate spread over
(-5, 0), the indexer's compressor gate and ape random (their init is a constant)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

H, V, L, NH, D, QL, KL, NI, DI, P, TOPK, E, K, FF, I, S = 64, 128, 4, 4, 16, 24, 16, 2, 16, 2, 4, 8, 2, 32, 96, 4
TYPES = ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"]
MLP = ["dense", "sparse", "sparse", "sparse"]
IDX = ["full", "full", "shared", "full"]
CONFIG: dict[str, Any] = {
    "model_type": "glm5_next", "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
    "num_attention_heads": NH, "num_key_value_heads": NH, "intermediate_size": I, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "layer_types": TYPES, "mlp_layer_types": MLP,
    "q_lora_rank": QL, "kv_lora_rank": KL, "qk_nope_head_dim": D, "v_head_dim": D, "qk_rope_head_dim": 0,
    "index_topk": TOPK, "index_head_dim": DI, "index_n_heads": NI, "index_kpool": P,
    "index_kpool_always_select_tail": True, "indexer_types": IDX, "linear_head_dim": D, "linear_num_heads": NH,
    "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "n_routed_experts": E, "num_experts_per_tok": K,
    "n_shared_experts": 1, "moe_intermediate_size": FF, "routed_scaling_factor": 2.5, "n_group": 2,
    "topk_group": 1, "norm_topk_prob": True, "swiglu_limit": 10.0, "hc_mult": S, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "num_nextn_predict_layers": 0}


def shapes(nextn: int = 0) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every trunk tensor (and ``nextn`` NextN blocks after it, model.layers.{L + j}.*: enorm, hnorm, eh_proj, an
    MLA layer with a full indexer, a sparse FFN, shared_head.norm; no mHC): name -> (shape, kind), kind "lin"
    (scaled by 1/sqrt(in)), "norm", or a named init."""
    c, hc = NH * D, (2 + S) * S
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((V, H), "emb"), "model.norm.weight": ((H,), "norm"),
        "lm_head.weight": ((V, H), "lin")}
    for layer in range(L + nextn):
        p = f"model.layers.{layer}."
        t = {"input_layernorm.weight": ((H,), "norm"), "post_attention_layernorm.weight": ((H,), "norm")}
        if layer >= L:
            t |= {"enorm.weight": ((H,), "norm"), "hnorm.weight": ((H,), "norm"), "eh_proj.weight": ((H, 2 * H), "lin"),
                  "shared_head.norm.weight": ((H,), "norm")}
        else:
            for h in ("attn_hc.", "ffn_hc."):
                t |= {h + "fn": ((hc, S * H), "lin"), h + "base": ((hc,), "base"), h + "scale": ((3,), "scale")}
        a = "self_attn."
        kind = TYPES[layer] if layer < L else "indexed_attention"
        if kind == "linear_attention":
            t |= {a + "q_proj.weight": ((c, H), "lin"), a + "k_proj.weight": ((c, H), "lin"),
                  a + "v_proj.weight": ((c, H), "lin"), a + "conv1d.weight": ((3 * c, 1, 4), "conv"),
                  a + "forget_gate.f_a_proj.weight": ((D, H), "lin"),
                  a + "forget_gate.f_b_proj.weight": ((c, D), "lin"), a + "forget_gate.dt_bias": ((c,), "dt"),
                  a + "forget_gate.A_log": ((NH,), "alog"), a + "b_proj.weight": ((NH, H), "lin"),
                  a + "g_a_proj.weight": ((D, H), "lin"), a + "g_b_proj.weight": ((c, D), "lin"),
                  a + "o_norm.weight": ((D,), "norm"), a + "o_proj.weight": ((H, c), "lin")}
        else:
            t |= {a + "q_a_proj.weight": ((QL, H), "lin"), a + "q_a_layernorm.weight": ((QL,), "norm"),
                  a + "q_b_proj.weight": ((NH * D, QL), "lin"), a + "kv_a_proj_with_mqa.weight": ((KL, H), "lin"),
                  a + "kv_a_layernorm.weight": ((KL,), "norm"), a + "kv_b_proj.weight": ((NH * 2 * D, KL), "lin"),
                  a + "o_proj.weight": ((H, NH * D), "lin")}
            if layer >= L or IDX[layer] == "full":
                i = a + "indexer."
                t |= {i + "wq_b.weight": ((NI * DI, QL), "lin"), i + "wk.weight": ((DI, H), "lin"),
                      i + "k_norm.weight": ((DI,), "norm"), i + "k_norm.bias": ((DI,), "base"),
                      i + "weights_proj.weight": ((NI, H), "lin"), i + "index_kpool_compress_gate": ((DI, H), "lin"),
                      i + "index_kpool_compress_ape": ((P, DI), "base")}
        m = "mlp."
        if layer < L and MLP[layer] == "dense":
            t |= {m + "gate_proj.weight": ((I, H), "lin"), m + "up_proj.weight": ((I, H), "lin"),
                  m + "down_proj.weight": ((H, I), "lin")}
        else:
            t |= {m + "gate.weight": ((E, H), "router"), m + "gate.e_score_correction_bias": ((E,), "bias"),
                  m + "experts.gate_up_proj": ((E, 2 * FF, H), "lin"), m + "experts.down_proj": ((E, H, FF), "lin"),
                  m + "shared_experts.gate_proj.weight": ((FF, H), "lin"),
                  m + "shared_experts.up_proj.weight": ((FF, H), "lin"),
                  m + "shared_experts.down_proj.weight": ((H, FF), "lin")}
        out |= {p + k: v for k, v in t.items()}
    return out


def params(seed: int = 0, gain: float = 1.0, nextn: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 weights for ``shapes()``; ``gain`` scales the linear layers (a larger gain drives the
    clamps and the router harder)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    affine = {"norm": (1.0, 0.2), "emb": (0.0, 1.0), "base": (0.0, 0.3), "scale": (1.0, 0.3), "conv": (0.0, 0.5),
              "dt": (1.5, 0.5), "alog": (0.2, 0.1), "bias": (0.0, 0.05),
              "router": (0.0, 4.0 / H ** 0.5)}
    for name, (shape, kind) in shapes(nextn).items():
        r = torch.randn(shape, generator=g)
        a, b = affine.get(kind, (0.0, gain / shape[-1] ** 0.5))
        out[name] = a + b * r
    return out


def write(d: Path, dtype: torch.dtype = torch.float32, seed: int = 0, edit=None, nextn: int = 0) -> Path:
    """The checkpoint in ``d`` with its weights stored in ``dtype``; ``edit(params)`` changes them first; ``nextn``
    NextN blocks after the trunk (num_nextn_predict_layers)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**CONFIG, "num_nextn_predict_layers": nextn}))
    p = params(seed, nextn=nextn)
    if edit is not None:
        edit(p)
    save_file({k: v.to(dtype).contiguous() for k, v in p.items()}, str(d / "model.safetensors"))
    return d
