"""The fixture builder: corpus selection, tokenizer, HF/GGUF exports, manifest verification, a tiny build."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bloomery_cli.fixturegen import corpus, export_gguf, export_hf, tokenizer_train
from bloomery_cli.fixturegen.manifest import MANIFEST_NAME, Manifest, verify
from bloomery_cli.fixturegen.train import (
    DraftShape,
    TargetShape,
    TrainConfig,
    init_draft,
    init_target,
    round_bf16,
)

SMALL = TargetShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                    vocab_size=384, max_position=256)


@pytest.fixture(scope="module")
def small_corpus() -> corpus.Corpus:
    return corpus.load_corpus(limit=25)


@pytest.fixture(scope="module")
def small_tok(small_corpus):
    return tokenizer_train.train_tokenizer(small_corpus.train_texts(), vocab_size=SMALL.vocab_size)


def _random_params(shape: TargetShape, seed: int = 0) -> dict[str, torch.Tensor]:
    p = init_target(shape, seed, std=0.5)
    gen = torch.Generator().manual_seed(seed + 1)
    for k, v in p.items():
        if v.ndim == 1:                              # make norms non-trivial so a mix-up would show
            p[k] = v + 0.3 * torch.randn(v.shape, generator=gen)
    return round_bf16(p)


# ---------------------------------------------------------------------------------------------- corpus

def test_corpus_selection_is_deterministic_and_skips_what_it_should():
    a, b = corpus.select_files(), corpus.select_files()
    assert a == b == sorted(a) and len(a) > 300
    for rel in a:
        parts = rel.split("/")
        assert not {"test", "tests", "idlelib", "lib2to3", "site-packages", "encodings"} & set(parts[:-1]), rel
        assert not parts[-1].startswith("_sysconfigdata"), rel
    assert "csv.py" in a and "json/decoder.py" in a and "textwrap.py" in a


def test_held_out_files_never_reach_training(small_corpus):
    full = corpus.load_corpus()
    for c in (small_corpus, full):
        assert not set(c.train) & set(c.held_out)
        assert all(not corpus.is_held_out(r) for r in c.train)
        assert all(corpus.is_held_out(r) for r in c.held_out)
    assert {"csv.py", "textwrap.py", "json/__init__.py", "json/decoder.py"} <= set(full.held_out)
    assert 0.02 < len(full.held_out) / (len(full.train) + len(full.held_out)) < 0.15
    assert full.describe()["held_out_files"] == full.held_out


def test_corpus_hash_is_stable_and_content_sensitive(small_corpus, tmp_path):
    again = corpus.load_corpus(limit=25)
    assert again.sha256 == small_corpus.sha256 and again.train == small_corpus.train
    # the hash covers names and contents
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "pkg" / "b.py").write_text("y = 2\n")
    (root / "test").mkdir()
    (root / "test" / "t.py").write_text("assert 0\n")
    h1 = corpus.load_corpus(root).sha256
    assert corpus.select_files(root) == ["a.py", "pkg/b.py"]
    (root / "a.py").write_text("x = 2\n")
    assert corpus.load_corpus(root).sha256 != h1


# ---------------------------------------------------------------------------------------------- tokenizer

def test_tokenizer_specials_roundtrip_and_determinism(small_corpus, small_tok):
    tok = small_tok
    assert tok.get_vocab_size() == SMALL.vocab_size
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.token_to_id("<|mask|>") == 1
    code = "    def f(self, x):\n        return {'a': x + 1}  # ünïcode\n"
    ids = tok.encode(code, add_special_tokens=False).ids
    assert tok.decode(ids) == code
    assert 1 not in ids and 0 not in ids
    # the mask token is atomic where it appears
    assert tok.encode("a<|mask|>b", add_special_tokens=False).ids.count(1) == 1
    again = tokenizer_train.train_tokenizer(small_corpus.train_texts(), vocab_size=SMALL.vocab_size)
    assert tokenizer_train.tokenizer_json(again) == tokenizer_train.tokenizer_json(tok)
    assert len(tokenizer_train.vocab_list(tok)) == SMALL.vocab_size
    merges = tokenizer_train.merges_list(tok)
    assert merges and all(len(m.split(" ")) == 2 for m in merges)


# ---------------------------------------------------------------------------------------------- exports

def test_hf_and_gguf_exports_read_back_equal(tmp_path, small_tok):
    params = _random_params(SMALL)
    files = export_hf.write_target(tmp_path / "hf", SMALL, params, tokenizer_train.tokenizer_json(small_tok))
    assert all(f.is_file() for f in files)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]) == (64, 2, 4, 2, 16, 96, 384)
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    st = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(st) == set(params) and "lm_head.weight" not in st
    for k, v in params.items():
        assert st[k].dtype == torch.bfloat16 and torch.equal(st[k], v), k

    path = export_gguf.write_target_gguf(tmp_path / "m.gguf", SMALL, params, small_tok, name="t")
    r = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "qwen3"
    assert fields["qwen3.block_count"] == 2 and fields["qwen3.embedding_length"] == 64
    assert fields["qwen3.feed_forward_length"] == 96 and fields["qwen3.attention.head_count"] == 4
    assert fields["qwen3.attention.head_count_kv"] == 2 and fields["qwen3.attention.key_length"] == 16
    assert fields["qwen3.attention.value_length"] == 16 and fields["qwen3.context_length"] == 256
    assert fields["qwen3.rope.freq_base"] == pytest.approx(10000.0)
    assert fields["qwen3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.tokens"][:2] == ["<|endoftext|>", "<|mask|>"]
    assert len(fields["tokenizer.ggml.tokens"]) == SMALL.vocab_size
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names and "blk.1.attn_k_norm.weight" in names
    assert len(names) == len(params)
    for t in r.tensors:
        hf = export_gguf.hf_name(t.name)
        want = params[hf].float().numpy()
        dims = [int(d) for d in t.shape]                       # ggml order: innermost (input) first
        assert dims == list(reversed(want.shape)), t.name
        if want.ndim == 2:
            assert t.tensor_type == gguf.GGMLQuantizationType.BF16, t.name
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(dims)))
        assert np.array_equal(got, want), t.name
    # the builder's own reader agrees
    tensors, _ = export_gguf.read_gguf(path)
    assert all(np.array_equal(tensors[k], v.float().numpy()) for k, v in params.items())


def test_draft_export_layout(tmp_path):
    d = DraftShape(num_layers=1, block_size=8, target_layer_ids=(0, 1), mask_token_id=1)
    dp = round_bf16(init_draft(SMALL, d, 3))
    export_hf.write_draft(tmp_path, SMALL, d, dp)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 8 and cfg["num_hidden_layers"] == 1
    assert cfg["dflash_config"] == {"mask_token_id": 1, "target_layer_ids": [0, 1]}
    st = load_file(str(tmp_path / "model.safetensors"))
    assert st["fc.weight"].shape == (64, 128) and "layers.0.self_attn.q_norm.weight" in st
    assert not any(k.startswith("model.") for k in st)


def test_hf_export_loads_in_transformers(tmp_path, small_tok):
    transformers = pytest.importorskip("transformers")
    qwen3 = pytest.importorskip("bloomery_gates.kernels.families.qwen3.model")
    from bloomery_cli.fixturegen.train import target_spec

    params = _random_params(SMALL, seed=5)
    export_hf.write_target(tmp_path, SMALL, params, tokenizer_train.tokenizer_json(small_tok))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[5, 17, 99, 3, 250, 7, 7, 42]])
    with torch.no_grad():
        ref = model(ids).logits
        p32 = {k: v.float() for k, v in params.items()}
        ours, _ = qwen3.forward_train(p32, target_spec(SMALL, p32), ids)
    assert torch.allclose(ours, ref, atol=1e-3, rtol=1e-3), (ours - ref).abs().max()


# ---------------------------------------------------------------------------------------------- manifest

def test_verify_catches_flipped_byte_missing_and_unlisted(tmp_path):
    (tmp_path / "d").mkdir()
    a, b = tmp_path / "a.bin", tmp_path / "d" / "b.json"
    a.write_bytes(bytes(range(256)) * 10)
    b.write_text('{"x": 1}\n')
    m = Manifest()
    m.add_files(tmp_path, [a, b])
    m.write(tmp_path)
    assert verify(tmp_path) == []
    raw = bytearray(a.read_bytes())
    raw[100] ^= 0x01
    a.write_bytes(bytes(raw))
    problems = verify(tmp_path)
    assert len(problems) == 1 and "a.bin" in problems[0] and "sha256" in problems[0]
    raw[100] ^= 0x01
    a.write_bytes(bytes(raw))
    assert verify(tmp_path) == []
    b.unlink()
    assert any("b.json" in p and "missing" in p for p in verify(tmp_path))
    b.write_text('{"x": 1}\n')
    (tmp_path / "stray.txt").write_text("hi")
    assert any("stray.txt" in p for p in verify(tmp_path))
    (tmp_path / "stray.txt").unlink()
    (tmp_path / MANIFEST_NAME).unlink()
    assert verify(tmp_path) and "missing" in verify(tmp_path)[0]


# ---------------------------------------------------------------------------------------------- build

def _tiny_config(seed: int = 7):
    from bloomery_cli.fixturegen.build import BuildConfig

    cfg = BuildConfig.quick_config(seed)
    return replace(cfg, target=TrainConfig(steps=4, batch=2, seq=32, warmup=2, log_every=2),
                   draft=TrainConfig(steps=3, batch=2, seq=32, warmup=2, log_every=2),
                   anchors_per_row=3, pool_size=4, pool_prefixes=(16,), eval_windows=2, eval_train_windows=2,
                   greedy_eval_rows=2, greedy_eval_prefix=16)


def _needs_kernels():
    pytest.importorskip("bloomery_gates.kernels.families.qwen3.model")
    pytest.importorskip("bloomery_gates.kernels.drafts.dflash")


def test_tiny_build_end_to_end(tmp_path):
    _needs_kernels()
    from bloomery_cli.fixturegen.build import build
    from bloomery_cli.fixturegen.build import verify as build_verify

    out = tmp_path / "fixtures"
    calls = []

    def extra(ctx):                                  # the hook other drafters (DFlash2, DSpark) plug into
        assert ctx.pool.ndim == 2 and ctx.held_greedy.shape[1] == ctx.pool.shape[1]
        assert set(ctx.target_params) == set(ctx.target_spec.tensors)
        d = ctx.work / "extra-draft"
        d.mkdir()
        (d / "config.json").write_text("{}\n")
        return "extra-draft", [d / "config.json"], {"note": "planted"}

    man = build(out, "cpu", config=_tiny_config(), quiet=True, progress=lambda *a: calls.append(a),
                extra_drafters=[extra])
    assert man.models["extra-draft"] == {"note": "planted"} and "extra-draft/config.json" in man.files
    assert calls and build_verify(out) == []
    assert not (tmp_path / ".fixtures-work").exists()
    assert man.total_bytes < 12 * 1024 * 1024
    assert set(man.files) >= {"tokenizer.json", "prompts.jsonl", "qwen3-tiny/config.json",
                              "qwen3-tiny/model.safetensors", "qwen3-tiny/tokenizer.json",
                              "qwen3-tiny-dflash-b8/config.json", "qwen3-tiny-dflash-b8/model.safetensors"}
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    held = set(man.corpus["held_out_files"])
    assert len(prompts) >= 6 and all(p["source"] in held and 32 <= p["n_tokens"] <= 64 for p in prompts)
    d = man.models["qwen3-tiny-dflash-b8"]
    assert len(d["held_out_real"]["top1_agreement_per_position"]) == 7
    assert man.models["qwen3-tiny"]["held_out"]["ce"] > 0
    # the harness's own readers accept the result
    loading = pytest.importorskip("bloomery_cli.loading")
    t = loading.load_target(out / "qwen3-tiny")
    assert "qwen3-tiny.gguf" in man.derived and not (out / "qwen3-tiny.gguf").exists()   # made on demand, not stored
    from bloomery_cli.fixturegen.derived import derived
    gguf = derived("qwen3-tiny.gguf", out)           # the writer reproduces the build's own file (its sha256)
    g = loading.load_target(gguf)
    dr = loading.load_dflash(out / "qwen3-tiny-dflash-b8", t)
    assert dr.mask_token_id == 1 and tuple(dr.target_layer_ids) == (1, 2, 4) and dr.block_size == 8
    assert all(torch.equal(t.tensors[k].float(), g.tensors[k].float()) for k in t.tensors)
    assert loading.load_tokenizer(gguf).token_to_id("<|mask|>") == 1
    # a flipped byte in a built file is caught
    p = out / "qwen3-tiny" / "config.json"
    raw = bytearray(p.read_bytes())
    raw[10] ^= 0x20
    p.write_bytes(bytes(raw))
    assert any("qwen3-tiny/config.json" in x for x in build_verify(out))


def test_build_is_reproducible(tmp_path):
    _needs_kernels()
    from bloomery_cli.fixturegen.build import build

    a = build(tmp_path / "a" / "fixtures", "cpu", config=_tiny_config(), quiet=True)
    b = build(tmp_path / "b" / "fixtures", "cpu", config=_tiny_config(), quiet=True)
    assert a.files == b.files
