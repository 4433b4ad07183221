"""Every bad input is a named InputError subclass whose one-line message names the file/key/tensor."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from conftest_formats import (
    dflash_config,
    gguf_meta,
    make_dflash,
    make_qwen3_gguf,
    make_qwen3_hf,
    qwen3_config,
    qwen3_tensors,
    write_gguf,
    write_hf,
)
from safetensors.torch import save_file

from bloomery_cli.loading import load_dflash, load_target, load_tokenizer
from bloomery_gates.errors import BadConfig, BadTensor, InputError, Mismatch, MissingFile, Refused


def raises(exc: type[InputError], fn, *args, contains: tuple[str, ...] = ()) -> str:
    with pytest.raises(exc) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in contains:
        assert str(part) in msg, (part, msg)
    return msg


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture
def hf(tmp_path) -> Path:
    return make_qwen3_hf(tmp_path / "target")[0]


@pytest.fixture
def target(hf):
    return load_target(hf)


# --- paths and files ---------------------------------------------------------------------------

def test_nonexistent_path(tmp_path):
    raises(MissingFile, load_target, tmp_path / "nope", contains=("nope", "no such file"))


def test_missing_config(hf):
    (hf / "config.json").unlink()
    raises(MissingFile, load_target, hf, contains=("config.json",))


def test_unparseable_config(hf):
    (hf / "config.json").write_text("{not json")
    raises(InputError, load_target, hf, contains=("config.json", "cannot parse"))


def test_no_weights(hf):
    (hf / "model.safetensors").unlink()
    raises(MissingFile, load_target, hf, contains=("safetensors",))


def test_truncated_safetensors(hf):
    f = hf / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    raises(InputError, load_target, hf, contains=("model.safetensors", "truncated"))


def test_missing_shard(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "m", shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    raises(MissingFile, load_target, path, contains=("model-00002-of-00002.safetensors",))


def test_pickle_dir_refused(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04garbage")
    raises(Refused, load_target, d, contains=("pytorch_model.bin", "never unpickle", "safetensors"))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_file_refused(tmp_path, suffix):
    f = tmp_path / f"model{suffix}"
    f.write_bytes(b"\x80\x04garbage")
    raises(Refused, load_target, f, contains=(f.name, "never unpickle"))


def test_plain_file_not_a_checkpoint(tmp_path):
    f = tmp_path / "weights.txt"
    f.write_text("hello")
    raises(InputError, load_target, f, contains=("weights.txt", "HF directory"))


# --- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"])
def test_missing_key(hf, key):
    edit_config(hf, **{key: None})
    raises(BadConfig, load_target, hf, contains=("config.json", f"key {key}", "missing"))


def test_bad_key_type(hf):
    edit_config(hf, hidden_size="sixteen")
    raises(BadConfig, load_target, hf, contains=("hidden_size", "'sixteen'", "integer"))


def test_other_model_type(hf):
    edit_config(hf, model_type="llama")
    raises(BadConfig, load_target, hf, contains=("model_type", "'llama'", "qwen3"))


def test_heads_not_multiple_of_kv(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "m", heads=3, kv=2)
    raises(BadConfig, load_target, path, contains=("num_key_value_heads", "3"))


@pytest.mark.parametrize("change, key", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
])
def test_unsupported_features(hf, change, key):
    edit_config(hf, **change)
    raises(BadConfig, load_target, hf, contains=(key,))


# --- tensors -----------------------------------------------------------------------------------

def test_wrong_shape(tmp_path):
    t = qwen3_tensors()
    t["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 16)
    path = write_hf(tmp_path / "m", t, qwen3_config())
    raises(BadTensor, load_target, path,
           contains=("model.layers.1.self_attn.k_proj.weight", "[16, 16]", "expected [8, 16]", "model.safetensors"))


def test_missing_tensor(tmp_path):
    t = qwen3_tensors()
    del t["model.layers.0.self_attn.q_norm.weight"]
    path = write_hf(tmp_path / "m", t, qwen3_config())
    raises(BadTensor, load_target, path, contains=("model.layers.0.self_attn.q_norm.weight", "missing", "[8]"))


def test_untied_without_lm_head(tmp_path):
    path = write_hf(tmp_path / "m", qwen3_tensors(tied=True), qwen3_config(tied=False))
    raises(BadTensor, load_target, path, contains=("lm_head.weight", "missing"))


def test_unsupported_dtype(tmp_path):
    t = qwen3_tensors()
    t["model.norm.weight"] = torch.ones(16, dtype=torch.int64)
    t["extra.counter"] = torch.arange(3)  # an unneeded int tensor is fine until someone asks for it
    path = write_hf(tmp_path / "m", t, qwen3_config())
    raises(BadTensor, load_target, path, contains=("model.norm.weight", "I64"))


def test_unneeded_odd_dtype_is_lazy(tmp_path):
    t = qwen3_tensors() | {"extra.counter": torch.arange(3)}
    spec = load_target(write_hf(tmp_path / "m", t, qwen3_config()))
    with pytest.raises(BadTensor, match="extra.counter.*I64"):
        spec.tensors["extra.counter"]


def test_duplicate_tensor_across_files(hf):
    save_file({"model.norm.weight": torch.ones(16)}, str(hf / "extra.safetensors"))
    raises(BadTensor, load_target, hf, contains=("model.norm.weight", "also stored"))


# --- gguf --------------------------------------------------------------------------------------

def test_truncated_gguf(tmp_path):
    path, _ = make_qwen3_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    for n in (len(data) - 64, len(data) // 2, 40, 3):
        path.write_bytes(data[:n])
        raises(InputError, load_target, path, contains=("m.gguf", "GGUF"))


def test_gguf_other_arch(tmp_path):
    t = {"token_embd.weight": np.zeros((4, 16), np.float32)}
    path = write_gguf(tmp_path / "l.gguf", t, gguf_meta("llama"), arch="llama", rename=str)
    raises(Refused, load_target, path, contains=("l.gguf", "'llama'", "qwen3"))


def test_gguf_missing_key(tmp_path):
    meta = gguf_meta()
    del meta["qwen3.feed_forward_length"]
    path = write_gguf(tmp_path / "m.gguf", qwen3_tensors(), meta)
    raises(BadConfig, load_target, path, contains=("qwen3.feed_forward_length", "missing"))


def test_gguf_wrong_shape_names_both(tmp_path):
    t = qwen3_tensors()
    t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(16, 16)
    path = write_gguf(tmp_path / "m.gguf", t, gguf_meta())
    raises(BadTensor, load_target, path,
           contains=("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", "expected [32, 16]"))


def test_gguf_unsupported_type(tmp_path):
    t = qwen3_tensors()
    t["model.norm.weight"] = np.arange(16, dtype=np.int32)
    path = write_gguf(tmp_path / "m.gguf", t, gguf_meta(),
                      qtype=lambda n, a: gguf.GGMLQuantizationType.I32 if a.dtype == np.int32 else
                      gguf.GGMLQuantizationType.F32)
    raises(BadTensor, load_target, path, contains=("output_norm.weight", "I32", "not supported"))


# --- dflash draft ------------------------------------------------------------------------------

def test_draft_wrong_hidden(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", H=32)
    msg = raises(Mismatch, load_dflash, path, target, contains=("hidden_size 32", "16"))
    assert str(path) in msg and str(target.source) in msg


def test_draft_mask_id_out_of_vocab(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", mask=64)
    raises(Mismatch, load_dflash, path, target, contains=("mask_token_id 64", "vocab 64"))


@pytest.mark.parametrize("ids", [[2], [-2]])
def test_draft_layer_id_out_of_range(tmp_path, target, ids):
    path, _ = make_dflash(tmp_path / "d", layer_ids=ids)
    raises(Mismatch, load_dflash, path, target, contains=("target_layer_ids", str(ids[0]), "0..1"))


def test_draft_default_ids_follow_the_draft_depth(tmp_path, target):
    # z-lab builds the default ids from num_hidden_layers (one per draft layer), never from the fc width: a
    # 1-layer draft with a 2-feature fc and no target_layer_ids fails to load there, and is refused here
    path, _ = make_dflash(tmp_path / "d", n=2, layer_ids=None)
    raises(Mismatch, load_dflash, path, target,
           contains=("target_layer_ids is absent", "num_hidden_layers 1", "fc.weight [16, 16]"))
    path, _ = make_dflash(tmp_path / "d2", n=2, depth=2, layer_ids=None)   # consistent: L=2 -> [1, -1]
    assert load_dflash(path, target).target_layer_ids == (1, -1)


def test_draft_layer_id_minus_one_is_the_embedding_output(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", n=2, layer_ids=[-1, 1])
    assert load_dflash(path, target).target_layer_ids == (-1, 1)


def test_draft_ids_vs_fc_columns(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", n=2, layer_ids=[0, 1, 1])
    raises(Mismatch, load_dflash, path, target, contains=("3 layers", "fc.weight", "32"))


def test_draft_fc_not_multiple_of_hidden(tmp_path, target):
    path, t = make_dflash(tmp_path / "d")
    t["fc.weight"] = torch.zeros(16, 20)
    write_hf(path, t, dflash_config())
    raises(Mismatch, load_dflash, path, target, contains=("fc.weight", "[16, 20]"))


def test_draft_vocab_and_target_layers(tmp_path, target):
    path, _ = make_dflash(tmp_path / "d", vocab_size=100)
    raises(Mismatch, load_dflash, path, target, contains=("vocab_size 100", "64"))
    path, _ = make_dflash(tmp_path / "e", num_target_layers=36)
    raises(Mismatch, load_dflash, path, target, contains=("num_target_layers 36", "2"))


def test_draft_config_errors(tmp_path, target):
    path, _ = make_dflash(tmp_path / "a", dflash_config={"target_layer_ids": [1]})
    raises(BadConfig, load_dflash, path, target, contains=("dflash_config.mask_token_id", "missing"))
    path, _ = make_dflash(tmp_path / "b", block=None)
    raises(BadConfig, load_dflash, path, target, contains=("block_size", "missing"))
    path, _ = make_dflash(tmp_path / "c", block=4, dflash_config={"mask_token_id": 1, "block_size": 8})
    raises(BadConfig, load_dflash, path, target, contains=("block_size", "8", "4"))
    path, _ = make_dflash(tmp_path / "e", architectures=["Qwen3ForCausalLM"])
    raises(BadConfig, load_dflash, path, target, contains=("architectures", "DFlashDraftModel"))
    path, _ = make_dflash(tmp_path / "f", dflash_config={"mask_token_id": 1, "causal": True})
    raises(BadConfig, load_dflash, path, target, contains=("dflash_config.causal",))


def test_draft_missing_layer_tensor(tmp_path, target):
    path, t = make_dflash(tmp_path / "d")
    del t["layers.0.mlp.down_proj.weight"]
    (path / "model.safetensors").unlink()
    write_hf(path, t, dflash_config())
    raises(BadTensor, load_dflash, path, target, contains=("layers.0.mlp.down_proj.weight", "missing"))


def test_draft_path_is_a_file(tmp_path, target):
    f = tmp_path / "draft.safetensors"
    f.write_bytes(b"x")
    raises(InputError, load_dflash, f, target, contains=("draft.safetensors",))


# --- tokenizer ---------------------------------------------------------------------------------

def test_missing_tokenizer(hf, tmp_path):
    raises(MissingFile, load_tokenizer, hf, contains=("tokenizer.json",))
    gg, _ = make_qwen3_gguf(tmp_path / "m.gguf")
    raises(MissingFile, load_tokenizer, gg, contains=("tokenizer.json", "beside the GGUF"))


def test_bad_tokenizer(hf):
    (hf / "tokenizer.json").write_text("{}")
    raises(InputError, load_tokenizer, hf, contains=("tokenizer.json", "cannot parse"))
