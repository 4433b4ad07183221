"""Every class of bad input through the real CLI: exit 2, exactly one line naming the file / key / line /
flag, no traceback, no record written, and nothing allocated (the engine is never built)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest_formats import gguf_meta, make_dflash, make_qwen3_hf, qwen3_tensors, write_gguf, write_tokenizer
from exit2 import assert_one_line_exit2
from never_built import never_built
from typer.testing import CliRunner

from bloomery_cli import files, preflight
from bloomery_cli.cli import app
from bloomery_gates.errors import InputError, MissingFile

runner = CliRunner()


@dataclasses.dataclass
class Pair:
    root: Path
    target: Path
    draft: Path
    prompts: Path

    @property
    def record(self) -> Path:
        return self.root / "rec.json"

    def edit(self, which: str, **changes) -> None:
        path = (self.target if which == "target" else self.draft) / "config.json"
        cfg = json.loads(path.read_text())
        cfg.update(changes)
        path.write_text(json.dumps(cfg))


@pytest.fixture
def pair(tmp_path: Path, monkeypatch) -> Pair:
    target, _ = make_qwen3_hf(tmp_path / "target")          # vocab 64, 2 layers, max_position_embeddings 128
    write_tokenizer(target / "tokenizer.json")
    draft, _ = make_dflash(tmp_path / "draft")               # block 4
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3, 4]}) + "\n")
    never_built(monkeypatch)
    return Pair(tmp_path, target, draft, prompts)


def gate_run(p: Pair, *args: str, prompts: Path | None = None):
    argv = ["gate", "run", "qwen3-dflash", "--target", str(p.target), "--draft", str(p.draft),
            "--prompts", str(prompts or p.prompts), "-n", "8", "--json", str(p.record), *args]
    return runner.invoke(app, argv, catch_exceptions=False)


# --- config files ------------------------------------------------------------------------------

def test_deeply_nested_config(pair):
    (pair.target / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line_exit2(gate_run(pair), "config.json", "nested too deeply", root=pair.root)


@pytest.mark.parametrize("key, value", [("rope_theta", float("inf")), ("rope_theta", float("nan")),
                                        ("rope_theta", -1.0), ("rope_theta", 0), ("rms_norm_eps", 0),
                                        ("rms_norm_eps", float("-inf")), ("rms_norm_eps", float("nan")),
                                        ("rope_theta", 10**400)])
def test_non_finite_or_non_positive_float_keys(pair, key, value):
    pair.edit("target", **{key: value})
    assert_one_line_exit2(gate_run(pair), "target/config.json", f"key {key}", root=pair.root)


def test_non_finite_nested_and_draft_floats(pair):
    pair.edit("target", rope_parameters={"rope_theta": float("inf")})
    assert_one_line_exit2(gate_run(pair), "key rope_parameters.rope_theta", "NaN or infinite", root=pair.root)
    pair.edit("target", rope_parameters=None)
    pair.edit("draft", rope_theta=float("inf"))
    assert_one_line_exit2(gate_run(pair), "draft/config.json", "key rope_theta", root=pair.root)


# --- absurd sizes: refused from the header, before anything is built ----------------------------

def test_target_layer_count_past_the_header(pair):
    pair.edit("target", num_hidden_layers=1e9)
    assert_one_line_exit2(gate_run(pair), "key num_hidden_layers", "1000000000", "stores 2 layers", root=pair.root)


def test_draft_layer_count_past_the_header(pair):
    pair.edit("draft", num_hidden_layers=10**9)
    assert_one_line_exit2(gate_run(pair), "draft/config.json", "key num_hidden_layers", "stores 1 layers",
                          root=pair.root)


def test_gguf_block_count_past_the_header(pair):
    gguf = write_gguf(pair.root / "t.gguf", qwen3_tensors(), {**gguf_meta(), "qwen3.block_count": ("u32", 10**9)})
    write_tokenizer(pair.root / "tokenizer.json")
    r = runner.invoke(app, ["gate", "run", "qwen3-dflash", "--target", str(gguf), "--draft", str(pair.draft),
                            "--prompts", str(pair.prompts), "-n", "8", "--json", str(pair.record)],
                      catch_exceptions=False)
    assert_one_line_exit2(r, "t.gguf", "key qwen3.block_count", "stores 2 layers, blk.", root=pair.root)


def test_draft_block_past_the_context(pair):
    pair.edit("draft", block_size=100_000)
    assert_one_line_exit2(gate_run(pair), "p.jsonl:1", "draft block 100000", "max_position_embeddings",
                          root=pair.root)


def test_n_past_the_context(pair):
    assert_one_line_exit2(gate_run(pair, "-n", "1000000000"), "-n 1000000000", "expected <= 128",
                          "max_position_embeddings", root=pair.root)


def test_n_past_the_memory(pair, monkeypatch):
    """A context that allows it (1e12), but the KV caches alone exceed what the machine has."""
    pair.edit("target", max_position_embeddings=10**12)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 2**30)
    assert_one_line_exit2(gate_run(pair, "-n", "1000000000"), "-n: 1000000000", "GiB", "1 GiB available",
                          root=pair.root)


def test_memory_bound_counts_the_kv_caches():
    """The lower bound is the formula in preflight's docstring, on the tiny pair's numbers."""
    from types import SimpleNamespace as NS

    layer = NS(num_kv_heads=1, head_dim=8, num_heads=2)
    target, draft = NS(layer=layer, num_layers=2), NS(layer=layer, num_layers=1)
    need = preflight.need_bytes([[1] * 4], 100, 4, target, draft, 4)
    cap, per_t, per_d = 4 + 100 + 4 + 1, 2 * 2 * 8 * 4 + 2 * 8 * 4, 2 * 1 * 8 * 4 + 2 * 8 * 4
    assert need == cap * (per_t + per_d + 8) + 4 * cap * (1 + 4 * 2)


# --- -n ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", ["0", "-3", "1"])
def test_n_below_two(pair, n):
    assert_one_line_exit2(gate_run(pair, "-n", n), f"-n: {n}", "at least 2", root=pair.root)


def test_gates_n_zero_refused_before_any_gate(tmp_path, monkeypatch):
    never_built(monkeypatch)
    r = runner.invoke(app, ["gates", "-n", "0", "--results", str(tmp_path / "out")], catch_exceptions=False)
    assert_one_line_exit2(r, "-n: 0")
    assert not (tmp_path / "out").exists()


# --- prompts ------------------------------------------------------------------------------------------

GOOD = json.dumps({"ids": [1, 2, 3]})


@pytest.mark.parametrize("line, needle", [
    ('{"ids": [1, -2, 3]}', "ids[1] = -2"),
    ('{"ids": [1, 64, 3]}', "ids[1] = 64; expected a token id in [0, 64)"),
    ('{"ids": [1, "a", 3]}', "ids[1] is a string"),
    ('{"ids": [1, NaN, 3]}', "ids[1] is a number (nan)"),
    ('{"ids": [1, 1e30, 3]}', "ids[1] is a number (1e+30)"),
    ('{"ids": [1, [2], 3]}', "ids[1] is a list"),
    ('{"ids": [1, true, 3]}', "ids[1] is a boolean"),
    ('{"ids": [1, 11.7, 3]}', "ids[1] is a number (11.7)"),
    ('{"ids": [1, 3.0]}', "ids[1] is a number (3.0)"),
    ('{"ids": "123"}', "ids is a string ('123')"),
    ('{"ids": []}', "ids is empty"),
    ('{"ids": {"0": 1}}', "ids is an object"),
    ('[1, 2]', "a list; expected a JSON object"),
    ('3', "an integer; expected a JSON object"),
    ('"ids"', "a string; expected a JSON object"),
    ('null', "null; expected a JSON object"),
    ('{"text": 5}', "'text' is an integer"),
    ('{"text": ""}', "'text' is empty"),
    ('{"prompt": "w1"}', "expected a 'text' or 'ids' field"),
    ('{"ids": [1, 2', "cannot parse"),
    ("[" * 100_000, "nested too deeply"),
])
def test_bad_prompt_line(pair, line, needle):
    pair.prompts.write_text(GOOD + "\n\n" + line + "\n")
    assert_one_line_exit2(gate_run(pair), "p.jsonl:3", needle, root=pair.root)


def test_text_prompt_tokenized_past_the_vocab(pair):
    """A tokenizer larger than the target's embedding: its ids are checked as ids are."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(99)} | {"[UNK]": 99}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(pair.target / "tokenizer.json"))
    pair.prompts.write_text(json.dumps({"text": "w1 w2 w70"}) + "\n")
    assert_one_line_exit2(gate_run(pair), "p.jsonl:1", "the tokenized text[2] = 70", "[0, 64)", root=pair.root)


