"""ds41-dspark (issue 26): the seed engine's V4.1 DSpark draft (docs/FAMILIES_MOE.md 5.2) on the deepseek41 target.
The device draft (the DSV4 DSpark module with the V4.1 variants: the lagged stage, the LastMix collapse, no q head
norm, the taps' lag row dropped from the features) against the float64 reference and its training forward, the
5.2 reader's named errors (exit 2), the read_hf refusal, and the gate's FAIL-first plants on the trained fixture
(fixtures/ds41-tiny-dspark-b7.gguf): the lagged mix applied unlagged, LastMix replaced by the stream mean, the
features with the lag row included, V4's per-head q norm applied."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TARGET, DRAFT = FIXTURES / "ds41-tiny" / "ds41-tiny.gguf", FIXTURES / "ds41-tiny-dspark-b7.gguf"
needs_fixture = pytest.mark.skipif(not DRAFT.is_file(), reason="fixtures/ds41-tiny-dspark-b7.gguf not built")


def specs(draft: Path = DRAFT):
    from bloomery_cli.families.deepseek41.reader_dspark import deepseek41_dspark_from_gguf
    from bloomery_cli.families.deepseek41.reader_gguf import deepseek41_from_gguf

    target = deepseek41_from_gguf(TARGET)
    return target, deepseek41_dspark_from_gguf(draft, target)


@needs_fixture
def test_draft_equals_reference_and_its_training_forward():
    from bloomery_gates.kernels.families.deepseek4.dspark import (
        Deepseek4DSparkDraft,
        features,
        forward_train,
        target_streams,
    )
    from bloomery_gates.kernels.families.deepseek41.model import Deepseek41Target
    from bloomery_gates.reference.families.deepseek4 import dspark as ref
    from bloomery_gates.reference.families.qwen3.model import RefOut

    target, d = specs()
    assert (d.hc_mix, d.collapse, d.q_head_norm) == ("lagged", "last_mix", False)
    eng = Deepseek41Target(target, "cpu", torch.float64, 96)
    ids = list(range(200, 230))                       # 30 > W = 16: the window drops context keys
    pre = eng.prefill(ids)
    draft = Deepseek4DSparkDraft(d, eng, 96)
    draft.prompt(pre.taps)
    got = draft.propose(pre.argmax[-1], detail=True)
    assert got.layer_out.shape[2] == d.hc.count + 1   # the stage state carries its lag row
    want = ref.forward(d, target, RefOut(logits=None, hidden=pre.taps.numpy(), final=None), pre.argmax[-1])
    assert got.drafts == [int(x) for x in want.ids]
    assert np.abs(got.logits.numpy() - want.logits).max() < 1e-5 * np.abs(want.logits).max()
    full = ids + [pre.argmax[-1]] + got.drafts
    t = {k: v.double() for k, v in d.tensors.items()}
    feats = features(target_streams(eng.prefill(full).taps, d.hc.count), d.target_layer_ids)
    lg, z = forward_train(t, d, eng.embed, eng.head, feats, torch.tensor(full), torch.tensor([len(ids)]),
                          got.prev[None])
    # the engine keeps the mixes and the lag in float32; the training forward here runs all f64
    assert (lg[0] - got.logits).abs().max() < 1e-5 * got.logits.abs().max()
    assert (z[0] - got.conf_logits).abs().max() < 1e-5 * got.conf_logits.abs().max()


def rewrite(dst: Path, drop: str | None = None, value=None, extra: dict | None = None,
            bad_type: str | None = None) -> Path:
    """The fixture draft rewritten: key ``drop`` left out (value None) or set to ``value``; ``extra`` tensors
    added; ``bad_type`` stored as F16 (a type the 5.2 table does not allow)."""
    import gguf

    from bloomery_cli.families.deepseek41 import fixture_dspark as fx

    _, d = specs()
    real, put = gguf.GGUFWriter.add_key_value, fx.put

    def add(self, key, val, vtype, sub_type=None):
        if key != drop:
            return real(self, key, val, vtype, sub_type)
        if value is not None:
            return real(self, key, value, vtype, sub_type)
        return None

    def put_bad(wr, name, x):
        if name == bad_type:
            return wr.add_tensor(name, np.ascontiguousarray(x, dtype=np.float16))
        if name.startswith(("token_embd", "output_hc_", "conf_proj.bias")):   # not in the 5.2 table: as F32
            return wr.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
        return put(wr, name, x)

    gguf.GGUFWriter.add_key_value = add
    try:
        fx.write_gguf(dst, d, dict(d.tensors) | (extra or {}), put=put_bad, extra=fx.extra_keys(d))
    finally:
        gguf.GGUFWriter.add_key_value = real
    return dst


def gate_lines(tmp_path, draft: Path | None = None, n: int = 8, dtype: str = "bf16") -> tuple[int, list[str]]:
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    first = (FIXTURES / "prompts.jsonl").read_text().splitlines()[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": json.loads(first)["ids"]}) + "\n")
    args = ["gate", "run", "ds41-dspark", "-n", str(n), "--prompts", str(prompts), "--dtype", dtype]
    r = CliRunner().invoke(app, args + (["--draft", str(draft)] if draft else []))
    return r.exit_code, r.output.splitlines()


@needs_fixture
@pytest.mark.parametrize("key,value,named", [
    ("dflash.hash_layer_count", None, "hash_layer_count"), ("dflash.hash_layer_count", 2, "hash_layer_count"),
    ("dflash.block_size", None, "block_size"), ("dflash.attention.value_length", None, "value_length"),
    ("dflash.context_length", None, "context_length"), ("dflash.hyper_connection.count", None, "count"),
    ("dflash.target_layers", [2, 9], "target_layers"), ("dflash.target_layers", [4, 2], "target_layers"),
    ("dflash.vocab_size", None, "vocab_size"), ("dflash.vocab_size", 4000, "vocab_size"),
    ("dflash.expert_gating_func", 1, "expert_gating_func")])
def test_reader_names_every_bad_key_exit_2(tmp_path, key, value, named):
    code, lines = gate_lines(tmp_path, rewrite(tmp_path / "bad.gguf", key, value))
    out = "\n".join(lines)
    assert code == 2 and named in out and "Traceback" not in out, out


@needs_fixture
@pytest.mark.parametrize("how,named", [
    ({"extra": {"hc_head.hc_fn": torch.zeros(4, 256)}}, "output_hc_fn"),
    ({"extra": {"embed_tokens.weight": torch.zeros(4096, 64)}}, "token_embd"),
    ({"extra": {"confidence_head.proj.bias": torch.zeros(1)}}, "conf_proj.bias"),
    ({"bad_type": "fc.weight"}, "fc.weight"), ({"bad_type": "blk.0.ffn_norm.weight"}, "ffn_norm")])
def test_reader_refuses_foreign_tensors_and_types_exit_2(tmp_path, how, named):
    code, lines = gate_lines(tmp_path, rewrite(tmp_path / "bad.gguf", **how))
    out = "\n".join(lines)
    assert code == 2 and named in out and "Traceback" not in out, out


@needs_fixture
def test_reader_reads_back_the_fixture_exactly(tmp_path):
    _, d = specs(rewrite(tmp_path / "same.gguf"))
    _, want = specs()
    assert d.target_layer_ids == (1, 3) and d.block_size == 7 and d.markov_rank == 4 and d.collapse == "last_mix"
    assert d.confidence and "confidence_head.proj.bias" not in d.tensors       # the seed's conf_proj: no bias
    assert set(d.tensors) == set(want.tensors) and all(torch.equal(d.tensors[k], v) for k, v in want.tensors.items())


def test_read_hf_refuses_by_name(tmp_path):
    from bloomery_gates.errors import InputError
    from bloomery_gates.registry import FAMILIES

    fam = FAMILIES["deepseek41"]
    assert fam.runs
    with pytest.raises(InputError, match="deepseek41"):
        fam.read_hf(tmp_path)


def dspark_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith("(r) dspark") or "dspark context" in x]


@needs_fixture
def test_gate_dspark_lines_pass(tmp_path):
    code, lines = gate_lines(tmp_path, dtype="bf16")
    rows = dspark_lines(lines)
    assert code == 0 and len(rows) >= 8 and all(x.endswith("PASS") for x in rows), "\n".join(lines)


PLANT_DTYPE = "f32"   # every plant FAILs the gate in f32; in bf16 all but the lag-row one (the test after)


def unlagged(monkeypatch) -> None:
    """Each sublayer of the draft's stage folds its input by its OWN pre (V4's mix), not the previous one's."""
    from bloomery_gates.kernels.families.deepseek4 import dspark as kd

    m = kd.kmhc

    def own(x, lag, fn, base, scale, iters, eps, norm_eps, sublayer):
        w = m.mhc_weights(x, fn, base, scale, iters, eps, norm_eps)
        return m.mhc_expand(sublayer(m.mhc_collapse(x, w.pre)), x, w.post, w.comb), w.pre

    monkeypatch.setattr(kd, "klag", types.SimpleNamespace(**(vars(kd.klag) | {"lagged_sublayer": own})))


