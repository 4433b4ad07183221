"""Tier 3 (HF transformers' Qwen3 on the same weights) and tier 2 (derived bands)."""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util

import numpy as np
import pytest
from test_reference import IDS, SHAPE, tiny_qwen3

from bloomery_cli import bands
from bloomery_cli.oracle import hf as oracle
from bloomery_gates.errors import InputError
from bloomery_gates.reference.families.qwen3 import model as qwen3

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="transformers not installed (pip install '.[dev]')")


@needs_hf
@pytest.mark.parametrize("tied", [False, True])
def test_reference_equals_hf_qwen3_f64(tied: bool):
    spec = tiny_qwen3(tied=tied)
    ref = qwen3.forward(spec, IDS)
    hf = oracle.hf_qwen3(spec, IDS)
    assert bands.worst_rel(ref.logits, hf.logits) < 1e-10
    assert np.abs(ref.logits - hf.logits).max() < 1e-10
    assert bands.worst_rel(qwen3.hf_hidden_states(ref), hf.hidden_states) < 1e-10
    assert np.array_equal(oracle.hf_qwen3_logits(spec, IDS), hf.logits)


@needs_hf
def test_reference_near_stock_hf_with_f32_islands():
    """Stock HF (eager, RMSNorm / RoPE / softmax in float32) is within a few f32 ulps of the reference,
    and measurably not exact: the islands the oracle promotes are real."""
    spec = tiny_qwen3()
    ref = qwen3.forward(spec, IDS)
    stock = oracle.hf_qwen3_logits(spec, IDS, promote_f32=False)
    rel = bands.worst_rel(stock, ref.logits)
    assert 1e-12 < rel < bands.logits_band("f32", SHAPE, layers=2, seq_len=len(IDS)).value


@needs_hf
def test_oracle_sees_a_planted_defect():
    """FAIL-first: swapping q_norm and k_norm weights moves the reference away from HF."""
    spec = tiny_qwen3()
    t = dict(spec.tensors)
    q, k = "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"
    t[q], t[k] = t[k], t[q]
    bad = qwen3.forward(dataclasses.replace(spec, tensors=t), IDS)
    assert bands.worst_rel(bad.logits, oracle.hf_qwen3_logits(spec, IDS)) > 1e-4


def test_oracle_without_transformers_is_an_input_error(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "transformers":
            raise ImportError("no transformers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(InputError, match="not installed"):
        oracle.hf_qwen3_logits(tiny_qwen3(), IDS)


@needs_hf
def test_oracle_rejects_a_bad_state_dict():
    spec = tiny_qwen3()
    t = {k: v for k, v in spec.tensors.items() if k != "model.norm.weight"}
    with pytest.raises(InputError, match="missing"):
        oracle.hf_qwen3_logits(dataclasses.replace(spec, tensors=t), IDS)


# ---- bands (tier 2) -------------------------------------------------------------------------------

def test_gamma_monotone_and_domain():
    u = 2.0**-24
    values = [bands.gamma(n, u) for n in [0, 1, 16, 4096, 10**6]]
    assert values[0] == 0 and all(a < b for a, b in zip(values, values[1:], strict=False))
    assert bands.gamma(64, 2.0**-8) > bands.gamma(64, 2.0**-11) > bands.gamma(64, 2.0**-24)
    assert bands.gamma(10, 1e-3) == pytest.approx(10e-3 / (1 - 10e-3))
    with pytest.raises(ValueError):
        bands.gamma(256, 2.0**-8)


def test_unit_roundoff_spellings():
    assert bands.unit_roundoff("bf16") == bands.unit_roundoff("torch.bfloat16") == 2.0**-8
    assert bands.unit_roundoff("float16") == 2.0**-11 and bands.unit_roundoff("f32") == 2.0**-24
    with pytest.raises(ValueError):
        bands.unit_roundoff("int8")


def test_bands_order_and_derivation():
    lb = {d: bands.layer_band(d, SHAPE, layers=2, seq_len=64) for d in ["f32", "f16", "bf16"]}
    assert lb["bf16"].value > lb["f16"].value > lb["f32"].value > 0
    assert "kappa=8" in lb["bf16"].derivation and "bf16" in lb["bf16"].derivation
    assert bands.layer_band("bf16", SHAPE, 3, 64).value > lb["bf16"].value
    assert bands.layer_band("f32", SHAPE, 2, 4096).value > lb["f32"].value
    assert bands.logits_band("bf16", SHAPE, 2, 64).value > lb["bf16"].value
    assert bands.layer_band("bf16", SHAPE, 0, 64).value == 0.0
    # the formula, by hand: kappa * sum(u_store + gamma(n, 2^-24)) over one layer's 13 ops
    ops = bands.layer_ops(SHAPE, 64)
    want = 8 * sum(2.0**-8 + bands.gamma(op.n, 2.0**-24) for op in ops)
    assert bands.layer_band("bf16", SHAPE, 1, 64).value == pytest.approx(want)
    assert bands.Band(0.1, "x").contains(0.1) and not bands.Band(0.1, "x").contains(0.11)


def test_worst_rel():
    ref = np.array([[1.0, -4.0], [0.5, 0.25]])
    assert bands.worst_rel(ref, ref) == 0.0
    got = ref + np.array([[0.4, 0.0], [0.0, 0.05]])
    assert bands.worst_rel(got, ref) == pytest.approx(max(0.4 / 4.0, 0.05 / 0.5))
    assert bands.worst_rel(np.array([[np.nan, 0.0]]), np.array([[1.0, 0.0]])) == float("inf")
    assert bands.worst_rel(np.array([[0.0, 1e-3]]), np.zeros((1, 2))) == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        bands.worst_rel(np.zeros(3), np.zeros(4))


def test_flip_excused():
    band = bands.Band(0.01, "test")
    assert bands.flip_excused(np.array([10.0, 9.9, 0.0]), band)         # margin 0.1 <= 2 * 0.01 * 10
    assert not bands.flip_excused(np.array([10.0, 9.0, 0.0]), band)


def test_a_family_without_an_outside_oracle(tmp_path):
    """``gate run --oracle`` on a family no outside code runs (deepseek41) is bad input (exit 2); ``bloomery gates``
    (oracle_where_exists) runs it with an (o) note instead of stopping at it (CI's gates run did, at ds41-dspark)."""
    import json
    from pathlib import Path

    from bloomery_cli.gate import GateOptions, run_gate
    from bloomery_gates.gates import GATES

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    if not (fixtures / "ds41-tiny-dspark-b7.gguf").is_file():
        pytest.skip("fixtures/ds41-tiny-dspark-b7.gguf not built")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": json.loads((fixtures / "prompts.jsonl").read_text().splitlines()[0])["ids"]})
                       + "\n")
    gate = GATES["ds41-dspark"]
    with pytest.raises(InputError, match="no external oracle for family deepseek41"):
        run_gate(gate, GateOptions(n=8, prompts=prompts, oracle=True))
    code, rep = run_gate(gate, GateOptions(n=8, prompts=prompts, oracle=True, oracle_where_exists=True))
    notes = [x for x in rep.lines if x.startswith("(o)")]
    assert code == 0 and len(notes) == 1 and notes[0].startswith("(o) none: no outside code runs family deepseek41")
