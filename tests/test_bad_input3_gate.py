"""Issue 28 (bad input, third round) through `bloomery gate run` / `bloomery gates`: every class exits 2 with one
line naming the flag, file or key, no traceback, no record written, the engine never built."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from conftest_formats import make_dflash, make_qwen3_hf, write_tokenizer
from exit2 import assert_one_line_exit2 as one_line_exit2
from never_built import never_built
from typer.testing import CliRunner

from bloomery_cli import files
from bloomery_cli.cli import app

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

    def edit(self, **changes) -> None:
        path = self.target / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture
def pair(tmp_path: Path, monkeypatch) -> Pair:
    target, _ = make_qwen3_hf(tmp_path / "target")
    write_tokenizer(target / "tokenizer.json")
    draft, _ = make_dflash(tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3, 4]}) + "\n")
    never_built(monkeypatch)
    return Pair(tmp_path, target, draft, prompts)


def gate_run(p: Pair, *args: str, json_out: Path | None = None):
    argv = ["gate", "run", "qwen3-dflash", "--target", str(p.target), "--draft", str(p.draft),
            "--prompts", str(p.prompts), "-n", "8", "--json", str(json_out or p.record), *args]
    return runner.invoke(app, argv, catch_exceptions=False)


# --- unbounded reads ------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("which", ["config.json", "tokenizer.json", "prompts"])
def test_endless_device_as_a_small_file(pair, which):
    """A link to /dev/zero is read up to the cap (256 MiB + 1 bytes), never until memory runs out."""
    path = pair.prompts if which == "prompts" else pair.target / which
    if which == "tokenizer.json":                 # a text prompt: the tokenizer is read
        pair.prompts.write_text(json.dumps({"text": "def f(x): return x"}) + "\n")
    path.unlink()
    path.symlink_to("/dev/zero")
    one_line_exit2(gate_run(pair), path.name, f"larger than {files.SMALL_FILE_MAX} bytes", root=pair.root)


def test_small_file_cap_is_the_bound(pair, monkeypatch):
    """The cap is what is read: a file one byte past it is refused (through the CLI too), one at it is read."""
    cfg = pair.target / "config.json"
    size = len(cfg.read_bytes())
    assert files.read_bytes(cfg, "config", limit=size) == cfg.read_bytes()
    with pytest.raises(files.Unreadable, match="larger than"):
        files.read_bytes(cfg, "config", limit=size - 1)
    monkeypatch.setattr(files, "SMALL_FILE_MAX", size - 1)
    one_line_exit2(gate_run(pair), "config.json", "larger than", root=pair.root)


def test_mmap_memory_error_named(pair, monkeypatch):
    """safetensors' mmap refusing a huge tensor (MemoryError in some builds, OSError in others) is one line."""
    from bloomery_cli.formats import hf_dir

    def refuse(*a, **k):
        raise MemoryError("unable to mmap 4000000000120 bytes")

    monkeypatch.setattr(hf_dir, "safe_open", refuse)
    one_line_exit2(gate_run(pair), "model.safetensors", "not a readable safetensors file", root=pair.root)


# --- config values that reach the math ------------------------------------------------------------

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


@pytest.mark.parametrize("change, needle", [
    ({"rope_theta": 1, "rope_parameters": {**YARN, "rope_theta": 1}}, "expected the RoPE base > 1"),
    ({"rope_parameters": {**YARN, "beta_fast": 5e-324}}, "key rope_parameters.beta_fast"),
    ({"rope_parameters": {**YARN, "beta_slow": 1e300}}, "key rope_parameters.beta_slow"),
    ({"rope_parameters": {**YARN, "original_max_position_embeddings": 10**400}},
     "key rope_parameters.original_max_position_embeddings"),
    ({"rope_parameters": {**YARN, "factor": 1e-300}}, "key rope_parameters.factor"),
])
def test_yarn_values_checked_before_the_math(pair, change, needle):
    pair.edit(**change)
    one_line_exit2(gate_run(pair), "target/config.json", needle, root=pair.root)


# --- flags ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [("12XB", "expected bytes"), ("0", "positive"), ("-5G", "expected bytes"),
                                           ("1e400", "at most"), ("2e18", "at most")])
def test_gpu_mem_refused_up_front(pair, value, needle):
    """docs/CONTRACT.md: a bad budget is exit 2, not a plan note under a run that goes on to exit 0/1."""
    one_line_exit2(gate_run(pair, "--gpu-mem", value), "--gpu-mem", needle, root=pair.root)


def test_temperature_denormal(pair):
    one_line_exit2(gate_run(pair, "--temperature", "5e-324"), "--temperature", "1e-06", root=pair.root)


def test_threads_past_the_cap(pair):
    one_line_exit2(gate_run(pair, "--threads", "100000"), "--threads", "100000", root=pair.root)


def test_json_naming_the_prompts_file(pair):
    before = pair.prompts.read_bytes()
    one_line_exit2(gate_run(pair, json_out=pair.prompts), "--json", "an input of this run")
    assert pair.prompts.read_bytes() == before


def test_json_inside_the_checkpoint(pair):
    cfg = pair.target / "config.json"
    before = cfg.read_bytes()
    one_line_exit2(gate_run(pair, json_out=cfg), "--json", "inside")
    assert cfg.read_bytes() == before


def test_record_and_json_the_same_file(pair):
    one_line_exit2(gate_run(pair, "--record", str(pair.record)), "--json", root=pair.root)


@pytest.mark.parametrize("args, needle", [(["--seed", "abc"], "--seed"), (["--width", "bogus"], "--width"),
                                          (["--no-such-flag"], "--no-such-flag"), (["-n", "x"], "-n")])
def test_parse_errors_one_line(pair, args, needle):
    one_line_exit2(gate_run(pair, *args), needle, root=pair.root)


def test_missing_argument_one_line():
    one_line_exit2(runner.invoke(app, ["gate", "run"], catch_exceptions=False), "name")


@pytest.mark.parametrize("flag, value", [("--device", "bogus"), ("--dtype", "f8"), ("--draft-device", "tpu")])
def test_gates_flag_checked_once(flag, value, monkeypatch):
    never_built(monkeypatch)
    one_line_exit2(runner.invoke(app, ["gates", flag, value], catch_exceptions=False), flag, value)