def mean_collapse(monkeypatch) -> None:
    """LastMix replaced by the unweighted stream mean (the lag row dropped)."""
    from bloomery_gates.kernels.families.deepseek4 import dspark as kd

    monkeypatch.setitem(kd.COLLAPSE, "last_mix", lambda spec, t, x: kd.kmhc.mhc_head(x[:, :spec.hc.count]))


def features_with_lag_row(monkeypatch) -> None:
    """The features average all S+1 rows of the target's tap (the lag row included)."""
    from bloomery_gates.kernels.families.deepseek4 import dspark as kd

    monkeypatch.setattr(kd, "target_streams", lambda taps, streams: taps)


def q_head_norm(monkeypatch) -> None:
    """V4's per-head q norm applied in the V4.1 stage."""
    from bloomery_gates.kernels.families.deepseek4 import dspark as kd

    real = kd.kv4.q_heads
    monkeypatch.setattr(kd, "kv4", types.SimpleNamespace(**(vars(kd.kv4) | {
        "q_heads": lambda x, w, nh, eps, q_head_norm=True: real(x, w, nh, eps, True)})))


@needs_fixture
@pytest.mark.parametrize("plant", [unlagged, mean_collapse, features_with_lag_row, q_head_norm],
                         ids=["mix-unlagged", "last-mix-mean", "features-lag-row", "q-head-norm"])
def test_fail_first_gate_exits_1(tmp_path, monkeypatch, plant):
    plant(monkeypatch)
    code, lines = gate_lines(tmp_path, dtype=PLANT_DTYPE)
    assert code == 1, "\n".join(lines)
    assert any(x.endswith("FAIL") for x in dspark_lines(lines)), "\n".join(lines)


@needs_fixture
@pytest.mark.parametrize("plant", [unlagged, mean_collapse, q_head_norm], ids=["mix-unlagged", "last-mix-mean",
                                                                               "q-head-norm"])
def test_fail_first_dspark_line_fails_in_bf16(tmp_path, monkeypatch, plant):
    """In bf16 (the records' dtype) the plant must FAIL a dspark line itself, not only a state line. (The lag-row
    plant is caught in f32 only: enc_norm's RMS cancels the 4/5 scale of a mean
    over S+1 rows, and what is left, the lag row's S channels, is inside the bf16 band.)"""
    plant(monkeypatch)
    code, lines = gate_lines(tmp_path, dtype="bf16")
    assert code == 1, "\n".join(lines)
    assert any(x.endswith("FAIL") for x in dspark_lines(lines) if "state after" not in x), "\n".join(lines)
