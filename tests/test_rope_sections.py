"""qwen35.rope.dimension_sections: llama.cpp's interleaved section rule, the writer's layout, the reader's refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.formats.rope_sections import (
    CONVERTER_DEFAULT,
    sections_problem,
    stream_of,
    unrotated_pairs,
    writer_sections,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_imrope_streams_as_ggml_assigns_them():
    # ggml_mrope_cache_init, IMROPE: k = i mod S; t on k%3==0 (k < 3 s0), h on 1 (k < 3 s1), w on 2 (k < 3 s2)
    assert [stream_of(i, [4, 0, 0, 0]) for i in range(4)] == ["t", "e", "e", "t"]
    assert [stream_of(i, list(CONVERTER_DEFAULT)) for i in range(6)] == ["t", "h", "w", "t", "h", "w"]
    assert [stream_of(i, [11, 11, 10, 0]) for i in (29, 30, 31, 32)] == ["w", "t", "h", "t"]  # S = 32: wraps
    # the layout FAMILIES_MOE.md cites from bloomery's qwen35moe test (rope dims 8): pair 2 is left unrotated
    assert [stream_of(i, [2, 2, 0, 0]) for i in range(4)] == ["t", "h", "e", "t"]
    assert unrotated_pairs([4, 0, 0, 0], 4) == [1, 2]
    assert unrotated_pairs([0, 0, 1, 3], 4) == [0, 1, 3]


def test_writer_layout_covers_every_pair():
    assert writer_sections(8, 32) == [11, 11, 10, 0]               # the fixture: the converter's default
    for n in range(1, 40):                                        # small heads: the even interleave
        s = writer_sections(2 * n, 2 * n)
        assert sum(s) <= 2 * n and unrotated_pairs(s, n) == [], s
        assert sections_problem(s, 2 * n, 2 * n) is None


@pytest.mark.parametrize("value, needle", [([4, 0, 0, 0], "pairs [1, 2] of 4 unrotated"), ([1, 2, 3], "exactly 4"),
                                           ([0, 0, 0, 4], "s0 + s1 + s2 > 0"), ([11, 11, 11, 0], "> head_dim 32"),
                                           ([2, -1, 2, 0], "non-negative"), ("x", "4 non-negative integers")])
def test_sections_problem_names_the_defect(value, needle):
    assert needle in sections_problem(value, 8, 32)


def test_scalar_sections_repeat_as_llama_cpp_reads_them():
    assert sections_problem(2, 8, 32) is None                       # [2, 2, 2, 2]: k = 0..3 -> t, h, w, t


def _regguf(tmp_path: Path, sections) -> Path:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from bloomery_cli.families.qwen38.fixture import write_qwen38_gguf
    from bloomery_cli.fixturegen.manifest import Manifest
    from bloomery_cli.fixturegen.regguf import shape_from_manifest

    if not (FIXTURES / "qwen38-tiny" / "model.safetensors").is_file():
        pytest.skip("fixtures/qwen38-tiny absent")
    shape = shape_from_manifest(Manifest.read(FIXTURES).models["qwen38-tiny"])
    tensors = load_file(str(FIXTURES / "qwen38-tiny" / "model.safetensors"))
    tok = Tokenizer.from_file(str(FIXTURES / "qwen38-tiny" / "tokenizer.json"))
    return write_qwen38_gguf(tmp_path / "t.gguf", shape, tensors, tok, 1, rope_sections=sections)


def test_fixture_gguf_carries_the_converter_layout():
    from bloomery_cli.formats.gguf_file import GGUFFile
    from bloomery_cli.loading import load_target

    assert GGUFFile(FIXTURES / "qwen38-tiny.gguf").meta("qwen35.rope.dimension_sections") == [11, 11, 10, 0]
    assert load_target(FIXTURES / "qwen38-tiny.gguf").hybrid.rotary_dim == 8


def test_cli_refuses_sections_that_leave_pairs_unrotated(tmp_path):
    """The old export's [4, 0, 0, 0]: exit 2, one line naming the key, no record written."""
    bad = _regguf(tmp_path, [4, 0, 0, 0])
    rec = tmp_path / "r.json"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3, 4]}) + "\n")
    r = CliRunner().invoke(app, ["gate", "run", "qwen38-mtp", "--target", str(bad), "--draft", str(bad),
                                 "--prompts", str(prompts), "--json", str(rec)], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "qwen35.rope.dimension_sections" in lines[0] and "[1, 2]" in lines[0], lines[0]
    assert not rec.exists()
    good = _regguf(tmp_path, None)                                  # the same weights with the writer's layout load
    from bloomery_cli.loading import load_target
    assert load_target(good).num_layers == 4
