"""The engine gate (issue 23): another engine's greedy runs judged against the float64 reference.

Without llama.cpp: the record's schema (round trip, named exit-2 errors), our own engine's record judged PASS,
and planted defects in a record (drafts off the reference, a drafted run that differs, nothing drafted) FAIL.
With llama.cpp's driver (`bloomery engine build`; skipped with the reason otherwise): the pairs it runs pass on
the fixtures in f32 (qwen38-mtp: the one known difference, llama.cpp's zero-hidden MTP row 0, named), and
defects planted in what llama.cpp is given, which it runs without complaint, fail the (a) lines while ids stay
identical: target layer ids shifted by one in the DFlash draft GGUF, DFlash2 without its selector, the MTP fed a
hidden through a final-norm gain it was not trained with; a run that never drafts fails closed."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf_edit import edited, read

from bloomery_cli.contract import Report
from bloomery_cli.engines import llamacpp
from bloomery_cli.engines import record as rec
from bloomery_cli.engines.gate import EngineOptions, judge_record, run_engine_gate
from bloomery_cli.engines.judge import sign_test
from bloomery_cli.gate import GateOptions, run_gate
from bloomery_gates.errors import InputError
from bloomery_gates.gates import GATES


def quiet(_: str) -> None:
    pass


def failed(rep: Report) -> list[str]:
    return [line for line in rep.lines if line.endswith(" FAIL")]


@pytest.fixture(scope="module")
def own_record(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "own.jsonl"
    code, _ = run_gate(GATES["qwen3-dflash"], GateOptions(n=48, max_prompts=3, record=path), emit=quiet)
    assert code == 0
    return path


def test_sign_test():
    assert sign_test(0, 0) == 1.0 and sign_test(3, 0) == 0.125 and sign_test(0, 5) == 1.0
    assert sign_test(20, 0) < 1e-3 < sign_test(10, 2)


def test_own_engine_record_round_trips_and_passes(own_record, tmp_path):
    r = rec.read(own_record)
    assert r.header.gate == "qwen3-dflash" and len(r.prompts) == 3 and r.header.width == 7
    again = tmp_path / "again.jsonl"
    rec.write(r, again)
    assert again.read_text() == own_record.read_text()
    code, rep = judge_record(GATES["qwen3-dflash"], own_record, emit=quiet)
    assert code == 0, "\n".join(rep.lines)
    assert any(x.startswith("(a) draft ids") and x.endswith("0 differ PASS") for x in rep.lines)


def _planted(src: Path, dst: Path, edit) -> Path:
    r = rec.read(src)
    edit(r)
    rec.write(r, dst)
    return dst


def test_record_with_drafts_off_the_reference_fails(own_record, tmp_path):
    def shift(r):                  # every proposal's ids moved by one: the drafter computes something else
        for p in r.prompts:
            for w in p.windows:
                w.draft_ids = [(x + 1) % 4096 for x in w.draft_ids]
                w.accepted, w.emitted = 0, 1 if w.proposed else w.emitted
            p.drafted_ids = p.plain_ids
    code, rep = judge_record(GATES["qwen3-dflash"], _planted(own_record, tmp_path / "p.jsonl", shift), emit=quiet)
    assert code == 1 and any(x.startswith("(a) draft ids") for x in failed(rep)), rep.lines


def test_record_whose_drafted_ids_differ_fails(own_record, tmp_path):
    def flip(r):
        r.prompts[1].drafted_ids[5] = (r.prompts[1].drafted_ids[5] + 1) % 4096
    code, rep = judge_record(GATES["qwen3-dflash"], _planted(own_record, tmp_path / "p.jsonl", flip), emit=quiet)
    assert code == 1 and any(x.startswith("(w) prompt 1: ids differ at 5") for x in failed(rep)), rep.lines


def test_record_that_never_drafted_fails_closed(own_record, tmp_path):
    def plain(r):
        for p in r.prompts:
            p.windows = [rec.Window(0, 0, 1) for _ in p.drafted_ids]
    code, rep = judge_record(GATES["qwen3-dflash"], _planted(own_record, tmp_path / "p.jsonl", plain), emit=quiet)
    assert code == 1 and any(x.startswith("(b) accepts 0 of 0") for x in failed(rep)), rep.lines
    assert "ids identical 48" in rep.lines and not any(x.startswith("PASSED") for x in rep.lines)


def test_record_whose_plain_ids_leave_the_reference_fails_in_bf16(own_record, tmp_path):
    """(e) in bf16: a plain id that is not the f64 greedy id, where the f64 row has a clear top-1, is a defect. The
    band is that row's own (a band over the whole tap took the worst row's ratio to every row: past 1 in bf16 on
    mimo2, where it excused any flip)."""
    def wrong(r):
        r.header = replace(r.header, dtype="bf16")
        p = r.prompts[0]
        p.plain_ids[10] = p.drafted_ids[10] = (p.plain_ids[10] + 1) % 4096
    code, rep = judge_record(GATES["qwen3-dflash"], _planted(own_record, tmp_path / "p.jsonl", wrong), emit=quiet)
    bad = [x for x in failed(rep) if x.startswith("(e) prompt 0")]
    assert code == 1 and bad and "first divergence at id 10" in bad[0] and "defect" in bad[0], rep.lines


def test_flip_band_is_the_rows_own():
    """A tap whose one row has small logits (its emulated error near its max) must not excuse a clear flip in
    another row: the band of the flip is that row's own. (With the tap-wide band, 3 x the worst row's ratio, this
    flip at a margin of 0.5 of max|logit| passed as a near-tie.)"""
    from types import SimpleNamespace

    from bloomery_cli.engines.judge import Judge

    rng = np.random.default_rng(0)
    exact = rng.normal(size=(2, 64))
    exact[0] *= 1e-3                                  # a row of small logits
    exact[1, :2] = [10.0, 5.0]                        # a clear top-1: margin 0.5 of max|logit|
    emu = exact + 1e-3 * np.sign(rng.normal(size=exact.shape)) * np.abs(exact).max(-1, keepdims=True) * 1e-2
    emu[0] = exact[0] + 1e-3                          # row 0: an error the size of its logits
    j = object.__new__(Judge)
    j.dtype = "bf16"
    j.taps = lambda seq: SimpleNamespace(logits=exact)
    j.emulated_taps = lambda seq: SimpleNamespace(logits=emu)
    margin, near, band = j.flip([1, 2, 3], 1)
    assert margin == pytest.approx(0.5) and not near and band < 0.25


@pytest.mark.parametrize("text, what", [
    ('{"schema": "x"}\n{}\n', "schema"),
    ('{"schema": "bloomery.engine-record/1", "engine": "e", "gate": "qwen3-dflash", "dtype": "f8", "device": "cpu", '
     '"n": 4, "width": 3, "acceptance": "a"}\n{}\n', "dtype"),
    ('{"schema": "bloomery.engine-record/1", "engine": "e", "gate": "qwen3-dflash", "dtype": "f32", "device": "cpu", '
     '"n": 4, "width": 3, "acceptance": "a"}\n{"prompt": 0, "prompt_ids": [1], "plain_ids": [1, -2], '
     '"drafted_ids": [1], "windows": []}\n', "plain_ids"),
    ('{"schema": "bloomery.engine-record/1", "engine": "e", "gate": "qwen3-dflash", "dtype": "f32", "device": "cpu", '
     '"n": 4, "width": 3, "acceptance": "a"}\n{"prompt": 0, "prompt_ids": [1], "plain_ids": [1], "drafted_ids": [1], '
     '"windows": [{"proposed": 2, "accepted": 3, "emitted": 1}]}\n', "accepted"),
])
def test_bad_record_is_a_named_exit_2_error(tmp_path, text, what):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=what):
        rec.read(path, 4096)


def _driver() -> Path | None:
    for cand in (os.environ.get(llamacpp.ENV), Path.home() / ".cache/bloomery/llama.cpp"):
        if cand:
            try:
                return llamacpp.find_driver(Path(cand))
            except InputError:
                continue
    return None


DRIVER = _driver()
needs_llama = pytest.mark.skipif(DRIVER is None, reason="no llama.cpp driver: `bloomery engine build --out DIR` "
                                 "and set BLOOMERY_LLAMA_CPP=DIR (CI builds it)")


def engine(name: str, gate=None, n: int = 96):
    drv_dir = DRIVER.parent.parent
    return run_engine_gate(gate or GATES[name], EngineOptions(llama_cpp=drv_dir, n=n, max_prompts=6), emit=quiet)


def test_unrunnable_pair_is_exit_2_before_any_work():
    with pytest.raises(InputError, match="cannot run this pair"):
        run_engine_gate(GATES["qwen3-eagle3"], EngineOptions(llama_cpp=Path("/nonexistent")), emit=quiet)


@needs_llama
@pytest.mark.parametrize("name", ["qwen3-dflash", "qwen38-dspark"])
def test_llamacpp_passes_on_fixture(name):
    code, rep = engine(name)
    assert code == 0, "\n".join(rep.lines)
    assert "ids identical 96" in rep.lines and any(x.startswith("(e) prompt 0") for x in rep.lines)


@needs_llama
def test_llamacpp_mtp_difference_is_its_zero_hidden_row():
    code, rep = engine("qwen38-mtp", n=256)
    conv = rep.facts.get("engine_convention")
    assert [x.split(":")[0] for x in failed(rep)] in ([], ["(a) draft ids on the engine's windows vs host f64 drafter"])
    if failed(rep):
        assert conv and conv["reproduced"] == conv["checked"], rep.lines
    assert "ids identical 256" in rep.lines


def _draft_plant(monkeypatch, **edit):
    real = llamacpp.convert_draft

    def convert(*args):
        p = real(*args)
        return edited(p, p.with_name("planted.gguf"), **edit)
    monkeypatch.setattr(llamacpp, "convert_draft", convert)


def _shift_layers(monkeypatch, by: int):
    import gguf
    real = llamacpp.convert_draft

    def convert(*args):
        p = real(*args)
        ids = [int(x) + by for x in gguf.GGUFReader(str(p)).fields["dflash.target_layers"].contents()]
        return edited(p, p.with_name("planted.gguf"), fields={"dflash.target_layers": ids})
    monkeypatch.setattr(llamacpp, "convert_draft", convert)


@needs_llama
def test_plant_target_layer_ids_off_by_one(monkeypatch):
    _shift_layers(monkeypatch, -1)
    code, rep = engine("qwen3-dflash")
    bad = [x.split(":")[0] for x in failed(rep)]
    assert code == 1 and any(x.startswith("(a) acceptance") for x in bad) and any(x.startswith("(a) draft ids")
                                                                                 for x in bad), rep.lines
    assert "ids identical 96" in rep.lines


@needs_llama
def test_plant_layer_id_past_the_target_aborts_llamacpp_and_fails_closed(monkeypatch):
    _shift_layers(monkeypatch, +1)           # [2, 3, 5]: 5 is the last layer; llama.cpp asserts instead of refusing
    code, rep = engine("qwen3-dflash", n=16)
    assert code == 1 and any("aborted" in x for x in failed(rep)), rep.lines


@needs_llama
def test_plant_dflash2_without_its_selector(monkeypatch):
    zero = np.zeros_like
    _draft_plant(monkeypatch, tensors={"selector_hidden.weight": zero, "selector_predecessor.weight": zero,
                                       "selector_successor.weight": zero})
    code, rep = engine("qwen3-dflash2")
    bad = [x.split(":")[0] for x in failed(rep)]
    assert code == 1 and any(x.startswith("(a) draft ids") for x in bad), rep.lines
    assert "ids identical 96" in rep.lines


@needs_llama
def test_plant_mtp_fed_a_hidden_it_was_not_trained_on(monkeypatch):
    """The fixture's final-norm gain is almost uniform (std 0.08 around 1.5), so the pre- / post-norm mix-up
    itself is nearly invisible after the MTP's own RMSNorm on it: the plant is its stronger relative. The target
    file gets a final-norm gain multiplied by f (per channel, x0.5..x2) with the head divided by f (target
    logits unchanged), so the MTP reads a hidden scaled by f that it was never trained on."""
    real = llamacpp.target_gguf

    def target(src, dtype, work):
        p = real(src, dtype, work)
        e = read(p, "token_embd.weight")
        f = np.exp(np.random.default_rng(0).uniform(-0.7, 0.7, e.shape[1])).astype(np.float32)
        return edited(p, work / "planted.gguf", add={"output.weight": e / f[None, :]},
                      tensors={"output_norm.weight": lambda g: g * f,
                               "blk.4.nextn.shared_head_norm.weight": lambda s: s / f})
    monkeypatch.setattr(llamacpp, "target_gguf", target)
    code, rep = engine("qwen38-mtp", n=128)
    conv = rep.facts["engine_convention"]
    assert code == 1 and conv["reproduced"] < conv["checked"] // 2, rep.lines
    assert "ids identical 128" in rep.lines and all(not x.startswith("(e)") for x in failed(rep))


@needs_llama
def test_plant_a_run_that_never_drafts_fails_closed():
    code, rep = engine("qwen3-dflash", gate=replace(GATES["qwen3-dflash"], block=lambda d: 1), n=32)
    assert code == 1 and any(x.startswith("(b) accepts 0 of 0") for x in failed(rep)), rep.lines
