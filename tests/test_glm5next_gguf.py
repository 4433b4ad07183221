"""glm5next in llama.cpp's GGUF layout: the writer (from the HF fixture, its NextN block included), the reader (to HF
names), llama.cpp as tier-3 oracle on the same file with the file's grouped routing, and FAIL-first plants in a BF16
file.

The bundled ``fixtures/glm5next-tiny.gguf`` is the writer's output (the manifest's sha256) and reads back to the HF
fixture; llama.cpp's trunk agrees with our f64 reference (2 expert groups, the best 1 kept: the file carries them,
llama.cpp applies them); a planted defect in a BF16 file makes the llama.cpp check exit 1: MLA's k_b written
untransposed (same shape, wrong numbers), or the expert groups left out of the file (llama.cpp then routes
ungrouped, against our reference of the grouped file).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_family import (
    FIXTURES,
    assert_bundled_is_writer_output,
    needs_gguf,
    needs_llama,
    prompt_ids,
    reference_check,
    write,
)
from gguf_family import report as _report

from bloomery_cli import llamacpp_run
from bloomery_cli.families.glm5next import fixture_gguf
from bloomery_cli.families.glm5next import oracle_llamacpp as oracle
from bloomery_cli.families.glm5next.reader_mtp import glm5next_nextn_from_file
from bloomery_cli.loading import load_target

HF, GGUF = FIXTURES / "glm5next-tiny", FIXTURES / "glm5next-tiny.gguf"


def _seq(t: int = 32) -> tuple[list[int], int]:
    return prompt_ids(HF, keep=20, t=t)


def _write(tmp_path: Path, name: str, spec=None, **kw) -> Path:
    return write(fixture_gguf.write_glm5next_gguf, HF, tmp_path / name, spec, **kw)


@needs_gguf(GGUF)
def test_bundled_file_is_the_writer_output_and_in_the_manifest(tmp_path):
    assert_bundled_is_writer_output(fixture_gguf.export_gguf, HF, GGUF, tmp_path, max_bytes=2_000_000)


def test_gguf_reads_back_to_the_hf_spec_and_weights(tmp_path):
    path = _write(tmp_path, "g.gguf")
    hf, gg = load_target(HF), load_target(path)
    fixture_gguf.check_readback(path, hf)
    assert gg.source_format == "gguf" and (gg.moe.n_group, gg.moe.topk_group) == (2, 1) and gg.moe == hf.moe
    for n in ("model.layers.0.self_attn.conv1d.weight", "model.layers.1.self_attn.kv_b_proj.weight",
              "model.layers.4.self_attn.kv_b_proj.weight", "model.layers.4.eh_proj.weight"):
        assert torch.equal(gg.tensors[n].float(), hf.tensors[n].float()), n
    assert glm5next_nextn_from_file(path, gg) is gg                 # the NextN draft reads from the GGUF too


def test_readback_catches_a_wrong_tensor(tmp_path):
    path = _write(tmp_path, "bad.gguf", edit={"blk.1.attn_k_b.weight": lambda x: x.transpose(1, 2)})
    with pytest.raises(RuntimeError, match="kv_b_proj.weight does not read back"):
        fixture_gguf.check_readback(path, load_target(HF))


def _check(spec, path: Path, seq: list[int], p: int) -> tuple[int, list[str]]:
    from bloomery_gates.reference.families.glm5next.model import forward

    return reference_check(forward, oracle.check_target_glm5next, spec, path, seq, p)


@needs_llama
def test_llama_cpp_agrees_with_the_reference_on_the_grouped_file(tmp_path):
    path = _write(tmp_path, "g.gguf")
    seq, p = _seq()
    code, lines = _check(load_target(path), path, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 0 and logit.endswith(" PASS") and "[32x4096]" in logit, lines
    assert any("2 expert groups, the best 1 kept" in line for line in lines), lines


@needs_llama
@pytest.mark.parametrize("plant", ["k_b_untransposed", "groups_left_out"])
def test_fail_first_planted_defect_in_bf16(tmp_path, plant):
    """llama.cpp runs a BF16 file with the defect; our reference reads the good file: exit 1."""
    hf = load_target(HF)
    good = _write(tmp_path, "good.gguf")
    if plant == "k_b_untransposed":
        bad = _write(tmp_path, "bad.gguf", edit={"blk.1.attn_k_b.weight": lambda x: x.transpose(1, 2)})
    else:
        bad = _write(tmp_path, "bad.gguf", spec=replace(hf, moe=replace(hf.moe, n_group=1, topk_group=1)))
    assert "BF16" in llamacpp_run.tensor_types(bad)
    seq, p = _seq()
    code, lines = _check(load_target(good), bad, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 1 and logit.endswith(" FAIL"), lines


def test_skip_reason_without_llama_cpp_python(monkeypatch):
    monkeypatch.setattr(llamacpp_run, "unavailable", lambda: "llama_cpp (llama-cpp-python) is not importable: x")
    spec = load_target(HF)
    report, lines = _report()
    oracle.check_target_glm5next(report, spec, [1, 2, 3], np.zeros((3, spec.vocab_size)), 2, [4], gguf=Path("x"))
    checks = [line for line in lines if line.endswith(("PASS", "FAIL"))]
    assert any(line.startswith("(o) llama.cpp: skipped, llama_cpp") for line in lines) and not checks, lines
    assert report.failed == 0


def test_bad_group_keys_are_a_named_error(tmp_path):
    from bloomery_gates.errors import InputError

    hf = load_target(HF)
    path = _write(tmp_path, "g3.gguf", spec=replace(hf, moe=replace(hf.moe, n_group=3, topk_group=1)))
    with pytest.raises(InputError, match="expert_group_used_count.*3 groups of 8 experts"):
        load_target(path)