def test_binary_prompts_file(pair):
    pair.prompts.write_bytes(GOOD.encode() + b"\n\xff\xfe\x00garbage\n")
    assert_one_line_exit2(gate_run(pair), "p.jsonl", "not UTF-8", "line 2", root=pair.root)


def test_prompt_longer_than_the_context(pair):
    pair.prompts.write_text(GOOD + "\n" + json.dumps({"ids": [5] * 118}) + "\n")
    assert_one_line_exit2(gate_run(pair), "p.jsonl:2", "prompt of 118 ids + -n 8 + draft block 4 = 130",
                          "expected <= 128", "target/config.json: key max_position_embeddings", root=pair.root)


def test_prompt_that_just_fits_the_context_runs(pair, monkeypatch):
    """The bound is not off by one: prompt + n + block == max_position_embeddings passes the checks (the
    engine builder is reached)."""
    pair.prompts.write_text(json.dumps({"ids": [5] * 116}) + "\n")
    with pytest.raises(AssertionError, match="the engine was built"):
        gate_run(pair)


# --- output paths -------------------------------------------------------------------------------------

def test_json_is_a_directory(pair):
    (pair.root / "recdir").mkdir()
    r = gate_run(pair, "--json", str(pair.root / "recdir"))
    assert_one_line_exit2(r, "--json", "recdir is a directory", root=pair.root)


