"""fixtures/ within the project's budget (40 MB, what the folder holds on disk), and the fixtures made on demand
instead of stored (``fixturegen.derived``: the target's GGUF, byte for byte; a writer that no longer reproduces
the manifest's sha256 is an error and leaves nothing behind; an unknown name is bad input)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bloomery_cli.fixturegen.derived import derived
from bloomery_cli.fixturegen.install import MAX_FIXTURE_BYTES
from bloomery_cli.fixturegen.manifest import Manifest
from bloomery_gates.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_the_folder_holds_at_most_the_budget():
    held = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file() and not p.is_symlink())
    assert MAX_FIXTURE_BYTES == 40_000_000
    assert held <= MAX_FIXTURE_BYTES and Manifest.read(FIXTURES).stored_bytes <= MAX_FIXTURE_BYTES, held


def test_derived_gguf_is_made_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOOMERY_DERIVED", str(tmp_path / "cache"))
    p = derived("qwen3-tiny.gguf", FIXTURES)
    want = Manifest.read(FIXTURES).derived["qwen3-tiny.gguf"]
    assert p.parent == tmp_path / "cache" and p.stat().st_size == want["bytes"]
    assert derived("qwen3-tiny.gguf", FIXTURES) == p                      # the second call reuses it
    with pytest.raises(InputError, match="not a derived fixture"):
        derived("qwen3-tiny/model.safetensors", FIXTURES)


def test_a_writer_off_the_manifest_is_an_error_and_leaves_nothing(tmp_path, monkeypatch):
    fx = tmp_path / "fixtures"
    fx.mkdir()
    for name in ("tokenizer.json", "MANIFEST.json"):
        shutil.copy(FIXTURES / name, fx / name)
    shutil.copytree(FIXTURES / "qwen3-tiny", fx / "qwen3-tiny", symlinks=False)
    m = json.loads((fx / "MANIFEST.json").read_text())
    m["derived"]["qwen3-tiny.gguf"]["sha256"] = "0" * 64                  # planted: the writer cannot match it
    (fx / "MANIFEST.json").write_text(json.dumps(m))
    monkeypatch.setenv("BLOOMERY_DERIVED", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="the manifest says 0000"):
        derived("qwen3-tiny.gguf", fx)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["tokenizer.json"]   # no GGUF, no temporary
