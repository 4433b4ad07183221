"""``bloomery bench --llama-cpp``: the GGUF the peer writes (read back with the ``gguf`` package: arch, tensor
names, shapes and types, values, no vocabulary), the streamed writers still reproducing the bundled fixture
GGUFs byte for byte, llama-bench's command line / JSON / failures (a stand-in script), the exit-2 check before
any model work, and, where a llama-bench binary is found, the bench's record with llama.cpp's tok/s."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from typer.testing import CliRunner

from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_qwen38
from bloomery_cli.bench.llamacpp import compare, find_llama_bench, llama_peer, run_llama_bench, write_gguf
from bloomery_cli.bench.shapes import SHAPES, random_pair
from bloomery_cli.cli import app
from bloomery_cli.engines.build import bench_binary
from bloomery_cli.families.qwen38 import reader as qwen38
from bloomery_cli.fixturegen import export_gguf
from bloomery_cli.fixturegen.manifest import Manifest, sha256_file
from bloomery_cli.fixturegen.regguf import regguf
from bloomery_cli.fixturegen.train import TargetShape
from bloomery_gates.errors import InputError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CPU = torch.device("cpu")
TYPES = {"bf16": gguf.GGMLQuantizationType.BF16, "f16": gguf.GGMLQuantizationType.F16,
         "f32": gguf.GGMLQuantizationType.F32}


def llama_dir() -> Path | None:
    """A folder with a llama-bench binary: $BLOOMERY_LLAMA_CPP or ~/.cache/bloomery/llama.cpp."""
    env = os.environ.get("BLOOMERY_LLAMA_CPP")
    cache = Path.home() / ".cache" / "bloomery" / "llama.cpp"
    for d in ([Path(env)] if env else []) + [cache]:
        try:
            find_llama_bench(d)
            return d
        except InputError:
            continue
    return None


needs_llama = pytest.mark.skipif(llama_dir() is None, reason="no llama-bench (bloomery engine build --bench; "
                                 "BLOOMERY_LLAMA_CPP or ~/.cache/bloomery/llama.cpp)")


def _read(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: t for t in r.tensors}


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_qwen3_tiny_gguf_reads_back(tmp_path, dtype):
    t, _ = random_pair(SHAPES["tiny"], CPU, torch.bfloat16 if dtype == "bf16" else torch.float32)
    fields, tensors = _read(write_gguf(t, t.tensors, tmp_path / "t.gguf", dtype))
    assert fields["general.architecture"] == "qwen3" and fields["tokenizer.ggml.model"] == "no_vocab"
    assert fields["qwen3.vocab_size"] == 512 and "tokenizer.ggml.tokens" not in fields
    assert fields["qwen3.block_count"] == 2 and fields["qwen3.embedding_length"] == 64
    assert set(tensors) == {export_gguf.gguf_name(k) for k in t.tensors} and "output.weight" in tensors
    for hf, want in t.tensors.items():
        g = tensors[export_gguf.gguf_name(hf)]
        assert [int(d) for d in g.shape] == list(reversed(want.shape)), hf
        assert g.tensor_type == (TYPES[dtype] if want.ndim == 2 else gguf.GGMLQuantizationType.F32), hf
        got = gguf.quants.dequantize(g.data, g.tensor_type).reshape(tuple(want.shape))
        assert np.array_equal(got, want.float().numpy()), hf


def test_qwen38_tiny_gguf_reads_back(tmp_path):
    s = HYBRID_SHAPES["qwen38-tiny"]
    t, mtp = random_qwen38(s, CPU, torch.bfloat16)
    fields, tensors = _read(write_gguf(t, {**t.tensors, **mtp.tensors}, tmp_path / "h.gguf", "bf16"))
    assert fields["general.architecture"] == "qwen35" and fields["tokenizer.ggml.model"] == "no_vocab"
    assert fields["qwen35.vocab_size"] == s.vocab and fields["qwen35.block_count"] == s.layers
    assert fields["qwen35.full_attention_interval"] == 4 and "qwen35.nextn_predict_layers" not in fields
    assert set(tensors) == {qwen38.gguf_name(k, s.layers) for k in t.tensors}          # the trunk, no MTP
    for hf, want in t.tensors.items():
        g = tensors[qwen38.gguf_name(hf, s.layers)]
        conv = hf.endswith("conv1d.weight")                              # [C, 1, K] -> [C, K], F32
        dims = (want.shape[0], want.shape[-1]) if conv else tuple(want.shape)
        assert [int(d) for d in g.shape] == list(reversed(dims)), hf
        matrix = want.ndim == 2 and not conv
        assert g.tensor_type == (gguf.GGMLQuantizationType.BF16 if matrix else gguf.GGMLQuantizationType.F32), hf
    norm = tensors["blk.0.attn_norm.weight"]                           # zero-centred 0 -> llama.cpp's gain 1
    assert np.array_equal(gguf.quants.dequantize(norm.data, norm.tensor_type), np.ones(s.hidden, np.float32))


def test_streamed_writers_reproduce_the_fixture_ggufs(tmp_path):
    """The writers refactored onto ``write_streamed`` still write the bundled GGUFs byte for byte."""
    man = Manifest.read(FIXTURES)
    params = load_file(str(FIXTURES / "qwen3-tiny" / "model.safetensors"))
    tok = Tokenizer.from_file(str(FIXTURES / "tokenizer.json"))
    path = export_gguf.write_target_gguf(tmp_path / "q.gguf", TargetShape(**man.models["qwen3-tiny"]["shape"]),
                                         params, tok)
    assert sha256_file(path) == man.derived["qwen3-tiny.gguf"]["sha256"]
    assert regguf(FIXTURES, dry_run=True)["sha256"] == man.files["qwen38-tiny.gguf"]["sha256"]


def _fake_bench(tmp_path: Path, body: str) -> Path:
    exe = bench_binary(tmp_path)
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return exe


def test_llama_bench_command_json_and_failures(tmp_path):
    with pytest.raises(InputError, match="no llama-bench at build/tools/llama-bench/llama-bench"):
        find_llama_bench(tmp_path)
    with pytest.raises(InputError, match="no llama-bench executable"):
        run_llama_bench(tmp_path / "nope", tmp_path / "m.gguf", 16, 8, "cpu")
    out = [{"n_prompt": 0, "n_gen": 8, "n_depth": 16, "avg_ts": 123.5, "stddev_ts": 1.5, "type_k": "f16"}]
    exe = _fake_bench(tmp_path, f"echo '{json.dumps(out)}'")
    assert find_llama_bench(tmp_path) == exe
    r = run_llama_bench(exe, tmp_path / "m.gguf", 16, 8, "cuda:1")
    assert (r["tok_s"], r["tok_s_std"], r["depth"], r["n"], r["type_k"]) == (123.5, 1.5, 16, 8, "f16")
    assert r["command"].endswith("-p 0 -n 8 -d 16 -fa 1 -ngl 99 -dev CUDA1 -o json -r 3")
    assert run_llama_bench(exe, tmp_path / "m.gguf", 16, 8, "cpu", 3)["command"].endswith(
        "-fa 0 -ngl 0 -t 3 -o json -r 3")
    exe.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    with pytest.raises(InputError, match=r"llama-bench: exit 1: .*failed to load model"):
        run_llama_bench(exe, tmp_path / "m.gguf", 16, 8, "cpu")
    rec: dict = {"plain": {"tok_s": 10.0}}                  # in the bench: recorded and logged, not fatal
    t, _ = random_pair(SHAPES["tiny"], CPU, torch.float32)
    lines: list[str] = []
    compare(rec, exe, t, "f32", 16, 8, "cpu", lines.append)
    assert "llamacpp" not in rec and "exit 1" in rec["llamacpp_error"] and lines[0].startswith("llama.cpp failed")


def test_compare_puts_the_chain_beside_llama_cpp(tmp_path):
    """The fastest chain with ids identical is set against llama.cpp; a chain whose ids differ never is."""
    out = [{"n_prompt": 0, "n_gen": 8, "n_depth": 16, "avg_ts": 100.0, "stddev_ts": 1.0, "type_k": "f16"}]
    exe = _fake_bench(tmp_path, f"echo '{json.dumps(out)}'")
    t, _ = random_pair(SHAPES["tiny"], CPU, torch.float32)
    rec: dict = {"plain": {"tok_s": 90.0}, "host": {"chains": [{"k": 8, "tok_s": 120.0, "ids_identical": True},
                                                              {"k": 16, "tok_s": 150.0, "ids_identical": False}]}}
    lines: list[str] = []
    compare(rec, exe, t, "f32", 16, 8, "cpu", lines.append)
    assert rec["ours_vs_llamacpp"] == 0.9 and rec["ours_chain_vs_llamacpp"] == 1.2
    assert any("chained plain decode k=8: 120.0 tok/s (ours / llama.cpp = 1.20)" in x for x in lines)
    rec["host"]["chains"][0]["ids_identical"] = False
    rec.pop("ours_chain_vs_llamacpp")
    compare(rec, exe, t, "f32", 16, 8, "cpu", lines.append)
    assert "ours_chain_vs_llamacpp" not in rec


def test_missing_llama_cpp_folder_is_exit_2_before_model_work(tmp_path):
    res = CliRunner().invoke(app, ["bench", "qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--llama-cpp",
                                   str(tmp_path), "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "no llama-bench" in res.output and str(tmp_path) in res.output
    assert not (tmp_path / "r.json").exists()


@needs_llama
def test_bench_record_has_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, ["bench", "qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--dtype", "f32",
                                   "--prompt-len", "8", "-n", "8", "--llama-cpp", str(llama_dir()), "--json", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    peer = rec["llamacpp"]
    assert peer["tok_s"] > 0 and (peer["depth"], peer["n"]) == (8, 8) and peer["gguf_write_s"] >= 0
    assert " -d 8 " in peer["command"] and rec["ours_vs_llamacpp"] == rec["plain"]["tok_s"] / peer["tok_s"]
    assert any(line.startswith("llama.cpp plain: ") and "at depth 8 (ours / llama.cpp = " in line
               for line in rec["lines"])
    assert not list((tmp_path / "tmp").glob("bloomery-bench-llamacpp-*"))     # the GGUF's folder is gone


@needs_llama
def test_llama_cpp_runs_the_qwen35_gguf(tmp_path):
    t, _ = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], CPU, torch.bfloat16)
    peer = llama_peer(find_llama_bench(llama_dir()), t, "bf16", 8, 8, "cpu", 1)
    assert peer["tok_s"] > 0 and peer["gguf_arch"] == "qwen35" and peer["model_type"].startswith("qwen35")