def test_json_under_a_file(pair):
    r = gate_run(pair, "--json", str(pair.prompts / "rec.json"))
    assert_one_line_exit2(r, "--json", "p.jsonl is not a directory", root=pair.root)


def test_json_in_an_unwritable_place(pair, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(preflight.tempfile, "mkstemp", refuse)
    r = gate_run(pair, "--json", str(pair.root / "sub" / "rec.json"))
    assert_one_line_exit2(r, "--json", "cannot create a file in", "Permission denied", root=pair.root)
    assert not (pair.root / "sub").exists(), "nothing is created up front"


def test_output_probe_leaves_nothing_behind(tmp_path):
    preflight.check_output_file(tmp_path / "a" / "b" / "rec.json")
    preflight.check_output_dir(tmp_path / "results", ["x.json"])
    assert list(tmp_path.iterdir()) == []


def test_gates_results_is_a_file(tmp_path, monkeypatch):
    never_built(monkeypatch)
    (tmp_path / "recfile").write_text("x")
    r = runner.invoke(app, ["gates", "--results", str(tmp_path / "recfile")], catch_exceptions=False)
    assert_one_line_exit2(r, "--results", "recfile is not a directory")
    assert (tmp_path / "recfile").read_text() == "x"


# --- unreadable files: named as unreadable, with the OS reason, never as missing ------------------------

def test_config_is_a_directory(pair):
    (pair.target / "config.json").unlink()
    (pair.target / "config.json").mkdir()
    line = assert_one_line_exit2(gate_run(pair), "config.json: is a directory", root=pair.root)
    assert "missing" not in line


def test_prompts_is_a_directory(pair):
    line = assert_one_line_exit2(gate_run(pair, prompts=pair.root), "is a directory", "prompts file",
                                 root=pair.root)
    assert "not found" not in line and "missing" not in line


@pytest.mark.parametrize("victim", ["config.json", "model.safetensors", "tokenizer.json", "p.jsonl"])
def test_permission_denied_is_unreadable(pair, monkeypatch, victim):
    real_open = open

    def guarded(path, *args, **kwargs):
        if Path(path).name == victim:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(files, "open", guarded, raising=False)
    if victim == "tokenizer.json":
        pair.prompts.write_text(json.dumps({"text": "w1 w2"}) + "\n")
    line = assert_one_line_exit2(gate_run(pair), victim, "unreadable (Permission denied)", root=pair.root)
    assert "missing" not in line


def test_stat_refused_is_unreadable_not_missing(tmp_path, monkeypatch):
    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files.os, "stat", refuse)
    with pytest.raises(InputError, match="unreadable \\(Permission denied\\)"):
        files.exists(tmp_path / "x", "target checkpoint")
    monkeypatch.undo()
    assert files.exists(tmp_path / "nope", "target checkpoint") is False
    with pytest.raises(MissingFile):
        files.read_text(tmp_path / "nope", "prompts file")
