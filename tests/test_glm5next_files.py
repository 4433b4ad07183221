"""glm5next (GLM-5.3) files, issue 25: a tiny HF config + safetensors and a tiny GGUF (docs/FAMILIES_MOE.md 4.3), made
here, each with its NextN layer in the file; every key read back, each bad key a one-line exit 2, and
``bloomery inventory`` / ``bloomery plan`` on them (plan's terms against a hand count)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from safetensors.torch import save_file
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.glm5next.reader import glm5next_from_hf
from bloomery_cli.families.glm5next.reader_gguf import glm5next_from_gguf
from bloomery_cli.inventory import MTP_IN_FILE, inventory
from bloomery_cli.plan.model import read_target
from bloomery_gates.errors import InputError

H, V, L, NH, E, K, FF, KVL, QL, D = 64, 128, 4, 4, 8, 2, 32, 16, 24, 16
TYPES = ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"]
runner = CliRunner()

CONFIG: dict[str, Any] = {
    "model_type": "glm5_next", "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
    "num_attention_heads": NH, "num_key_value_heads": NH, "intermediate_size": 96, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "layer_types": TYPES,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "q_lora_rank": QL, "kv_lora_rank": KVL,
    "qk_nope_head_dim": D, "v_head_dim": D, "qk_rope_head_dim": 0, "index_topk": 4, "index_head_dim": 16,
    "index_n_heads": 2, "index_kpool": 2, "index_kpool_always_select_tail": True,
    "indexer_types": ["full", "full", "shared", "full"], "linear_head_dim": D, "linear_num_heads": NH,
    "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "n_routed_experts": E, "num_experts_per_tok": K,
    "n_shared_experts": 1, "moe_intermediate_size": FF, "routed_scaling_factor": 2.5, "n_group": 2,
    "topk_group": 1, "norm_topk_prob": True, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "num_nextn_predict_layers": 1}


def z(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def write_hf(d: Path, cfg: dict[str, Any] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg or CONFIG))
    t = {"model.embed_tokens.weight": z(V, H), "lm_head.weight": z(V, H), "model.norm.weight": z(H)}
    for i in range(L + 1):
        p = f"model.layers.{i}."
        if i == L or TYPES[i] == "indexed_attention":
            t.update({p + "self_attn.q_a_proj.weight": z(QL, H), p + "self_attn.kv_b_proj.weight": z(NH * 2 * D, KVL)})
        else:
            t[p + "self_attn.q_proj.weight"] = z(NH * D, H)
        if i == 0:
            t[p + "mlp.gate_proj.weight"] = z(96, H)
        else:
            t.update({p + "mlp.experts.gate_up_proj": z(E, 2 * FF, H), p + "mlp.gate.weight": z(E, H)})
    t.update({f"model.layers.{L}.eh_proj.weight": z(H, 2 * H), f"model.layers.{L}.enorm.weight": z(H),
              f"model.layers.{L}.hnorm.weight": z(H)})
    save_file(t, str(d / "model.safetensors"))
    return d


GOOD_KEYS: dict[str, Any] = {
    "block_count": L + 1, "nextn_predict_layers": 1, "embedding_length": H, "context_length": 2048,
    "feed_forward_length": 96, "attention.head_count": NH, "attention.head_count_kv": [0, 1, 1, 0, 1],
    "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length_mla": D, "attention.value_length_mla": D,
    "attention.q_lora_rank": QL, "attention.kv_lora_rank": KVL, "attention.key_length": KVL,
    "attention.value_length": KVL, "ssm.conv_kernel": 4, "kda.head_dim": D, "kda.gate_lower_bound": -5.0,
    "expert_count": E, "expert_used_count": K, "expert_feed_forward_length": FF, "expert_shared_count": 1,
    "leading_dense_block_count": 1, "expert_weights_scale": 2.5, "expert_weights_norm": True,
    "expert_gating_func": 2, "attention.indexer.head_count": 2, "attention.indexer.key_length": 16,
    "attention.indexer.top_k": 4, "attention.indexer.kpool": 2, "attention.indexer.kpool_select_tail": True,
    "attention.indexer.types": ["full", "full", "shared", "full", "full"], "hyper_connection.count": 4,
    "hyper_connection.sinkhorn_iterations": 20, "hyper_connection.epsilon": 1e-6,
    "swiglu_clamp_exp": [10.0] * (L + 1)}


def write_gguf(path: Path, edit: dict[str, Any] | None = None, extra: tuple[str, ...] = ()) -> Path:
    keys = {**GOOD_KEYS, **(edit or {})}
    w = GGUFWriter(str(path), "glm5-next")
    for k, v in keys.items():
        name = "glm5-next." + k
        if v is None:
            continue
        if isinstance(v, list):
            w.add_array(name, v)
        elif isinstance(v, bool):
            w.add_bool(name, v)
        elif isinstance(v, float):
            w.add_float32(name, v)
        else:
            w.add_uint32(name, v)
    f = np.zeros
    w.add_tensor("token_embd.weight", f((V, H), np.float32))
    w.add_tensor("output.weight", f((V, H), np.float32))
    w.add_tensor("output_norm.weight", f((H,), np.float32))
    for i in range(L + 1):
        p = f"blk.{i}."
        if i < L:
            for part in ("attn", "ffn"):
                w.add_tensor(f"{p}hc_{part}_fn.weight", f((24, 4 * H), np.float32))
                w.add_tensor(f"{p}hc_{part}_base.weight", f((24,), np.float32))
                w.add_tensor(f"{p}hc_{part}_scale.weight", f((3,), np.float32))
        else:
            w.add_tensor(p + "nextn.eh_proj.weight", f((H, 2 * H), np.float32))
            w.add_tensor(p + "nextn.enorm.weight", f((H,), np.float32))
            w.add_tensor(p + "nextn.hnorm.weight", f((H,), np.float32))
        if i == L or TYPES[i] == "indexed_attention":
            for n, shape in (("attn_q_a", (QL, H)), ("attn_q_b", (NH * D, QL)), ("attn_kv_a_mqa", (KVL, H)),
                             ("attn_k_b", (NH, D, KVL)), ("attn_v_b", (NH, D, KVL)), ("attn_output", (H, NH * D))):
                w.add_tensor(f"{p}{n}.weight", f(shape, np.float32))
        else:
            for n, shape in (("attn_q", (NH * D, H)), ("attn_k", (NH * D, H)), ("attn_v", (NH * D, H)),
                             ("ssm_conv1d_q", (NH * D, 4))):
                w.add_tensor(f"{p}{n}.weight", f(shape, np.float32))
            w.add_tensor(p + "ssm_a", f((NH,), np.float32))
        if i == 0:
            for n, shape in (("ffn_gate", (96, H)), ("ffn_up", (96, H)), ("ffn_down", (H, 96))):
                w.add_tensor(f"{p}{n}.weight", f(shape, np.float32))
        else:
            for n, shape in (("ffn_gate_inp", (E, H)), ("ffn_gate_exps", (E, FF, H)), ("ffn_up_exps", (E, FF, H)),
                             ("ffn_down_exps", (E, H, FF)), ("ffn_gate_shexp", (FF, H))):
                w.add_tensor(f"{p}{n}.weight", f(shape, np.float32))
    for name in extra:
        w.add_tensor(name, f((H,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("glm5next")
    return {"hf": write_hf(d / "hf"), "gguf": write_gguf(d / "t.gguf")}


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_reads_back_every_key(files, fmt):
    s = (glm5next_from_hf if fmt == "hf" else glm5next_from_gguf)(files[fmt])
    assert (s.family, s.num_layers, s.vocab_size, s.nextn_layers, s.tie_word_embeddings) == ("glm5next", L, V, 1,
                                                                                             False)
    assert s.layer_types == tuple(TYPES) and s.mlp_types == ("dense", "sparse", "sparse", "sparse")
    assert (s.layer.hidden_size, s.layer.num_heads, s.layer.intermediate_size) == (H, NH, 96)
    assert (s.mla.q_lora_rank, s.mla.kv_lora_rank, s.mla.qk_nope_head_dim, s.mla.v_head_dim) == (QL, KVL, D, D)
    assert (s.dsa.num_heads, s.dsa.head_dim, s.dsa.topk, s.dsa.kpool, s.dsa.select_tail) == (2, 16, 4, 2, True)
    assert s.dsa.types == ("", "full", "shared", "")
    assert (s.kda.num_heads, s.kda.head_dim, s.kda.conv_kernel, s.kda.lower_bound) == (NH, D, 4, -5.0)
    m = s.moe
    assert (m.num_experts, m.top_k, m.expert_ff, m.shared_ff, m.router, m.routed_scale) == (E, K, FF, FF, "sigmoid",
                                                                                           2.5)
    assert (s.hc.count, s.hc.sinkhorn_iters) == (4, 20) and abs(s.hc.eps - 1e-6) < 1e-12
    assert s.swiglu_limit == 10.0
    if fmt == "hf":
        assert (m.n_group, m.topk_group, s.max_position) == (2, 1, 2048)


def test_the_published_spellings_read_the_same(tmp_path, files):
    """layer_types' deepseek_sparse_attention and the nested linear_attn_config give the same spec."""
    cfg = {k: v for k, v in CONFIG.items() if not k.startswith("linear_")}
    cfg.update(layer_types=[t.replace("indexed_attention", "deepseek_sparse_attention") for t in TYPES],
               linear_attn_config={"num_heads": NH, "head_dim": D, "gate_lower_bound": -5.0,
                                   "short_conv_kernel_size": 4},
               scoring_func="sigmoid", mla_use_nope=True)
    a, b = glm5next_from_hf(files["hf"]), glm5next_from_hf(write_hf(tmp_path / "pub", cfg))
    assert (a.layer_types, a.kda, a.mla, a.dsa, a.moe) == (b.layer_types, b.kda, b.mla, b.dsa, b.moe)


