"""deepseek4 (DeepSeek V4) HF files, issue 26: the tiny checkpoint of tests/deepseek4_factory.py read back key by key,
the legacy spellings (compress_ratios, compress_rate_*, num_hash_layers, partial_rotary_factor, nested
rope_parameters) read the same, each bad key a one-line exit 2 naming it, the hash table's dtype and shape checked,
and the loader detecting the family by the registry."""

from __future__ import annotations

from pathlib import Path

import deepseek4_factory as fac
import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_gates.errors import InputError
from bloomery_gates.spec import RopeScaling

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return fac.write(tmp_path_factory.mktemp("ds4files") / "ok", dtype=torch.bfloat16)


def test_reads_back_every_key(ckpt):
    s = deepseek4_from_hf(ckpt)
    a = s.attn
    assert (s.family, s.num_layers, s.vocab_size, s.hidden_size, s.tie_word_embeddings) == ("deepseek4", fac.L,
                                                                                            fac.V, fac.H, False)
    assert s.layer_types == ("sliding", "csa", "hca", "csa") and s.mlp_types == ("hash", "moe", "moe", "moe")
    assert (a.num_heads, a.head_dim, a.rope_dim, a.q_lora_rank, a.o_groups, a.o_lora_rank, a.window) == (
        fac.NH, fac.D, fac.R, fac.QL, fac.G, fac.OL, fac.WINDOW)
    assert (a.rope_theta, a.compress_theta, a.csa_rate, a.hca_rate) == (1e4, 1.6e5, fac.CSA, fac.HCA)
    assert (a.index_heads, a.index_head_dim, a.index_topk) == (fac.NI, fac.DI, fac.TOPK)
    assert a.compress_scaling == RopeScaling("yarn", 4.0, 16, 32.0, 1.0, attention_factor=1.0)
    m = s.moe
    assert (m.num_experts, m.top_k, m.expert_ff, m.shared_ff, m.router, m.routed_scale) == (
        fac.E, fac.K, fac.FF, fac.FF, "sqrtsoftplus", 1.5)
    assert (s.hc.count, s.hc.sinkhorn_iters, s.hc.eps, s.swiglu_limit, s.mtp_layers) == (fac.S, 20, 1e-6, 10.0, 0)


def test_legacy_spellings_read_the_same(tmp_path, ckpt):
    """compress_rate_csa / _hca for compress_rates, num_hash_layers for mlp_layer_types, partial_rotary_factor for
    qk_rope_head_dim, the nested {main, compress} rope_parameters for the flat rope_scaling."""
    cfg = {k: v for k, v in fac.CONFIG.items()
           if k not in ("compress_rates", "mlp_layer_types", "qk_rope_head_dim", "rope_scaling")}
    cfg |= {"compress_rate_csa": fac.CSA, "compress_rate_hca": fac.HCA, "num_hash_layers": 1,
            "partial_rotary_factor": fac.R / fac.D,
            "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                                "compress": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                             "original_max_position_embeddings": 16, "rope_theta": 1.6e5}}}
    d = tmp_path / "legacy"
    d.mkdir()
    (d / "config.json").write_text(__import__("json").dumps(cfg))
    (d / "model.safetensors").symlink_to(ckpt / "model.safetensors")
    a, b = deepseek4_from_hf(ckpt), deepseek4_from_hf(d)
    assert (a.layer_types, a.mlp_types, a.attn, a.moe, a.hc) == (b.layer_types, b.mlp_types, b.attn, b.moe, b.hc)


def test_compress_ratios_map_to_the_kinds(tmp_path):
    cfg = {k: v for k, v in fac.CONFIG.items() if k != "layer_types"} | {"compress_ratios": [0, 4, 128, 4, 0]}
    d = fac.write(tmp_path / "r", config=cfg)
    (d / "config.json").write_text(__import__("json").dumps(cfg))
    assert deepseek4_from_hf(d).layer_types == ("sliding", "csa", "hca", "csa")


HF_BAD = [("num_key_value_heads", 2), ("o_groups", 3), ("qk_rope_head_dim", 7), ("qk_rope_head_dim", 64),
          ("layer_types", ["sliding_attention"] * 3), ("layer_types", ["full_attention"] * 4),
          ("mlp_layer_types", ["dense"] * 4), ("compress_rates", {"full": 2}), ("scoring_func", "sigmoid"),
          ("norm_topk_prob", False), ("num_experts_per_tok", 9), ("n_shared_experts", 2), ("hc_mult", 1),
          ("hc_eps", 0), ("attention_bias", True), ("rope_scaling", {"type": "dynamic", "factor": 2.0}),
          ("compress_ratios", [0, 2, 128, 4]), ("model_type", "deepseek_v3"), ("hidden_act", "gelu"),
          ("mlp_bias", True)]


@pytest.mark.parametrize("key,value", HF_BAD)
def test_bad_hf_key_exits_2_naming_it(tmp_path, key, value):
    cfg = {**fac.CONFIG, key: value}
    if key == "compress_ratios":
        cfg.pop("layer_types")
    d = fac.write(tmp_path / "bad", config=cfg)
    (d / "config.json").write_text(__import__("json").dumps(cfg))
    with pytest.raises(InputError, match=key):
        deepseek4_from_hf(d)
    r = runner.invoke(app, ["gate", "run", "qwen35moe-mtp", "--target", str(d)])
    assert r.exit_code == 2 and key in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("defect", ["float table", "short table", "no table"])
def test_the_hash_table_is_checked(tmp_path, defect):
    def edit(p):
        name = "model.layers.0.mlp.gate.tid2eid"
        if defect == "float table":
            p[name] = p[name].float()
        elif defect == "short table":
            p[name] = p[name][:-1]
        else:
            del p[name]
    d = fac.write(tmp_path / "t", edit=edit)
    with pytest.raises(InputError, match=r"model\.layers\.0\.mlp\.gate\.tid2eid"):
        deepseek4_from_hf(d)


def test_loading_detects_the_family_by_the_registry(ckpt):
    from bloomery_cli.loading import load_target

    assert load_target(ckpt).family == "deepseek4"
    r = runner.invoke(app, ["gate", "run", "qwen35moe-mtp", "--target", str(ckpt)])
    assert r.exit_code == 2 and "is a deepseek4 target" in r.output and "Traceback" not in r.output, r.output
