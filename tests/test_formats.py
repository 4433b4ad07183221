"""Checkpoint readers: tensors round-trip (HF, sharded HF, GGUF f32/f16/q8_0/...), spec numbers, laziness."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest_formats import (
    TINY,
    encode,
    gguf_meta,
    make_dflash,
    make_qwen3_gguf,
    make_qwen3_hf,
    write_gguf,
    write_tokenizer,
)

from bloomery_cli.formats.dflash import default_target_layer_ids
from bloomery_cli.formats.gguf_file import GGUFFile, hf_name
from bloomery_cli.formats.lazy import LazyTensors
from bloomery_cli.loading import load_dflash, load_target, load_tokenizer

Q = gguf.GGMLQuantizationType


def _check_numbers(spec, fmt: str, tied: bool = False) -> None:
    assert spec.family == "qwen3" and spec.source_format == fmt
    s = spec.layer
    assert (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size) == (16, 2, 1, 8, 32)
    assert s.rms_eps == 1e-6 and s.rope_theta == 1e6
    assert (spec.num_layers, spec.vocab_size, spec.max_position) == (2, 64, 128)
    assert spec.tie_word_embeddings is tied and spec.hidden_size == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hf_roundtrip_and_numbers(tmp_path, dtype):
    path, want = make_qwen3_hf(tmp_path / "m", dtype=dtype)
    spec = load_target(path)
    _check_numbers(spec, "hf")
    assert isinstance(spec.tensors, LazyTensors) and not spec.tensors._cache  # nothing read yet
    assert set(spec.tensors) == set(want)
    for name, t in want.items():
        got = spec.tensors[name]
        assert got.dtype == dtype and torch.equal(got, t), name
    assert torch.equal(spec.head_weight(), want["lm_head.weight"])


def test_hf_sharded_roundtrip(tmp_path):
    path, want = make_qwen3_hf(tmp_path / "m", shards=3)
    assert len(list(path.glob("*.safetensors"))) == 3
    spec = load_target(str(path))
    assert len({spec.tensors.file_of(n) for n in spec.tensors}) == 3
    for name, t in want.items():
        assert torch.equal(spec.tensors[name], t), name


def test_hf_tied(tmp_path):
    path, want = make_qwen3_hf(tmp_path / "m", tied=True)
    spec = load_target(path)
    _check_numbers(spec, "hf", tied=True)
    assert "lm_head.weight" not in spec.tensors
    assert torch.equal(spec.head_weight(), want["model.embed_tokens.weight"])


def test_hf_ignores_pickles_beside_safetensors_and_auto_map(tmp_path):
    path, _ = make_qwen3_hf(tmp_path / "m")
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04 not for reading")
    sentinel = tmp_path / "executed"
    (path / "modeling_evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    import json
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil"}
    (path / "config.json").write_text(json.dumps(cfg))
    spec = load_target(path)
    assert spec.num_layers == 2 and not sentinel.exists()


def test_hf_rope_parameters_form(tmp_path):
    import json
    path, _ = make_qwen3_hf(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_target(path).layer.rope_theta == 5e5


def test_gguf_name_mapping():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("blk.1.attn_q.weight") == "model.layers.1.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("rope_freqs.weight") == "rope_freqs.weight"


def test_gguf_f32_roundtrip_and_orientation(tmp_path):
    path, want = make_qwen3_gguf(tmp_path / "m.gguf")
    # the file itself stores ggml order: HF [out, in] = k_proj [8, 16] is ggml ne (16, 8)
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert raw["blk.0.attn_k.weight"].shape.tolist() == [16, 8]
    spec = load_target(path)
    _check_numbers(spec, "gguf")
    assert spec.tensors.shape_of("model.layers.0.self_attn.k_proj.weight") == (8, 16)
    assert set(spec.tensors) == set(want)
    for name, t in want.items():
        got = spec.tensors[name]
        assert got.dtype == torch.float32 and torch.equal(got, t), name


def test_gguf_f16_roundtrip(tmp_path):
    path, want = make_qwen3_gguf(tmp_path / "m.gguf", qtype=lambda n, a: Q.F16 if a.ndim == 2 else Q.F32)
    spec = load_target(path)
    assert spec.tensors.dtype_of("model.layers.1.mlp.up_proj.weight") == "F16"
    for name, t in want.items():
        exp = t.half().float() if t.ndim == 2 else t
        assert torch.equal(spec.tensors[name], exp), name


def test_gguf_q8_0_roundtrip_tied(tmp_path):
    shape = dict(H=32, heads=4, kv=2, d=8, I=64, V=64)
    path, want = make_qwen3_gguf(tmp_path / "m.gguf", tied=True,
                                 qtype=lambda n, a: Q.Q8_0 if a.ndim == 2 else Q.F32, **shape)
    spec = load_target(path)
    assert spec.tie_word_embeddings and "lm_head.weight" not in spec.tensors
    assert spec.layer.hidden_size == 32 and spec.layer.num_kv_heads == 2 and spec.vocab_size == 64
    quantized = 0
    for name, t in want.items():
        a = t.numpy()
        exp = gguf.quants.dequantize(encode(a, Q.Q8_0), Q.Q8_0) if a.ndim == 2 else a
        if a.ndim == 2:
            assert spec.tensors.dtype_of(name) == "Q8_0"
            quantized += 1
        np.testing.assert_array_equal(spec.tensors[name].numpy(), exp, err_msg=name)
    assert quantized == 1 + 2 * 7
    assert torch.allclose(spec.head_weight(), want["model.embed_tokens.weight"], atol=0.05)


@pytest.mark.parametrize("qtype", [Q.BF16, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.MXFP4, Q.Q4_0])
def test_gguf_dequant_types(tmp_path, qtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 256)).astype(np.float32)
    try:
        data = gguf.quants.quantize(a, qtype)
    except NotImplementedError:  # no quantizer in gguf-py: random blocks still test the plumbing
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        data = rng.integers(0, 256, (3, 256 // block * size), dtype=np.uint8)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tensor("w", data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = GGUFFile(path).tensors()
    assert t.shape_of("w") == (3, 256) and t.dtype_of("w") == qtype.name
    np.testing.assert_array_equal(t["w"].numpy(), gguf.quants.dequantize(data, qtype))


def test_gguf_metadata_values(tmp_path):
    meta = gguf_meta() | {"general.name": ("str", "tiny"), "tokenizer.ggml.tokens": ("arr", ["a", "b"])}
    path = write_gguf(tmp_path / "m.gguf", {"x": np.zeros((2, 3), np.float32)}, meta)
    f = GGUFFile(path)
    assert f.meta("general.architecture") == "qwen3" and f.meta("general.name") == "tiny"
    assert f.meta("qwen3.block_count") == 2 and isinstance(f.meta("qwen3.block_count"), int)
    assert f.meta("qwen3.attention.layer_norm_rms_epsilon") == 1e-6
    assert f.meta("tokenizer.ggml.tokens") == ["a", "b"]
    assert f.meta("nope", 7) == 7
    with pytest.raises(KeyError):
        f.meta("nope")


def test_gguf_and_hf_agree(tmp_path):
    hf, _ = make_qwen3_hf(tmp_path / "m", seed=3)
    gg, _ = make_qwen3_gguf(tmp_path / "m.gguf", seed=3)
    a, b = load_target(hf), load_target(gg)
    assert a.layer == b.layer and a.num_layers == b.num_layers and a.vocab_size == b.vocab_size
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]), name


def test_default_target_layer_ids():
    assert default_target_layer_ids(5, 36) == (1, 9, 17, 25, 33)  # z-lab Qwen3-8B drafter
    assert default_target_layer_ids(1, 36) == (18,)
    assert default_target_layer_ids(1, 2) == (1,)
    assert default_target_layer_ids(3, 28) == (1, 13, 25)


def test_dflash_load(tmp_path):
    target = load_target(make_qwen3_hf(tmp_path / "t")[0])
    path, want = make_dflash(tmp_path / "d", n=2, depth=2, layer_ids=[0, 1], block=8, mask=60)
    d = load_dflash(path, target)
    assert d.kind == "dflash" and d.num_layers == 2 and d.block_size == 8 and d.mask_token_id == 60
    assert d.target_layer_ids == (0, 1) and d.vocab_size == 64
    assert (d.layer.hidden_size, d.layer.num_heads, d.layer.head_dim) == (16, 2, 8)
    for name, t in want.items():
        assert torch.equal(d.tensors[name], t), name


def test_dflash_defaults_and_nested_block_size(tmp_path):
    target = load_target(make_qwen3_hf(tmp_path / "t")[0])
    path, _ = make_dflash(tmp_path / "d", n=1, layer_ids=None, block=None,
                          dflash_config={"mask_token_id": 5, "block_size": 16})
    d = load_dflash(path, target)
    assert d.target_layer_ids == (1,) and d.block_size == 16 and d.mask_token_id == 5


def test_tokenizer_beside_dir_and_gguf(tmp_path):
    hf, _ = make_qwen3_hf(tmp_path / "m")
    write_tokenizer(hf / "tokenizer.json")
    assert load_tokenizer(hf).encode("w1 w2").ids == [1, 2]
    (tmp_path / "g").mkdir()
    gg, _ = make_qwen3_gguf(tmp_path / "g" / "m.gguf")
    write_tokenizer(gg.parent / "tokenizer.json")
    assert load_tokenizer(gg).get_vocab_size() == TINY["V"]
