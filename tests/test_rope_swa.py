"""Scaled RoPE (yarn, linear) and sliding-window DFlash layers: the math against transformers' own code, the
readers, and every key we cannot act on refused with a named exit-2 error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest_formats import make_dflash, make_qwen3_hf, write_tokenizer
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.qwen3.reader import layer_shape_from_hf
from bloomery_cli.formats.config import Cfg
from bloomery_cli.loading import load_dflash, load_target
from bloomery_gates.errors import BadConfig
from bloomery_gates.kernels.ops import attention as katt
from bloomery_gates.kernels.ops import rope as krope
from bloomery_gates.reference.ops import attention as ratt
from bloomery_gates.reference.ops import rope as rrope
from bloomery_gates.spec import RopeScaling

ROPES = [  # (HF rope_parameters, our RopeScaling)
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, RopeScaling("yarn", 4.0, 128)),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0, "beta_slow": 2.0,
      "mscale": 0.707, "mscale_all_dim": 0.5}, RopeScaling("yarn", 8.0, 64, 16.0, 2.0, None, 0.707, 0.5)),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096, "attention_factor": 1.3,
      "truncate": False}, RopeScaling("yarn", 2.0, 4096, attention_factor=1.3, truncate=False)),
    ({"rope_type": "linear", "factor": 2.5}, RopeScaling("linear", 2.5)),
]


@pytest.mark.parametrize("hf, ours", ROPES)
@pytest.mark.parametrize("head_dim, theta", [(32, 1e4), (128, 1e6)])
def test_inv_freq_and_attention_factor_match_transformers(hf, ours, head_dim, theta):
    tf = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from bloomery_cli.oracle.hf import Float32AsFloat64

    cfg = tf.Qwen3Config(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=1024, rope_parameters={**hf, "rope_theta": theta})
    with Float32AsFloat64():
        want, factor = ROPE_INIT_FUNCTIONS[hf["rope_type"]](cfg)
    want = want.double().numpy()
    ref = rrope.inv_freq(head_dim, theta, ours)
    assert np.max(np.abs(ref - want) / want) < 1e-14
    assert np.max(np.abs(krope.inv_freq(head_dim, theta, ours).numpy() - want) / want) < 1e-14
    assert rrope.attention_factor(ours) == pytest.approx(factor, rel=1e-15)
    assert krope.attention_factor(ours) == pytest.approx(factor, rel=1e-15)
    default = rrope.inv_freq(head_dim, theta)
    assert not np.allclose(ref, default)               # the scaling changes the table


def test_tables_carry_the_attention_factor():
    ours = ROPES[0][1]
    cos, sin = krope.rope_tables(32, 1e4, 50, "cpu", ours)
    rc, rs = rrope.cos_sin(np.arange(50), 32, 1e4, ours)
    assert np.allclose(cos.numpy(), rc, atol=1e-6) and np.allclose(sin.numpy(), rs, atol=1e-6)
    assert np.allclose(cos[0].numpy(), rrope.attention_factor(ours))          # cos(0) * a


@pytest.mark.parametrize("s, b, w", [(56, 8, 16), (10, 8, 4), (3, 8, 1), (5, 4, 40), (20, 16, 9)])
def test_sliding_mask_matches_transformers(s, b, w):
    pytest.importorskip("transformers")
    from bloomery_gates.gates.swa_oracle import transformers_mask

    pos_q, pos_kv = np.arange(s, s + b), np.arange(s + b)
    want = transformers_mask(pos_q, pos_kv, w)
    assert np.array_equal(ratt.sliding_mask(pos_q, pos_kv, w), want)
    import torch
    got = katt.sliding_mask(torch.as_tensor(pos_q), torch.as_tensor(pos_kv), w).numpy()
    assert np.array_equal(got, want)
    assert want.sum(axis=1).tolist() == [min(w, p + 1) for p in pos_q]      # W keys, the query's own included


# --- readers ------------------------------------------------------------------------------------------------

def edit(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_target_reads_yarn_and_linear(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "t")
    edit(path, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 8})
    r = load_target(path).layer.rope_scaling
    assert (r.kind, r.factor, r.original_max_position, r.beta_fast, r.beta_slow) == ("yarn", 4.0, 32, 8.0, 1.0)
    edit(path, original_max_position_embeddings=16)        # the top-level key wins, as in transformers
    assert load_target(path).layer.rope_scaling.original_max_position == 16
    edit(path, rope_scaling=None, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    layer = load_target(path).layer
    assert layer.rope_scaling == RopeScaling("linear", 2.0) and layer.rope_theta == 5e5


@pytest.mark.parametrize("rope, key", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type"),
    ({"rope_type": "longrope", "factor": 2.0}, "rope_scaling.rope_type"),
    ({"rope_type": "llama3", "factor": 8.0}, "rope_scaling.rope_type"),
    ({"rope_type": "yarn"}, "rope_scaling.factor"),
    ({"rope_type": "yarn", "factor": 0.0}, "rope_scaling.factor"),
    ({"rope_type": "yarn", "factor": 4.0, "low_freq_factor": 1.0}, "rope_scaling.low_freq_factor"),
    ({"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 64},
     "rope_scaling.original_max_position_embeddings"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, "rope_scaling.partial_rotary_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "yes"}, "rope_scaling.truncate"),
])
def test_rope_keys_we_cannot_act_on_are_named(tmp_path, rope, key):
    path, _ = make_qwen3_hf(tmp_path / "t")
    edit(path, rope_scaling=rope)
    with pytest.raises(BadConfig, match=key.replace(".", r"\.")):
        load_target(path)


def test_two_different_scalings_refused(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "t")
    edit(path, rope_scaling={"rope_type": "linear", "factor": 2.0},
         rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
    with pytest.raises(BadConfig, match="differs from rope_parameters"):
        load_target(path)


@pytest.fixture
def target(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "t")
    return load_target(path)


def test_draft_reads_sliding_layers(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", depth=2, layer_ids=[0, 1], n=2,
                          layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    assert load_dflash(path, target).windows == (4, None)
    edit(path, layer_types=["full_attention", "full_attention"])
    assert load_dflash(path, target).windows == ()


@pytest.mark.parametrize("over, key", [
    ({"layer_types": ["sliding_attention"], "sliding_window": 4}, "layer_types"),            # depth 2
    ({"layer_types": ["sliding_attention", "chunked_attention"], "sliding_window": 4}, "layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 0}, "sliding_window"),
    ({"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window"),
    ({"layer_types": ["sliding_attention"] * 2, "sliding_window": 4,
      "dflash_config": {"mask_token_id": 63, "target_layer_ids": [0, 1], "causal": False}}, "dflash_config.causal"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": [0, 1], "use_swa": True}}, "dflash_config.use_swa"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": [0, 1], "swa_window_size": 8}},
     "dflash_config.swa_window_size"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": [0, 1], "attention_sink_bias": True}},
     "dflash_config.attention_sink_bias"),
])
def test_sliding_keys_we_cannot_act_on_are_named(tmp_path, target, over, key):
    path, _ = make_dflash(tmp_path / "d", depth=2, layer_ids=[0, 1], n=2, **over)
    with pytest.raises(BadConfig, match=key.replace(".", r"\.")):
        load_dflash(path, target)


def test_other_readers_still_refuse_sliding_layers():
    """DFlash2, DSpark, EAGLE-3, the speculators layouts and targets read layers through the default, which
    refuses sliding layers (their kernels have no window)."""
    data = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "intermediate_size": 32, "layer_types": ["sliding_attention"], "sliding_window": 4}
    with pytest.raises(BadConfig, match="layer_types"):
        layer_shape_from_hf(Cfg(data, "config.json"))


def test_cli_exit_2_on_an_unsupported_rope(tmp_path):
    target, _ = make_qwen3_hf(tmp_path / "t")
    write_tokenizer(target / "tokenizer.json")
    edit(target, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    draft, _ = make_dflash(tmp_path / "d")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3, 4]}) + "\n")
    r = CliRunner().invoke(app, ["gate", "run", "qwen3-dflash", "--target", str(target), "--draft", str(draft),
                                 "--prompts", str(prompts)], catch_exceptions=False)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "rope_scaling.rope_type" in r.output and "'dynamic'" in r.output
    assert len([line for line in r.output.splitlines() if line.strip()]) == 1, r.output


# --- the speculators layout: speculators' window rule -------------------------------------------------------

@pytest.mark.parametrize("s, b, w, non_causal", [(56, 8, 16, False), (56, 8, 16, True), (3, 8, 5, False),
                                                 (20, 4, 1, True)])
def test_anchored_mask_matches_speculators(s, b, w, non_causal):
    pytest.importorskip("speculators")
    import torch
    from speculators.models.dflash.attention import create_anchor_block_mask_mod

    mod, q_len, kv_len = create_anchor_block_mask_mod(torch.zeros(s + b + 1, dtype=torch.long), s + b + 1,
                                                      torch.tensor([s]), b, w, non_causal)
    zero = torch.zeros((), dtype=torch.long)
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    full = mod(zero, zero, q, kv).expand(q_len, kv_len).numpy()        # kv: [packed base T ; the block]
    want = np.concatenate([full[:, :s], full[:, s + b + 1:]], axis=1)   # our keys: context 0..s-1 ; block
    assert not full[:, s:s + b + 1].any()                               # base rows >= s are never seen
    pos_q, pos_kv = np.arange(s, s + b), np.arange(s + b)
    assert np.array_equal(ratt.anchored_mask(pos_q, pos_kv, s, w, causal=not non_causal), want)
    got = katt.anchored_mask(torch.as_tensor(pos_q), torch.as_tensor(pos_kv), s, w, causal=not non_causal)
    assert np.array_equal(got.numpy() & (pos_kv[None, :] < s + b), want)


def test_speculators_layout_reads_sliding_layers(tmp_path):
    from bloomery_gates.gates.fixtures import FIXTURES

    src = FIXTURES / "qwen3-tiny-dflash-b8-swa-speculators"
    if not src.is_dir():
        pytest.skip("fixtures/ not built")
    import shutil
    path = tmp_path / "d"
    shutil.copytree(src, path)
    target = load_target(FIXTURES / "qwen3-tiny")
    d = load_dflash(path, target)
    assert (d.windows, d.window_rule) == ((16, 16), "anchor")
    edit(path, sliding_window_non_causal=True)
    assert load_dflash(path, target).window_rule == "anchor-bidir"
    cfg = json.loads((path / "config.json").read_text())
    for change, key in [({"sliding_window": None}, "sliding_window"), ({"layer_types": ["sliding_attention"]},
                                                                       "layer_types")]:
        (path / "config.json").write_text(json.dumps({**cfg, "transformer_layer_config":
                                                      {**cfg["transformer_layer_config"], **change}}))
        with pytest.raises(BadConfig, match=f"transformer_layer_config\\.{key}"):
            load_dflash(path, target)


def test_bidirectional_speculators_window_runs_in_the_reference():
    """anchor-bidir (sliding_window_non_causal true): a full [B, s+B] mask, kernel and reference equal."""
    import torch

    from bloomery_gates.reference.ops.attention import attention

    s, b = 12, 4
    pos_q, pos_kv = np.arange(s, s + b), np.arange(s + b)
    mask = ratt.anchored_mask(pos_q, pos_kv, s, 5, causal=False)
    assert mask.shape == (b, s + b) and mask.sum(axis=1).tolist() == [5 + b] * b
    got = katt.anchored_mask(torch.as_tensor(pos_q), torch.as_tensor(pos_kv), s, 5, causal=False)
    assert got.shape == (b, s + b) and np.array_equal(got.numpy(), mask)
    rng = np.random.default_rng(0)
    out = attention(rng.standard_normal((b, 2, 8)), rng.standard_normal((s + b, 1, 8)),
                    rng.standard_normal((s + b, 1, 8)), mask)
    assert out.shape == (b, 2, 8)
