"""Bad input through the real CLI: exit 2, one named line, no traceback, no record left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest_formats import dflash_config, make_dflash, make_qwen3_gguf, make_qwen3_hf, write_tokenizer
from typer.testing import CliRunner

from bloomery_cli.cli import app

runner = CliRunner()


@pytest.fixture
def pair(tmp_path: Path):
    target, _ = make_qwen3_hf(tmp_path / "target")
    write_tokenizer(target / "tokenizer.json")
    draft, _ = make_dflash(tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3, 4]}) + "\n")
    return target, draft, prompts


def run(*args: str):
    return runner.invoke(app, ["gate", "run", "qwen3-dflash", *args], catch_exceptions=False)


def assert_input_error(result, *needles: str) -> None:
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, out


def test_unknown_gate():
    r = runner.invoke(app, ["gate", "run", "no-such-gate"], catch_exceptions=False)
    assert_input_error(r, "no-such-gate", "qwen3-dflash")


def test_missing_target(pair, tmp_path):
    _, draft, prompts = pair
    assert_input_error(run("--target", str(tmp_path / "nope"), "--draft", str(draft), "--prompts", str(prompts)),
                       "nope")


def test_config_missing_key(pair):
    target, draft, prompts = pair
    cfg = json.loads((target / "config.json").read_text())
    del cfg["num_key_value_heads"]
    (target / "config.json").write_text(json.dumps(cfg))
    assert_input_error(run("--target", str(target), "--draft", str(draft), "--prompts", str(prompts)),
                       "num_key_value_heads")


def test_truncated_safetensors(pair):
    target, draft, prompts = pair
    f = target / "model.safetensors"
    f.write_bytes(f.read_bytes()[:200])
    assert_input_error(run("--target", str(target), "--draft", str(draft), "--prompts", str(prompts)),
                       "model.safetensors")


def test_pickle_checkpoint_refused(pair, tmp_path):
    _, draft, prompts = pair
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    assert_input_error(run("--target", str(d), "--draft", str(draft), "--prompts", str(prompts)), "pytorch_model.bin")


def test_draft_hidden_size_mismatch(pair, tmp_path):
    target, _, prompts = pair
    bad, _ = make_dflash(tmp_path / "wide", H=32)
    assert_input_error(run("--target", str(target), "--draft", str(bad), "--prompts", str(prompts)), "hidden")


def test_draft_mask_id_out_of_vocab(pair, tmp_path):
    target, _, prompts = pair
    bad, _ = make_dflash(tmp_path / "mask", mask=64)
    assert_input_error(run("--target", str(target), "--draft", str(bad), "--prompts", str(prompts)), "mask")


def test_gguf_of_another_arch(pair, tmp_path):
    from conftest_formats import gguf_meta, qwen3_tensors, write_gguf

    _, draft, prompts = pair
    meta = {k.replace("qwen3.", "llama."): v for k, v in gguf_meta().items()}
    path = write_gguf(tmp_path / "llama.gguf", qwen3_tensors(), meta, arch="llama")
    assert_input_error(run("--target", str(path), "--draft", str(draft), "--prompts", str(prompts)), "llama")


def test_cuda_asked_without_cuda(pair, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    target, draft, prompts = pair
    record = tmp_path / "rec.json"
    r = run("--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--device", "cuda",
            "--json", str(record))
    assert_input_error(r, "CUDA")
    assert not record.exists() and not list(tmp_path.glob("rec.json*"))


def test_bad_dtype(pair):
    target, draft, prompts = pair
    assert_input_error(run("--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                           "--dtype", "f8"), "f8")


def test_bad_prompts_file(pair, tmp_path):
    target, draft, _ = pair
    p = tmp_path / "bad.jsonl"
    p.write_text("{not json\n")
    assert_input_error(run("--target", str(target), "--draft", str(draft), "--prompts", str(p)), "bad.jsonl")


def test_gguf_target_ok_shape(tmp_path):
    """A well-formed GGUF target loads (the gate's target may be either format)."""
    from bloomery_cli.loading import load_target

    path, _ = make_qwen3_gguf(tmp_path / "t.gguf")
    assert load_target(path).num_layers == 2
    assert dflash_config()["architectures"] == ["DFlashDraftModel"]


def test_flag_the_gate_does_not_act_on(pair):
    target, draft, prompts = pair
    assert_input_error(run("--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                           "--confidence-cut", "0.5"), "--confidence-cut", "qwen3-dflash")
