"""Tier 3 for GGUF targets: llama.cpp (llama-cpp-python) on the same file, and its MTP graph on the nextn layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_path

from bloomery_cli import llamacpp_run
from bloomery_cli.contract import Report
from bloomery_cli.gate import GateOptions, run_gate
from bloomery_cli.loading import load_mtp, load_target, load_tokenizer
from bloomery_cli.oracle import llamacpp as oracle_llamacpp

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3, QWEN38 = fixture_path("qwen3-tiny.gguf"), FIXTURES / "qwen38-tiny.gguf"

needs_llama = pytest.mark.skipif(llamacpp_run.unavailable() is not None,
                                 reason="llama_cpp not importable (pip install llama-cpp-python==0.3.36)")
needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")


def _report() -> tuple[Report, list[str]]:
    lines: list[str] = []
    return Report("t", emit=lines.append), lines


def _seq(path: Path, extra: int = 12) -> tuple[list[int], int]:
    """The first fixture prompt plus ``extra`` arbitrary ids (teacher-forced rows; no greedy run needed here)."""
    import json

    text = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["text"]
    prompt = load_tokenizer(path).encode(text).ids
    return prompt + [int(i) for i in np.arange(extra) * 37 % 4000 + 2], len(prompt)


def _regguf(tmp_path: Path, name: str, sections=None, swap_mtp_norms: bool = False) -> Path:
    """qwen38-tiny.gguf written again from the HF fixture, with a planted defect."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from bloomery_cli.families.qwen38.fixture import write_qwen38_gguf
    from bloomery_cli.fixturegen.manifest import Manifest
    from bloomery_cli.fixturegen.regguf import shape_from_manifest

    t = load_file(str(FIXTURES / "qwen38-tiny" / "model.safetensors"))
    if swap_mtp_norms:        # the MTP concat-order class of defect: embedding and hidden norms exchanged
        e, h = "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"
        t[e], t[h] = t[h], t[e]
    shape = shape_from_manifest(Manifest.read(FIXTURES).models["qwen38-tiny"])
    tok = Tokenizer.from_file(str(FIXTURES / "qwen38-tiny" / "tokenizer.json"))
    return write_qwen38_gguf(tmp_path / name, shape, t, tok, 1, rope_sections=sections)


def test_f32_copy_keeps_metadata_and_values(tmp_path):
    from bloomery_cli.formats.gguf_file import GGUFFile

    dst = llamacpp_run.f32_copy(QWEN38, tmp_path / "c.gguf")
    a, b = GGUFFile(QWEN38), GGUFFile(dst)
    assert llamacpp_run.tensor_types(dst) == ["F32"] and "BF16" in llamacpp_run.tensor_types(QWEN38)
    keys = [k for k in a.meta_keys() if not k.startswith("GGUF.") and k != "general.file_type"]
    assert keys == [k for k in b.meta_keys() if not k.startswith("GGUF.") and k != "general.file_type"]
    assert all(a.meta(k) == b.meta(k) for k in keys)
    ta, tb = a.tensors(), b.tensors()
    assert list(ta) == list(tb) and all(np.array_equal(ta[n].numpy(), tb[n].numpy()) for n in ta)


def test_note_line_when_llama_cpp_is_absent(monkeypatch):
    monkeypatch.setattr(llamacpp_run, "unavailable", lambda: "llama_cpp (llama-cpp-python) is not importable: x")
    spec = load_target(QWEN3)
    report, lines = _report()
    oracle_llamacpp.check_target(report, spec, [1, 2, 3], np.zeros((3, spec.vocab_size)), 2, [3])
    assert len(lines) == 1 and lines[0].startswith("(o) llama.cpp: skipped, llama_cpp") and report.failed == 0


@needs_llama
@pytest.mark.parametrize("path", [QWEN3, QWEN38], ids=["qwen3", "qwen38"])
def test_llama_cpp_agrees_with_the_reference(path):
    from bloomery_gates.registry import FAMILIES

    spec = load_target(path)
    seq, p = _seq(path)
    ref = FAMILIES[spec.family].reference(spec, seq)
    out = llamacpp_run.run(path, seq)
    band = oracle_llamacpp.logits_band("f32", spec.layer, spec.num_layers, len(seq))
    worst = oracle_llamacpp.worst_rel(ref.logits, out.logits)
    assert worst <= band.value and worst < 1e-5, worst            # measured ~5e-7..7e-7 when this was written
    report, lines = _report()
    oracle_llamacpp.check_target(report, spec, seq, ref.logits, p, list(out.logits[p - 1:-1].argmax(-1)))
    assert report.failed == 0 and sum(line.endswith(" PASS") for line in lines) == 3, lines


@needs_llama
def test_planted_rope_sections_fail_the_llama_cpp_lines(tmp_path):
    """The old export's [4, 0, 0, 0] (pairs 1 and 2 unrotated in llama.cpp): our reader refuses such a file, so the
    check is shown failing by running llama.cpp on the bad copy against the good file's reference: exit 1."""
    from bloomery_gates.registry import FAMILIES

    bad = _regguf(tmp_path, "bad.gguf", sections=[4, 0, 0, 0])
    spec = load_target(QWEN38)
    seq, p = _seq(QWEN38)
    ref = FAMILIES["qwen38"].reference(spec, seq)
    report, lines = _report()
    oracle_llamacpp.check_target(report, spec, seq, ref.logits, p, seq[p:], gguf=bad)
    logit_line = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert logit_line.endswith(" FAIL") and report.finish() == 1, lines


@needs_llama
def test_mtp_lines_pass_and_fail_on_a_planted_mtp_defect(tmp_path):
    spec = load_target(QWEN38)
    mtp = load_mtp(QWEN38, spec)
    seq, _ = _seq(QWEN38)
    report, lines = _report()
    oracle_llamacpp.check_mtp(report, spec, mtp, seq)
    assert report.failed == 0 and sum(line.endswith(" PASS") for line in lines) == 4, lines
    assert any("driver keeps a row 0" in line for line in lines)
    bad = _regguf(tmp_path, "swapped.gguf", swap_mtp_norms=True)
    report, lines = _report()
    oracle_llamacpp.check_mtp(report, spec, mtp, seq, gguf=bad)
    head = [line for line in lines if line.startswith("(o) mtp logits")]
    assert len(head) == 2 and all(line.endswith(" FAIL") for line in head) and report.finish() == 1, lines


@needs_llama
@needs_hf
@pytest.mark.parametrize("gate, target", [("qwen3-dflash", QWEN3), ("qwen38-mtp", QWEN38)])
def test_gate_oracle_prints_llama_cpp_lines(gate, target):
    from bloomery_gates.gates import GATES

    draft = target if gate == "qwen38-mtp" else None
    lines: list[str] = []
    run_gate(GATES[gate], GateOptions(target=target, draft=draft, n=12, max_prompts=1, oracle=True),
             emit=lines.append)                   # one short prompt: (b) may not see both branches; not checked here
    ours = [line for line in lines if "vs llama.cpp f32" in line]
    assert len(ours) == (7 if gate == "qwen38-mtp" else 3) and all(line.endswith(" PASS") for line in ours), lines
    assert any("vs transformers" in line and line.endswith(" PASS") for line in lines)
