"""The Nemotron-H inventory fixture: a tiny checkpoint in the real layouts, for ``bloomery inventory`` only.

Nothing is trained and nothing is downloaded: the weights are small seeded values (no model runs on them). Two
files of the same model (FAMILIES_MOE.md sections 4.6, 7 and 9.2):

- ``nemotron-h-tiny/``: HF ``config.json`` (model_type ``nemotron_h``, ``layers_block_type`` [mamba, moe,
  attention, mlp], LatentMoE, ``num_nextn_predict_layers`` 1, ``mtp_layers_block_type`` [full_attention, moe])
  and ``model.safetensors`` with the checkpoint names (``backbone.*`` and per-expert
  ``mixer.experts.N.{up,down}_proj.weight``, which transformers' conversion mapping renames and merges), plus the
  MTP tensors ``mtp.layers.0.{enorm, hnorm, eh_proj, norm, mixer.*}`` and ``mtp.layers.1.{norm, mixer.*,
  final_layernorm}`` that llama.cpp's converter (conversion/nemotron.py) folds into one block;
- ``nemotron-h-tiny.gguf``: the llama.cpp layout (arch ``nemotron_h_moe``), block_count 5 = 4 trunk + 1 NextN;
  a Mamba layer has head_count_kv 0 and feed_forward_length 0; ``blk.4.nextn.{eh_proj, enorm, hnorm,
  shared_head_norm}`` with ``blk.4.post_attention_norm`` and the MoE of the MTP block. F16 tensors.

Widths (HF-verified in FAMILIES_MOE.md): H 64, 4 heads, 2 KV heads of 16, Mamba 4 heads x 16, state 16, 2 groups,
conv 4; 8 experts top-2, expert FFN 32, shared FFN 64, latent 32, groups 2 / 1; dense MLP 128; vocab 256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

H, HEADS, KV, HD, V = 64, 4, 2, 16, 256
MH, MHD, ST, G, K = 4, 16, 16, 2, 4            # mamba heads, head dim, state, groups, conv kernel
E, TOPK, FF_EXP, FF_SH, LAT, FF = 8, 2, 32, 64, 32, 128
INNER, CONV = MH * MHD, MH * MHD + 2 * G * ST
IN_PROJ = 2 * INNER + 2 * G * ST + MH
TYPES = ["mamba", "moe", "attention", "mlp"]
HF_DIR, GGUF_NAME = "nemotron-h-tiny", "nemotron-h-tiny.gguf"


def config() -> dict:
    return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": V,
            "hidden_size": H, "layers_block_type": TYPES, "num_hidden_layers": len(TYPES),
            "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": FF,
            "mlp_hidden_act": "relu2", "mamba_num_heads": MH, "mamba_head_dim": MHD, "ssm_state_size": ST,
            "n_groups": G, "conv_kernel": K, "expand": 1, "chunk_size": 64, "n_routed_experts": E,
            "num_experts_per_tok": TOPK, "moe_intermediate_size": FF_EXP, "moe_shared_expert_intermediate_size": FF_SH,
            "moe_latent_size": LAT, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
            "mtp_layers_block_type": ["full_attention", "moe"], "torch_dtype": "bfloat16"}


def _attn(p: str) -> dict[str, tuple[int, ...]]:
    return {p + "q_proj.weight": (HEADS * HD, H), p + "k_proj.weight": (KV * HD, H),
            p + "v_proj.weight": (KV * HD, H), p + "o_proj.weight": (H, HEADS * HD)}


def _moe(p: str) -> dict[str, tuple[int, ...]]:
    t: dict[str, tuple[int, ...]] = {p + "gate.weight": (E, H), p + "gate.e_score_correction_bias": (E,),
                                     p + "shared_experts.up_proj.weight": (FF_SH, H),
                                     p + "shared_experts.down_proj.weight": (H, FF_SH),
                                     p + "fc1_latent_proj.weight": (LAT, H), p + "fc2_latent_proj.weight": (H, LAT)}
    for e in range(E):
        t[f"{p}experts.{e}.up_proj.weight"] = (FF_EXP, LAT)
        t[f"{p}experts.{e}.down_proj.weight"] = (LAT, FF_EXP)
    return t


def hf_shapes() -> dict[str, tuple[int, ...]]:
    t: dict[str, tuple[int, ...]] = {"backbone.embeddings.weight": (V, H), "backbone.norm_f.weight": (H,),
                                     "lm_head.weight": (V, H)}
    for i, kind in enumerate(TYPES):
        p = f"backbone.layers.{i}."
        t[p + "norm.weight"] = (H,)
        m = p + "mixer."
        if kind == "mamba":
            t.update({m + "in_proj.weight": (IN_PROJ, H), m + "conv1d.weight": (CONV, 1, K), m + "conv1d.bias": (CONV,),
                      m + "dt_bias": (MH,), m + "A_log": (MH,), m + "D": (MH,), m + "norm.weight": (INNER,),
                      m + "out_proj.weight": (H, INNER)})
        elif kind == "moe":
            t.update(_moe(m))
        elif kind == "attention":
            t.update(_attn(m))
        else:
            t.update({m + "up_proj.weight": (FF, H), m + "down_proj.weight": (H, FF)})
    t.update({"mtp.layers.0.enorm.weight": (H,), "mtp.layers.0.hnorm.weight": (H,),
              "mtp.layers.0.eh_proj.weight": (H, 2 * H), "mtp.layers.0.norm.weight": (H,)})
    t.update(_attn("mtp.layers.0.mixer."))
    t["mtp.layers.1.norm.weight"] = (H,)
    t.update(_moe("mtp.layers.1.mixer."))
    t["mtp.layers.1.final_layernorm.weight"] = (H,)
    return t


def _gguf_moe(b: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{b}."
    return {p + "ffn_gate_inp.weight": (E, H), p + "exp_probs_b.bias": (E,), p + "ffn_latent_down.weight": (LAT, H),
            p + "ffn_latent_up.weight": (H, LAT), p + "ffn_up_exps.weight": (E, FF_EXP, LAT),
            p + "ffn_down_exps.weight": (E, LAT, FF_EXP), p + "ffn_up_shexp.weight": (FF_SH, H),
            p + "ffn_down_shexp.weight": (H, FF_SH)}


def _gguf_attn(b: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{b}."
    return {p + "attn_q.weight": (HEADS * HD, H), p + "attn_k.weight": (KV * HD, H),
            p + "attn_v.weight": (KV * HD, H), p + "attn_output.weight": (H, HEADS * HD)}


def gguf_shapes() -> dict[str, tuple[int, ...]]:
    """numpy shapes (GGUF ne reversed) of every tensor, llama.cpp names (src/models/nemotron-h.cpp)."""
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,),
                                     "output.weight": (V, H)}
    for b, kind in enumerate(TYPES):
        p = f"blk.{b}."
        t[p + "attn_norm.weight"] = (H,)
        if kind == "mamba":
            t.update({p + "ssm_in.weight": (IN_PROJ, H), p + "ssm_conv1d.weight": (CONV, K),
                      p + "ssm_conv1d.bias": (CONV,), p + "ssm_dt.bias": (MH,), p + "ssm_a": (MH, 1),
                      p + "ssm_d": (MH, 1), p + "ssm_norm.weight": (G, INNER // G), p + "ssm_out.weight": (H, INNER)})
        elif kind == "moe":
            t.update(_gguf_moe(b))
        elif kind == "attention":
            t.update(_gguf_attn(b))
        else:
            t.update({p + "ffn_up.weight": (FF, H), p + "ffn_down.weight": (H, FF)})
    b = len(TYPES)
    p = f"blk.{b}."
    t.update({p + "nextn.enorm.weight": (H,), p + "nextn.hnorm.weight": (H,), p + "nextn.eh_proj.weight": (H, 2 * H),
              p + "nextn.shared_head_norm.weight": (H,), p + "attn_norm.weight": (H,),
              p + "post_attention_norm.weight": (H,)})
    t.update(_gguf_attn(b))
    t.update(_gguf_moe(b))
    return t


def _values(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def write_hf(out: Path, seed: int = 0) -> list[Path]:
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    d = out / HF_DIR
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: torch.from_numpy(_values(s, rng)).to(torch.bfloat16) for k, s in hf_shapes().items()}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    return [d / "config.json", d / "model.safetensors"]


def write_gguf(out: Path, seed: int = 0) -> list[Path]:
    import gguf

    rng = np.random.default_rng(seed)
    path = out / GGUF_NAME
    a = "nemotron_h_moe"
    w = gguf.GGUFWriter(str(path), a)
    n = len(TYPES) + 1
    kv = [0, 0, KV, 0, KV]
    ff = [0, FF_EXP * TOPK, 0, FF, FF_EXP * TOPK]
    w.add_name("nemotron-h-tiny")
    for key, val in (("block_count", n), ("nextn_predict_layers", 1), ("context_length", 4096),
                     ("embedding_length", H), ("attention.head_count", HEADS), ("attention.key_length", HD),
                     ("attention.value_length", HD), ("ssm.conv_kernel", K), ("ssm.inner_size", INNER),
                     ("ssm.state_size", ST), ("ssm.time_step_rank", MH), ("ssm.group_count", G),
                     ("expert_count", E), ("expert_used_count", TOPK), ("expert_feed_forward_length", FF_EXP),
                     ("expert_shared_feed_forward_length", FF_SH), ("expert_shared_count", 1),
                     ("moe_latent_size", LAT), ("expert_group_count", 2), ("expert_group_used_count", 1),
                     ("vocab_size", V)):
        w.add_uint32(f"{a}.{key}", val)
    w.add_array(f"{a}.attention.head_count_kv", kv)
    w.add_array(f"{a}.feed_forward_length", ff)
    w.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-5)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.expert_weights_scale", 2.5)
    w.add_bool(f"{a}.expert_weights_norm", True)
    for name, shape in gguf_shapes().items():
        w.add_tensor(name, _values(shape, rng).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [path]


def build(out: Path, seed: int = 0) -> list[Path]:
    """Write both files into ``out`` and record them in its MANIFEST.json (files and a models entry)."""
    from ...fixturegen.manifest import Manifest

    out = Path(out)
    paths = write_hf(out, seed) + write_gguf(out, seed)
    man = Manifest.read(out)
    man.add_files(out, paths)
    man.models[HF_DIR] = {"what": "inventory-only Nemotron-H layout fixture (seeded values, not trained)",
                          "made_by": "python -m bloomery_cli.families.nemotron.fixture", "seed": seed,
                          "config": {k: v for k, v in config().items() if k != "architectures"},
                          "files": [p.relative_to(out).as_posix() for p in paths]}
    man.write(out)
    return paths


if __name__ == "__main__":
    import sys

    for p in build(Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures")):
        print(p, p.stat().st_size)