HF_BAD = [("qk_rope_head_dim", 8), ("num_key_value_heads", 2), ("index_kpool", 1), ("index_topk", 5),
          ("indexer_types", ["full", "shared", "full", "full"]), ("linear_num_heads", 2),
          ("linear_lower_bound", 1.0), ("num_experts_per_tok", 9), ("n_group", 3), ("topk_group", 3),
          ("hc_mult", 1), ("hc_eps", 0), ("layer_types", ["linear_attention"] * 3), ("mlp_layer_types", ["moe"] * 4),
          ("linear_attn_config", {"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4}),
          ("linear_attn_config", {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4, "gate_lower_bound": 1}),
          ("scoring_func", "softmax"), ("mla_use_nope", False), ("swiglu_limit", None), ("model_type", "glm5")]


@pytest.mark.parametrize("key,value", HF_BAD)
def test_bad_hf_key_exits_2_naming_it(tmp_path, key, value):
    d = write_hf(tmp_path / "bad", {**CONFIG, key: value})
    with pytest.raises(InputError, match=key):
        glm5next_from_hf(d)
    r = runner.invoke(app, ["plan", str(d), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and key in r.output and len(r.output.strip().splitlines()) == 1, r.output


GGUF_BAD = [("hyper_connection.count", 3), ("attention.head_count_kv", [0, 1, 1, 0, 0]),
            ("attention.key_length", 8), ("kda.gate_lower_bound", 2.0), ("attention.indexer.kpool", 1),
            ("attention.indexer.top_k", 5), ("attention.indexer.types", ["full", "shared", "full", "full", "full"]),
            ("expert_gating_func", 1), ("expert_used_count", 9), ("swiglu_clamp_exp", [10.0] * 3),
            ("nextn_predict_layers", 5), ("leading_dense_block_count", 9), ("attention.kv_lora_rank", None)]


@pytest.mark.parametrize("key,value", GGUF_BAD)
def test_bad_gguf_key_exits_2_naming_it(tmp_path, key, value):
    path = write_gguf(tmp_path / "b.gguf", {key: value})
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        glm5next_from_gguf(path)
    r = runner.invoke(app, ["plan", str(path), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and key in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_an_hc_tensor_in_the_nextn_block_is_refused(tmp_path):
    path = write_gguf(tmp_path / "h.gguf", extra=(f"blk.{L}.hc_attn_fn.weight",))
    with pytest.raises(InputError, match=rf"blk\.{L}\.hc_attn_fn\.weight.*no mHC"):
        glm5next_from_gguf(path)


def test_inventory_names_the_nextn_gate(files):
    for fmt in ("hf", "gguf"):
        m = inventory([files[fmt]]).models[0]
        why = "; ".join(m.why)
        want = "drafter here: gate glm5next-mtp"          # HF and GGUF alike: the gate runs both layouts
        assert m.verdict == MTP_IN_FILE and want in why, (fmt, why)
    r = runner.invoke(app, ["inventory", str(files["gguf"])], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "glm5next-mtp" in r.output and "PASS" not in r.output, r.output


def test_plan_terms_against_a_hand_count(files):
    hand_active = 3 * (K * 3 * H * FF + 3 * H * FF + E * H)     # 3 sparse layers: k routed + 1 shared + router
    for fmt in ("hf", "gguf"):
        t = read_target(files[fmt])
        assert (t.family, t.residual_streams, t.meta["active_expert_elems"]) == ("glm5next", 4, hand_active)
        p = json.loads(runner.invoke(app, ["plan", str(files[fmt]), "--draft", str(files[fmt]), "--gpu-mem", "1G",
                                           "--dtype", "f32", "--json"]).output)
        e = 4
        assert p["terms"]["per_position"] == e * (2 * KVL + 1 * H) + 8    # 2 MLA latents, 1 full indexer's inputs
        assert p["terms"]["per_slot"] == 2 * (4 * NH * D * D + e * 3 * 3 * NH * D)   # KDA S f32, 3 conv tails
        assert p["family"] == "glm5next" and p["draft_kind"] == "mtp"
        assert p["terms"]["draft_per_position"] == e * (KVL + H) + 8     # the NextN's latent and indexer inputs


def test_plan_prints_the_family_the_draft_path_and_the_engine_it_models(files):
    r = runner.invoke(app, ["plan", str(files["gguf"]), "--gpu-mem", "1G"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "(glm5next)" in r.output, r.output
    assert "draft path: NextN layer in-file" in r.output and "glm5next-mtp gate's engine" in r.output, r.output


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_loading_detects_the_family_by_the_registry(files, fmt):
    from bloomery_cli.loading import load_target

    assert load_target(files[fmt]).family == "glm5next"
    r = runner.invoke(app, ["gate", "run", "qwen35moe-mtp", "--target", str(files[fmt])])
    assert r.exit_code == 2 and "is a glm5next target" in r.output and "Traceback" not in r.output, r.output
