"""qwen4exp (Qwen3.8-Flash-Next) files, issue 25: a tiny HF config + safetensors, a tiny trunk GGUF and the separate
MTP GGUF (docs/FAMILIES_MOE.md 4.5, 6), all made here; every key read back, each bad key a one-line exit 2, and
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
from bloomery_cli.families.qwen4exp.reader import qwen4exp_from_hf
from bloomery_cli.families.qwen4exp.reader_gguf import qwen4exp_from_gguf
from bloomery_cli.families.qwen4exp.reader_mtp import qwen4exp_mtp_from_gguf
from bloomery_cli.inventory import MTP_SIDECAR, inventory
from bloomery_cli.plan.model import read_target
from bloomery_gates.errors import InputError

H, V, L, E, K, FF, HC, R = 64, 128, 4, 8, 2, 32, 4, 16
runner = CliRunner()

CONFIG: dict[str, Any] = {
    "model_type": "qwen4_exp", "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": FF,
    "shared_expert_intermediate_size": FF, "norm_topk_prob": True, "hc_count": HC, "hc_lowrank": R,
    "ple_layer_ids": [1], "ple_embed_dim": 32, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 2,
    "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234, "split_ngram_parts": 1,
    "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 4,
    "indexer_compress_ratio": 2, "output_gate_type": "sigmoid", "eos_token_id": 1}


def z(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def write_hf(d: Path, cfg: dict[str, Any] | None = None, mtp: bool = True) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg or CONFIG))
    t = {"model.embed_tokens.weight": z(V, H), "lm_head.weight": z(V, H)}
    for i in range(L):
        p = f"model.layers.{i}.mlp."
        t.update({p + "gate.weight": z(E, H), p + "experts.gate_up_proj": z(E, 2 * FF, H),
                  p + "experts.down_proj": z(E, H, FF), p + "shared_expert.gate_proj.weight": z(FF, H),
                  p + "shared_expert.up_proj.weight": z(FF, H), p + "shared_expert.down_proj.weight": z(H, FF),
                  p + "shared_expert_gate.weight": z(1, H)})
    if mtp:
        t.update({"mtp.fc_embedding.weight": z(H, H), "mtp.fc_hidden.weight": z(H, HC * H),
                  "mtp.layers.0.mlp.gate.weight": z(E, H)})
    save_file(t, str(d / "model.safetensors"))
    return d


def keys_common(w: GGUFWriter, blocks: int, skip: dict[str, Any] | None = None) -> None:
    a = "qwen4exp."
    for k, v in {"block_count": blocks, "embedding_length": H, "attention.head_count": 4,
                 "attention.head_count_kv": 2, "attention.key_length": 16, "attention.value_length": 16,
                 "rope.dimension_count": 4, "expert_count": E, "expert_used_count": K,
                 "expert_feed_forward_length": FF, "expert_shared_feed_forward_length": FF,
                 "hyper_connection.count": HC, "hyper_connection.low_rank": R, "context_length": 4096,
                 "vocab_size": V}.items():
        if k not in (skip or {}):
            w.add_uint32(a + k, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 10000.0)
    w.add_uint32("tokenizer.ggml.eos_token_id", (skip or {}).get("eos", 1))
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)


def block_tensors(w: GGUFWriter, i: int, linear: bool) -> None:
    p = f"blk.{i}."
    f = np.zeros
    for part in ("attn", "ffn"):
        w.add_tensor(f"{p}hc_{part}_norm.weight", f((HC * H,), np.float32))
        w.add_tensor(f"{p}hc_{part}_down.weight", f((R, HC * H), np.float32))
        w.add_tensor(f"{p}hc_{part}_up.weight", f((HC, R), np.float32))
        w.add_tensor(f"{p}hc_{part}_inject.weight", f((HC, HC * H), np.float32))
    w.add_tensor(p + "ffn_gate_inp.weight", f((E, H), np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", f((E, FF, H), np.float32))
    w.add_tensor(p + "ffn_up_exps.weight", f((E, FF, H), np.float32))
    w.add_tensor(p + "ffn_down_exps.weight", f((E, H, FF), np.float32))
    w.add_tensor(p + "ffn_gate_shexp.weight", f((FF, H), np.float32))
    if linear:
        w.add_tensor(p + "ssm_a", f((4,), np.float32))
        w.add_tensor(p + "ssm_conv1d.weight", f((128, 4), np.float32))
    else:
        for n, shape in (("attn_q", (128, H)), ("attn_k", (32, H)), ("attn_v", (32, H)), ("attn_output", (H, 64))):
            w.add_tensor(f"{p}{n}.weight", f(shape, np.float32))


def write_gguf(path: Path, edit: dict[str, Any] | None = None, extra: tuple[str, ...] = ()) -> Path:
    """The trunk GGUF; ``edit``: key -> value (None drops the key) applied over the good keys."""
    good: dict[str, Any] = {"full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.state_size": 16,
                            "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 64,
                            "embedding_length_out": HC * H, "attention.indexer.head_count": 2,
                            "attention.indexer.key_length": 16, "attention.indexer.top_k": 4,
                            "attention.compress_ratios": [0, 0, 0, 2], "ple.layers": [0], "ple.ngram_size": 3,
                            "ple.heads_per_ngram": 2, "ple.conv_kernel": 4, "ple.head_vocab_sizes": [1024] * 4,
                            "embedding_length_per_layer_input": 8}     # the table's row width (converter)
    good.update(edit or {})
    w = GGUFWriter(str(path), "qwen4exp")
    keys_common(w, L, good)
    for k, v in good.items():
        if v is None:
            continue
        if isinstance(v, list):
            w.add_array("qwen4exp." + k, v)
        else:
            w.add_uint32("qwen4exp." + k, v)
    w.add_tensor("token_embd.weight", np.zeros((V, H), np.float32))
    w.add_tensor("output.weight", np.zeros((V, H), np.float32))
    w.add_tensor("output_hc_norm.weight", np.zeros((HC, H), np.float32))
    w.add_tensor("output_hc_down.weight", np.zeros((R, HC * H), np.float32))
    w.add_tensor("output_hc_up.weight", np.zeros((HC, R), np.float32))
    w.add_tensor("per_layer_token_embd.weight", np.zeros((4096, 8), np.float32))
    for i in range(L):
        block_tensors(w, i, i < 3)
    for name in extra:
        w.add_tensor(name, np.zeros((H,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mtp(path: Path, shared: bool = True, edit: dict[str, Any] | None = None,
              extra: tuple[str, ...] = (), own: bool | None = None, hnorm: int = HC * H) -> Path:
    """The separate MTP GGUF: blk.4 only; ``own``: write token_embd/output (default: not shared)."""
    w = GGUFWriter(str(path), "qwen4exp")
    keys_common(w, L + 1, edit)
    a = "qwen4exp."
    vals: dict[str, Any] = {"nextn_predict_layers": 1, "expert_gating_func": 1,
                            "attention.compress_ratios": [0, 0, 0, 2, 0]}
    vals.update(edit or {})
    for k, v in vals.items():
        if k == "eos":
            continue
        if isinstance(v, list):
            w.add_array(a + k, v)
        elif v is not None:
            w.add_uint32(a + k, v)
    if "expert_weights_norm" not in (edit or {}):
        w.add_bool(a + "expert_weights_norm", True)
    if "expert_weights_scale" not in (edit or {}):
        w.add_float32(a + "expert_weights_scale", 1.0)
    w.add_bool(a + "nextn_shared_target_tensors", shared)
    if (not shared) if own is None else own:
        w.add_tensor("token_embd.weight", np.zeros((V, H), np.float32))
        w.add_tensor("output.weight", np.zeros((V, H), np.float32))
    p = f"blk.{L}.nextn."
    w.add_tensor(p + "eh_proj.weight", np.zeros((H, 2 * H), np.float32))
    w.add_tensor(p + "enorm.weight", np.zeros((H,), np.float32))
    w.add_tensor(p + "hnorm.weight", np.zeros((hnorm,), np.float32))
    w.add_tensor(p + "hc_head_norm.weight", np.zeros((HC * H,), np.float32))
    w.add_tensor(p + "hc_head_down.weight", np.zeros((R, HC * H), np.float32))
    w.add_tensor(p + "hc_head_up.weight", np.zeros((HC, R), np.float32))
    block_tensors(w, L, False)
    for name in extra:
        w.add_tensor(name, np.zeros((H,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("qwen4exp")
    return {"hf": write_hf(d / "hf"), "gguf": write_gguf(d / "t.gguf"), "mtp": write_mtp(d / "mtp-shared.gguf"),
            "mtp_own": write_mtp(d / "mtp-own.gguf", shared=False)}


def test_hf_reads_back_every_key(files):
    s = qwen4exp_from_hf(files["hf"])
    assert (s.family, s.num_layers, s.vocab_size, s.tie_word_embeddings, s.max_position) == ("qwen4exp", 4, V, False,
                                                                                             4096)
    assert (s.layer.hidden_size, s.layer.num_heads, s.layer.num_kv_heads, s.layer.head_dim) == (H, 4, 2, 16)
    assert s.hybrid.layer_types == ("linear_attention",) * 3 + ("full_attention",) and s.hybrid.rotary_dim == 4
    hy = s.hybrid
    assert (hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_conv_kernel_dim) == (2, 4, 4)
    assert (s.moe.num_experts, s.moe.top_k, s.moe.expert_ff, s.moe.shared_ff, s.moe.norm_topk) == (E, K, FF, FF, True)
    assert (s.hc.count, s.hc.low_rank) == (HC, R)
    assert (s.qsa.num_heads, s.qsa.kv_heads, s.qsa.head_dim, s.qsa.budget, s.qsa.compress_ratio) == (2, 1, 16, 4, 2)
    p = s.ple
    assert (p.layers, p.embed_dim, p.conv_kernel, p.ngram_size, p.heads_per_ngram) == ((0,), 32, 4, 3, 2)
    assert (p.vocab_base, p.divisible_by, p.seed, p.split_parts) == (1000, 128, 1234, 1)


def test_gguf_and_mtp_read_back(files):
    s = qwen4exp_from_gguf(files["gguf"])
    assert (s.num_layers, s.vocab_size, s.layer.hidden_size, s.hc.count, s.hc.low_rank) == (4, V, H, HC, R)
    assert s.hybrid.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (s.qsa.budget, s.qsa.compress_ratio, s.ple.layers, s.ple.head_vocab_sizes) == (4, 2, (0,), (1024,) * 4)
    assert (s.moe.num_experts, s.moe.top_k, s.moe.expert_ff, s.moe.shared_ff) == (E, K, FF, FF)
    for key, borrows in (("mtp", True), ("mtp_own", False)):
        m = qwen4exp_mtp_from_gguf(files[key], s)
        assert (m.block, m.borrows, m.hc.count, m.moe.top_k, m.layer.hidden_size, m.rotary_dim) == (
            4, borrows, HC, K, H, 4)
        assert m.tensors.shape_of("blk.4.nextn.hnorm.weight") == (HC * H,)
    m = qwen4exp_mtp_from_gguf(files["mtp"], qwen4exp_from_hf(files["hf"]))     # an HF target works too
    assert m.block == 4


HF_BAD = [("hc_count", 1, "hc_count"), ("hc_lowrank", None, "hc_lowrank"),
          ("hc_lowrank", 257, "hc_lowrank"), ("indexer_kv_heads", 2, "indexer_kv_heads"),
          ("indexer_budget", 5, "indexer_budget"), ("ple_layer_ids", [4], "ple_layer_ids"),
          ("ngram_size", 9, "ngram_size"), ("ple_embed_dim", 30, "ple_embed_dim"),
          ("partial_rotary_factor", None, "partial_rotary_factor"), ("num_experts_per_tok", 9, "num_experts_per_tok"),
          ("layer_types", ["linear_attention"] * 4 + ["x"], "layer_types"),
          ("output_gate_type", "relu", "output_gate_type"), ("model_type", "qwen4", "model_type"),
          ("heads_per_ngram", 40, "heads_per_ngram")]


@pytest.mark.parametrize("key,value,named", HF_BAD)
def test_bad_hf_key_exits_2_naming_it(tmp_path, key, value, named):
    cfg = {**CONFIG, key: value}
    d = write_hf(tmp_path / "bad", cfg, mtp=False)
    with pytest.raises(InputError, match=named):
        qwen4exp_from_hf(d)
    r = runner.invoke(app, ["plan", str(d), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and named in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


GGUF_BAD = [("hyper_connection.count", None, 1), ("hyper_connection.low_rank", None, 257),
            ("embedding_length_out", None, 200),
            ("attention.compress_ratios", None, [0, 2, 0, 2]), ("ple.layers", None, [3]),
            ("ple.ngram_size", None, 1), ("ple.head_vocab_sizes", None, [1024] * 3),
            ("attention.indexer.top_k", None, 3), ("ssm.inner_size", None, 66),
            ("embedding_length_per_layer_input", None, 30)]


@pytest.mark.parametrize("key,_,value", GGUF_BAD)
def test_bad_gguf_key_exits_2_naming_it(tmp_path, key, _, value):
    path = write_gguf(tmp_path / "b.gguf", {key: value})
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        qwen4exp_from_gguf(path)
    r = runner.invoke(app, ["plan", str(path), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and key in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_block_norm_is_refused_by_name(tmp_path):
    path = write_gguf(tmp_path / "n.gguf", extra=("blk.0.attn_norm.weight",))
    with pytest.raises(InputError, match=r"blk\.0\.attn_norm\.weight"):
        qwen4exp_from_gguf(path)


MTP_BAD = [({"expert_gating_func": 2}, (), True, "expert_gating_func"),
           ({"nextn_predict_layers": 2}, (), True, "nextn_predict_layers"),
           ({"attention.compress_ratios": [0, 0, 0, 2, 2]}, (), True, "compress_ratios"),
           ({"expert_count": 16}, (), True, "expert_count"),
           ({"hyper_connection.low_rank": 8}, (), True, "hyper_connection.low_rank"),
           ({"vocab_size": 64}, (), True, "vocab_size"), ({"eos": 2}, (), True, "eos_token_id"),
           ({}, ("blk.4.ssm_a",), True, "ssm_a"), ({}, ("blk.4.ple_key.weight",), True, "ple_key"),
           ({}, ("blk.3.attn_q.weight",), True, r"blk\.3"),
           ({}, (), "own-but-shared", "token_embd"), ({}, (), "neither", "token_embd")]


@pytest.mark.parametrize("edit,extra,shared,named", MTP_BAD)
def test_bad_mtp_file_is_refused_by_name(tmp_path, files, edit, extra, shared, named):
    if shared == "own-but-shared":
        path = write_mtp(tmp_path / "m.gguf", shared=True, edit=edit, extra=extra, own=True)
    elif shared == "neither":
        path = write_mtp(tmp_path / "m.gguf", shared=False, edit=edit, extra=extra, own=False)
    else:
        path = write_mtp(tmp_path / "m.gguf", edit=edit, extra=extra)
    with pytest.raises(InputError, match=named):
        qwen4exp_mtp_from_gguf(path, qwen4exp_from_gguf(files["gguf"]))


def test_an_hnorm_over_one_stream_is_refused(tmp_path, files):
    """hnorm is one gain per stream element [count*H]; a [H] one (the mean-of-streams layout) is refused."""
    path = write_mtp(tmp_path / "m.gguf", hnorm=H)
    with pytest.raises(InputError, match=r"hnorm.*\[64\], expected \[256\]"):
        qwen4exp_mtp_from_gguf(path, qwen4exp_from_gguf(files["gguf"]))


def test_inventory_names_the_sidecar_and_the_family_gate(files):
    """The family's gate (qwen4exp-mtp, HF mtp.* layout) is named; inventory prints no verdict of a run."""
    for key in ("gguf", "mtp"):
        m = inventory([files[key]]).models[0]
        why = "; ".join(m.why)
        assert m.verdict == MTP_SIDECAR, (key, why)
        assert "sidecar" in why and "drafter here: gate qwen4exp-mtp runs family qwen4exp's GGUF trunk" in why \
            and "MTP GGUF (sidecar) is read for inventory and plan, not run" in why, why   # the trunk runs
    r = runner.invoke(app, ["inventory", str(files["gguf"])], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "qwen4exp-mtp" in r.output and "PASS" not in r.output, r.output


def test_plan_terms_against_a_hand_count(files):
    hand_active = L * (K * 3 * H * FF + 3 * H * FF + E * H + H)       # routed k + shared + router + shared gate
    for key in ("hf", "gguf"):
        t = read_target(files[key])
        assert (t.family, t.residual_streams, t.meta["active_expert_elems"]) == ("qwen4exp", HC, hand_active)
    r = runner.invoke(app, ["plan", str(files["gguf"]), "--draft", str(files["mtp"]), "--gpu-mem", "1G",
                            "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    e = 4
    kv = e * 1 * 2 * (16 + 16)                             # 1 attention layer, 2 kv heads, K and V of 16
    rope = 2 * 4 * 4 + 8                                    # cos/sin of rotary 4, f32, + int64 position
    assert p["terms"]["per_position"] == kv + rope
    state, conv = 4 * 16 * 16, 3 * (2 * 2 * 16 + 4 * 16)   # S [nv, dk, dv], conv tail (k - 1) C
    assert p["terms"]["per_slot"] == 3 * (4 * state + e * conv)
    assert p["family"] == "qwen4exp" and p["draft_kind"] == "mtp"
    mtp_elems = sum(int(np.prod(s)) for s in _mtp_shapes())
    assert p["terms"]["draft_weights"] == e * mtp_elems
    d_kv = e * 2 * (16 + 16) + e * HC * H + 2 * 4 * 4 + 8  # its KV, the 4 raw stream rows it is fed, rope
    assert p["terms"]["draft_per_position"] == d_kv


def _mtp_shapes() -> list[tuple[int, ...]]:
    s = [(H, 2 * H), (H,), (HC * H,), (HC * H,), (R, HC * H), (HC, R)]
    for _ in ("attn", "ffn"):
        s += [(HC * H,), (R, HC * H), (HC, R), (HC, HC * H)]
    s += [(E, H), (E, FF, H), (E, FF, H), (E, H, FF), (FF, H), (128, H), (32, H), (32, H), (H, 64)]
    return s


def test_plan_prints_the_family_and_the_draft_path_gated_in_the_hf_layout_only(files):
    r = runner.invoke(app, ["plan", str(files["hf"]), "--gpu-mem", "1G"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "(qwen4exp)" in r.output, r.output
    assert "draft path: MTP head fed the 4 raw HC streams (GGUF: the separate shared MTP GGUF" in r.output, r.output
    assert "gated (qwen4exp-mtp) in the HF mtp.* layout only" in r.output, r.output


def test_plan_refuses_the_trunk_as_its_own_mtp(files):
    r = runner.invoke(app, ["plan", str(files["gguf"]), "--draft", str(files["gguf"]), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and "separate MTP GGUF" in r.output, r.output


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_loading_detects_the_family_by_the_registry(files, fmt):
    from bloomery_cli.loading import load_target

    assert load_target(files[fmt]).family == "qwen4exp"
    r = runner.invoke(app, ["gate", "run", "qwen35moe-mtp", "--target", str(files[fmt])])
    assert r.exit_code == 2 and "is a qwen4exp target" in r.output and "Traceback" not in r.output, r.output


def test_plan_takes_the_hf_mtp_layer_as_the_draft(files):
    r = runner.invoke(app, ["plan", str(files["hf"]), "--draft", str(files["hf"]), "--gpu-mem", "1G", "--dtype",
                            "f32", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["draft_kind"] == "mtp" and p["terms"]["draft_weights"] == 4 * (H * H + H * HC * H + E * H)
