"""mimo2 in llama.cpp's GGUF layout: the writer (from the HF fixture), the reader, llama.cpp as oracle, FAIL-first.

The bundled ``fixtures/mimo2-tiny.gguf`` (fused attn_qkv) and a split-qkv copy written here read back equal to the HF
fixture; llama.cpp's trunk and its MTP graph agree with our f64 reference; and each planted defect (the file's sinks
or SWA pattern dropped by the writer, or ignored by the reader) makes the llama.cpp check exit 1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import fixture_path
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
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.mimo2 import fixture_gguf as mimo2_gguf
from bloomery_cli.families.mimo2 import oracle_llamacpp as oracle_llamacpp_mimo2
from bloomery_cli.families.mimo2 import reader_gguf as reader
from bloomery_cli.loading import load_mimo2_mtp, load_target
from bloomery_cli.oracle import llamacpp as oracle_llamacpp

HF, GGUF = FIXTURES / "mimo2-tiny", FIXTURES / "mimo2-tiny.gguf"


def _seq(extra: int = 12) -> tuple[list[int], int]:
    return prompt_ids(HF, extra=extra)


def _write(tmp_path: Path, name: str, **kw) -> Path:
    return write(mimo2_gguf.write_mimo2_gguf, HF, tmp_path / name, **kw)


@needs_gguf(GGUF)
def test_bundled_file_is_the_writer_output_and_in_the_manifest(tmp_path):
    """Deterministic from the HF fixture: the writer, rerun, reproduces the bundled bytes (the manifest's sha256)."""
    assert_bundled_is_writer_output(mimo2_gguf.export_gguf, HF, GGUF, tmp_path)


@pytest.mark.parametrize("qkv", ["fused", "split"])
def test_gguf_reads_back_equal_to_the_hf_fixture(tmp_path, qkv):
    path = _write(tmp_path, f"{qkv}.gguf", qkv=qkv)
    hf, gg = load_target(HF), load_target(path)
    assert gg.source_format == "gguf" and gg.family == "mimo2" and gg.num_layers == hf.num_layers
    assert set(gg.tensors) == set(hf.tensors)
    assert all(torch.equal(gg.tensors[n].float(), hf.tensors[n].float()) for n in hf.tensors)
    assert gg.mimo == replace(hf.mimo, partial_rotary_factor=10 / 32) and gg.layer == hf.layer
    mtp = load_mimo2_mtp(path, gg)
    assert mtp.num_layers == 3 and mtp.source_format == "gguf" and mtp.attn == hf.mimo.swa


def test_reader_refuses_named_defects(tmp_path):
    from bloomery_gates.errors import BadConfig, Refused

    path = _write(tmp_path, "nosinks_mtp.gguf", drop=("blk.5.attn_sinks.weight",))
    with pytest.raises(Exception, match="attn_sinks.*on 4 of 5 SWA blocks"):
        load_target(path)
    meta_cfg = reader.Cfg({"mimo2.expert_gating_func": 1, "mimo2.expert_count": 8, "mimo2.expert_used_count": 2,
                           "mimo2.expert_feed_forward_length": 64}, "x.gguf")
    with pytest.raises(BadConfig, match="expert_gating_func.*sigmoid"):
        reader._moe(meta_cfg, "mimo2.")
    with pytest.raises(Refused):
        reader.mimo2_from_gguf(fixture_path("qwen3-tiny.gguf"))


def test_bad_gguf_is_exit_2_one_line(tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(_write(tmp_path, "whole.gguf").read_bytes()[:100_000])
    r = CliRunner().invoke(app, ["gate", "run", "mimo2-mtp", "--target", str(bad), "--draft", str(bad), "-n", "4"],
                           catch_exceptions=False)
    assert r.exit_code == 2 and "cut.gguf" in r.output and "Traceback" not in r.output, r.output


# ----------------------------------------------------------------------------------------------------- llama.cpp


def _target_check(spec, path: Path, seq: list[int], p: int) -> tuple[int, list[str]]:
    """check_target on ``path`` (llama.cpp's run) against our f64 reference on ``spec`` (the "plain ids": the
    reference's own teacher-forced argmax after rows p-1..T-2): (exit code, lines)."""
    from bloomery_gates.reference.families.mimo2.model import forward

    return reference_check(forward, oracle_llamacpp.check_target, spec, path, seq, p)


@needs_llama
def test_llama_cpp_trunk_and_mtp_agree_with_the_reference(tmp_path):
    path = _write(tmp_path, "m.gguf")
    spec = load_target(path)
    seq, p = _seq()
    code, lines = _target_check(spec, path, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 0 and logit.endswith(" PASS"), lines
    report, lines = _report()
    oracle_llamacpp_mimo2.check_mtp_chain(report, spec, load_mimo2_mtp(path, spec), seq)
    ours = [line for line in lines if "vs llama.cpp f32 MTP" in line]
    assert len(ours) == 6 and all(line.endswith(" PASS") for line in ours) and report.failed == 0, lines


@needs_llama
def test_split_qkv_file_skips_the_mtp_lines_with_the_reason(tmp_path):
    """llama.cpp's mimo2 MTP graph asserts a fused attn_qkv (an abort): never run, a note line says why."""
    path = _write(tmp_path, "split.gguf", qkv="split")
    spec = load_target(path)
    report, lines = _report()
    oracle_llamacpp_mimo2.check_mtp_chain(report, spec, load_mimo2_mtp(path, spec), _seq()[0])
    assert len(lines) == 1 and "asserts a fused attn_qkv" in lines[0] and report.failed == 0, lines


@needs_llama
@pytest.mark.parametrize("plant", ["sinks", "swa_pattern"])
def test_fail_first_writer_drops_sinks_or_swa_pattern(tmp_path, monkeypatch, plant):
    """The file written without its sinks / with every block full attention: llama.cpp on it, against the good
    file's reference, fails the logits line (exit 1)."""
    good = load_target(_write(tmp_path, "good.gguf"))
    if plant == "sinks":
        bad = _write(tmp_path, "bad.gguf", drop=("attn_sinks.weight",))
    else:
        monkeypatch.setattr(mimo2_gguf, "_keys", _no_swa_keys(mimo2_gguf._keys))
        bad = _write(tmp_path, "bad.gguf")
    seq, p = _seq()
    code, lines = _target_check(good, bad, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 1 and logit.endswith(" FAIL"), lines


def _no_swa_keys(keys):
    def planted(w, spec, name, mtp):           # the pattern key written as every trunk block full attention
        keys(w, spec, name, mtp)
        w.add_array("mimo2.attention.sliding_window_pattern", [0] * spec.num_layers + [1] * mtp)
    return planted


@needs_llama
@pytest.mark.parametrize("plant", ["sinks", "window"])
def test_fail_first_reader_ignores_sinks_or_window(tmp_path, monkeypatch, plant):
    """Our reader dropping the sinks / the SWA window (SWA blocks read as full causal): our reference on that spec,
    against llama.cpp on the (good) file, fails the logits line (exit 1)."""
    path = _write(tmp_path, "good.gguf")
    if plant == "sinks":
        monkeypatch.setattr(reader, "_kind_sinks", lambda *a: False)
    else:
        monkeypatch.setattr(reader, "_window", lambda cfg, a: None)
    spec = reader.mimo2_from_gguf(path)
    assert not (spec.mimo.swa.sinks if plant == "sinks" else spec.mimo.swa.window)
    seq, p = _seq()
    code, lines = _target_check(spec, path, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 1 and logit.endswith(" FAIL"), lines



@needs_llama
def test_fail_first_mtp_chain_fed_post_norm_hidden(tmp_path, monkeypatch):
    """Our reference chain fed the post-norm trunk rows (the HF convention) against llama.cpp's pre-norm MTP graph:
    the MTP lines fail (exit 1); the control (pre) passes in the test above."""
    from bloomery_gates.reference.families.mimo2 import mtp as ref_mtp

    path = _write(tmp_path, "m.gguf")
    spec = load_target(path)
    real = ref_mtp.chain
    monkeypatch.setattr(ref_mtp, "chain", lambda m, t, seq, hidden, mode, steps=None: real(
        m, t, seq, _post(t, hidden), "post", steps))
    report, lines = _report()
    oracle_llamacpp_mimo2.check_mtp_chain(report, spec, load_mimo2_mtp(path, spec), _seq()[0])
    head = [line for line in lines if line.startswith("(o) mtp layer 0 logits")]
    assert head and head[0].endswith(" FAIL") and report.finish() == 1, lines


def _post(spec, hidden):
    from bloomery_gates.reference.ops.norm import rms_norm
    from bloomery_gates.reference.weights import as_f64

    return rms_norm(hidden, as_f64(spec)["model.norm.weight"], spec.layer.rms_eps)


def test_inventory_verdict_for_the_gguf(tmp_path):
    path = _write(tmp_path, "m.gguf")
    r = CliRunner().invoke(app, ["inventory", str(path)], catch_exceptions=False)
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "verdict: MTP in-file (3 MTP layers" in out, out
    assert "drafter here: gate mimo2-mtp" in out, out
