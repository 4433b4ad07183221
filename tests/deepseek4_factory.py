"""Tiny random deepseek4 (DeepSeek V4) trunk checkpoints for the tests, made here: config.json (HF ``deepseek_v4``
keys, docs/FAMILIES_MOE.md 4.4's tiny shape: [sliding, CSA, HCA, CSA], CSA rate 2, HCA rate 4, window 4, 4 heads
of 32 over one KV head, rope 8, q_lora 24, 2 output groups x 16, indexer 2 x 16 top-2, 8 experts top-2, layer 0 a
hash layer, 4 mHC streams, a YaRN compress rope) and a safetensors file under HF's module names (``model.`` prefix,
``lm_head.weight``). Trained-looking: norms away from 1, sinks, position biases, router bias and mHC / HC-head base
away from their zero init, ``tid2eid`` filled (2 distinct experts per token; HF's init is all zeros)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Dims:
    """The sizes a wider checkpoint changes (hidden, vocab, routed experts, their width, top-k); the rest stay."""

    h: int = H
    v: int = V
    e: int = E
    ff: int = FF
    k: int = K

    def config(self) -> dict[str, Any]:
        return {"hidden_size": self.h, "vocab_size": self.v, "n_routed_experts": self.e,
                "moe_intermediate_size": self.ff, "num_experts_per_tok": self.k}


TINY = Dims()


def compressor(p: str, width: int, c: int, rate: int, H: int = H) -> dict[str, tuple[tuple[int, ...], str]]:
    return {p + "kv_proj.weight": ((c * width, H), "lin"), p + "gate_proj.weight": ((c * width, H), "lin"),
            p + "position_bias": ((rate, c * width), "base"), p + "kv_norm.weight": ((width,), "norm")}


def shapes(dims: Dims = TINY) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every trunk tensor: name -> (shape, kind), kind "lin" (scaled by 1/sqrt(in)), "norm", or a named init."""
    H, V, E, FF, K = dims.h, dims.v, dims.e, dims.ff, dims.k
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
            t |= compressor(c, D, 2, CSA, H) | compressor(c + "indexer.", DI, 2, CSA, H)
            t |= {c + "indexer.q_b_proj.weight": ((NI * DI, QL), "lin"),
                  c + "indexer.scorer.weights_proj.weight": ((NI, H), "lin")}
        elif TYPES[layer] == "heavily_compressed_attention":
            t |= compressor(a + "compressor.", D, 1, HCA, H)
        m = "mlp."
        t |= {m + "gate.weight": ((E, H), "router"), m + "experts.gate_up_proj": ((E, 2 * FF, H), "lin"),
              m + "experts.down_proj": ((E, H, FF), "lin"), m + "shared_experts.gate_proj.weight": ((FF, H), "lin"),
              m + "shared_experts.up_proj.weight": ((FF, H), "lin"),
              m + "shared_experts.down_proj.weight": ((H, FF), "lin")}
        t[m + ("gate.tid2eid" if MLP[layer] == "hash_moe" else "gate.e_score_correction_bias")] = (
            ((V, K), "table") if MLP[layer] == "hash_moe" else ((E,), "bias"))
        out |= {p + k: v for k, v in t.items()}
    return out


def params(seed: int = 0, gain: float = 1.0, dims: Dims = TINY, skip=lambda name: False) -> dict[str, torch.Tensor]:
    """Random float32 weights (int64 ``tid2eid``) for ``shapes(dims)``, the names ``skip`` picks left out."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    affine = {"norm": (1.0, 0.2), "emb": (0.0, 1.0), "base": (0.0, 0.3), "scale": (1.0, 0.3), "bias": (0.0, 0.5),
              "sink": (0.0, 1.0), "router": (0.0, 4.0 / dims.h ** 0.5)}
    for name, (shape, kind) in shapes(dims).items():
        if skip(name):
            continue
        if kind == "table":
            out[name] = torch.stack([torch.randperm(dims.e, generator=g)[:dims.k] for _ in range(shape[0])]).long()
            continue
        r = torch.randn(shape, generator=g)
        a, b = affine.get(kind, (0.0, gain / shape[-1] ** 0.5))
        out[name] = a + b * r
    return out


FP4_CONFIG = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
                                      "weight_block_size": [128, 128], "expert_dtype": "fp4"}}
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def pack_experts(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The routed experts in DeepSeek V4's native FP4 as transformers' ``FP8Experts(expert_dtype="fp4")`` holds
    them (bloomery_cli/families/deepseek4/reader.py): codes I8 [E, R, K/2], scales F8_E8M0 [E, R, K/32] under
    ``<name>_scale_inv``; quantised by ``reference.ops.mxfp4.quantize`` (nearest e2m1 per block of 32)."""
    from bloomery_gates.reference.ops import mxfp4 as rmx

    out = dict(p)
    for name in [n for n in p if n.endswith(PACKED)]:
        q = rmx.quantize(p[name].double().numpy())
        out[name] = torch.from_numpy(q.codes.copy()).view(torch.int8)
        out[name + "_scale_inv"] = torch.from_numpy(q.scales.copy()).view(torch.float8_e8m0fnu)
    return out


def write(d: Path, dtype: torch.dtype = torch.float32, seed: int = 0, edit=None, config: dict | None = None,
          fp4: bool = False, packed_edit=None) -> Path:
    """The checkpoint in ``d`` with its float weights stored in ``dtype``; ``edit(params)`` changes them first,
    ``config`` replaces config.json's keys. ``fp4``: the routed experts packed (``pack_experts``, and
    ``FP4_CONFIG``'s quantization_config), ``packed_edit(tensors)`` changes the stored tensors last (a plant)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG | (FP4_CONFIG if fp4 else {}) | (config or {})))
    p = params(seed)
    if edit is not None:
        edit(p)
    out = {k: (v if not v.is_floating_point() else v.to(dtype)).contiguous() for k, v in p.items()}
    if fp4:
        out = pack_experts({k: p[k] if k.endswith(PACKED) else v for k, v in out.items()})
    if packed_edit is not None:
        packed_edit(out)
    save_file({k: v.contiguous() for k, v in out.items()}, str(d / "model.safetensors"))
    return d


def write_random_fp4(d: Path, dims: Dims, seed: int = 0) -> Path:
    """A wider MXFP4 checkpoint for the device (.ci/device-mxfp4.sh): the trunk random as ``params`` makes it, in
    bf16; the routed experts drawn directly as random e2m1 bytes (rms 2.93) with e8m0 scales in [e0 - 1, e0 + 1],
    2^e0 ~ 1 / (2.93 sqrt(K)) (rows of rms ~ 1 / sqrt(K)), so no float copy of the experts is ever made (64 experts
    of 512 at hidden 1024 are 400 M weights a model)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG | FP4_CONFIG | dims.config()))
    g = torch.Generator().manual_seed(seed)
    out = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
           for k, v in params(seed, dims=dims, skip=lambda n: n.endswith(PACKED)).items()}
    for name, (shape, _) in shapes(dims).items():
        if name.endswith(PACKED):
            e0 = 127 + round(-math.log2(2.93) - 0.5 * math.log2(shape[-1]))
            out[name] = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), generator=g, dtype=torch.uint8
                                      ).view(torch.int8)
            out[name + "_scale_inv"] = torch.randint(e0 - 1, e0 + 2, (*shape[:-1], shape[-1] // 32), generator=g,
                                                     dtype=torch.uint8).view(torch.float8_e8m0fnu)
    save_file(out, str(d / "model.safetensors"))
    return d
