"""qwen4exp (Qwen3.8-Flash-Next) trunk, issue 25: the float64 reference against transformers' own
``Qwen4ExpForCausalLM`` on a tiny random checkpoint made here (tests/qwen4exp_factory.py), in true float64 and in HF's
plain "float64" with its float32 islands, plus FAIL-first plants that the oracle comparison catches.

Bands (docs/FAMILIES_MOE.md 2.2):
  * HF under ``Float32AsFloat64`` (every float32 island lifted): both sides are float64 end to end and differ only
    in summation order, so 1e-12 relative to max |x| (measured: about 1e-15).
  * HF plain ``.to(float64)``: its grouped norms, router softmax, DeltaNet, rotary table and hyper-connection mixes
    run in float32 (2.2 measured 1.2e-8 on logits of max 0.23 for qwen4_exp, about 5e-8 relative). A float32 island
    rounds at unit roundoff u = 2^-24 = 6e-8 and a few dozen of them chain through 4 layers, so the band is 16u
    (9.5e-7) relative to max |logit|; the test also asserts the islands are really there (the difference exceeds
    1e-10), so the band is not wider than the effect it allows for.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from qwen4exp_factory import make_qwen4exp

from bloomery_gates.reference.families.qwen4exp import model as rq
from bloomery_gates.reference.ops import ple as rple

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
F64_BAND, ISLAND_BAND = 1e-12, 16 * 2.0 ** -24
EOS = 1


def token_ids(seed: int = 1, n: int = 24) -> list[int]:
    ids = [int(x) for x in np.random.default_rng(seed).integers(2, 300, n)]
    ids[9] = ids[10] = ids[17] = EOS                               # n-gram segments: two eos in a row, one alone
    return ids


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen4exp")
    return {(gate, tied): make_qwen4exp(root / f"{gate}-{tied}", seed=0, output_gate_type=gate,
                                        tie_word_embeddings=tied)
            for gate in ("sigmoid", "silu") for tied in (False, True)}


@needs_hf
@pytest.mark.parametrize("gate", ["sigmoid", "silu"])
@pytest.mark.parametrize("tied", [False, True])
def test_reference_equals_hf_qwen4exp_true_f64(specs, gate, tied):
    from bloomery_cli.families.qwen4exp.oracle import hf_qwen4exp

    spec, ids = specs[(gate, tied)], token_ids()
    ref, hf = rq.forward(spec, ids), hf_qwen4exp(spec, ids, promote_f32=True)
    assert ref.hidden.shape == (spec.num_layers + 1, len(ids), spec.hc.count * spec.hidden_size)
    for l in range(spec.num_layers):                               # HF's hidden_states[l]: the streams into layer l
        assert rel(ref.hidden[l], hf.hidden_states[l]) < F64_BAND, l
    assert rel(ref.logits, hf.logits) < F64_BAND
    assert (ref.logits.argmax(-1) == hf.logits.argmax(-1)).all()


@needs_hf
def test_reference_within_the_fp32_island_band_of_plain_hf_f64(specs):
    from bloomery_cli.families.qwen4exp.oracle import hf_qwen4exp

    spec, ids = specs[("sigmoid", False)], token_ids()
    ref, hf = rq.forward(spec, ids), hf_qwen4exp(spec, ids, promote_f32=False)
    d = rel(ref.logits, hf.logits)
    assert 1e-10 < d < ISLAND_BAND, d


def test_the_fixture_exercises_every_block(specs):
    """Not a vacuous comparison: PLE hashes real n-grams, QSA is sparse, the routing spreads, streams differ."""
    spec, ids = specs[("sigmoid", False)], token_ids()
    assert spec.ple is not None and spec.ple.layers == (0,) and spec.output_gate == "sigmoid"
    hashed = rq.hashed_ids(spec, np.asarray(ids))
    assert len(np.unique(hashed)) > 2 * len(ids)
    ref = rq.forward(spec, ids)
    w = rq.as_f64(spec)
    full = [l for l in range(spec.num_layers) if not spec.hybrid.is_linear(l)]
    b = rq.residual(w, f"model.layers.{full[0]}.attn_hyper_connection.", ref.hidden[full[0]], spec.hc.count,
                    spec.layer.rms_eps).block_in
    mask = rq.qsa_mask(spec, w, full[0], b, np.arange(len(ids)))
    causal = np.tril(np.ones((len(ids), len(ids)), dtype=bool))
    assert (mask <= causal).all() and (mask.sum(-1) < causal.sum(-1)).sum() > len(ids) // 2
    streams = ref.hidden[-1].reshape(len(ids), spec.hc.count, -1)
    assert np.abs(streams[:, 0] - streams[:, 1]).max() > 0.1


def test_reference_layer_composes_forward(specs):
    spec, ids = specs[("silu", False)], token_ids()
    ref = rq.forward(spec, ids)
    for l in range(spec.num_layers):
        got = rq.reference_layer(spec, l, ref.hidden[l], ids=ids)
        assert np.abs(got - ref.hidden[l + 1]).max() == 0.0
    assert np.abs(rq.final_norm(spec, ref.hidden[-1]) - ref.final).max() == 0.0
    with pytest.raises(ValueError, match="PLE and needs the token ids"):
        rq.reference_layer(spec, spec.ple.layers[0], ref.hidden[0])


def test_reference_refuses_what_it_does_not_compute(specs):
    import dataclasses

    spec = specs[("silu", False)]
    with pytest.raises(ValueError, match="output gate"):
        rq.forward(dataclasses.replace(spec, output_gate=""), token_ids())
    with pytest.raises(ValueError, match="norm_topk_prob"):
        rq.forward(dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, norm_topk=False)), token_ids())


# ------------------------------------------------------------------ FAIL-first: plants the oracle comparison catches

@needs_hf
@pytest.mark.parametrize("plant", ["HC inject gains set to 1", "PLE hash multiplier wrong",
                                   "QSA selection ignored (dense causal)"])
def test_fail_first_plants_leave_the_oracle_band(specs, plant, monkeypatch):
    from bloomery_cli.families.qwen4exp.oracle import hf_qwen4exp
    from bloomery_gates.reference.ops import gated_hc as rhc

    spec, ids = specs[("sigmoid", False)], token_ids()
    hf = hf_qwen4exp(spec, ids, promote_f32=True)
    assert rel(rq.forward(spec, ids).logits, hf.logits) < F64_BAND
    if plant == "HC inject gains set to 1":
        real = rhc.gated_residual

        def ones(x, norm_w, down, up, inject, streams, eps):
            got = real(x, norm_w, down, up, inject, streams, eps)
            return got if got.inject is None else rhc.HcIn(got.block_in, np.ones_like(got.inject))
        monkeypatch.setattr(rhc, "gated_residual", ones)
    elif plant == "PLE hash multiplier wrong":
        real_tables = rple.ngram_tables

        def off(*a, **k):
            t = real_tables(*a, **k)
            return rple.NgramTables(t.multipliers + np.array([0, 2, 0], dtype=np.int64), t.sizes, t.offsets)
        monkeypatch.setattr(rple, "ngram_tables", off)
    else:
        monkeypatch.setattr(rq, "qsa_mask", lambda spec, w, l, b, pos: np.ones((len(b), len(b)), dtype=bool))
    assert rel(rq.forward(spec, ids).logits, hf.logits) > ISLAND_BAND


# ------------------------------------------------------------------------------------------------ the engine

def target_report(spec, dtype: str, ids: list[int]):
    import torch

    from bloomery_cli.contract import Report
    from bloomery_gates.gates.targets import check_target
    from bloomery_gates.registry import FAMILIES

    eng = FAMILIES["qwen4exp"].engine(spec, "cpu", {"f32": torch.float32, "bf16": torch.bfloat16}[dtype], 64, rows=4)
    p = eng.prefill(ids, logits=True)
    report = Report("t", emit=lambda line: None)
    check_target(report, FAMILIES["qwen4exp"], spec, p, rq.forward(spec, ids), dtype, ids)
    return report


def test_engine_matches_reference_f32_prefill_and_verify(specs):
    import torch

    from bloomery_gates.kernels.families.qwen4exp.model import Qwen4ExpTarget

    spec, ids = specs[("sigmoid", False)], token_ids()
    ref = rq.forward(spec, ids)
    eng = Qwen4ExpTarget(spec, "cpu", torch.float32, 64, rows=4)
    p = eng.prefill(ids[:10], logits=True)
    assert rel(p.taps.double().numpy(), ref.hidden[:, :10]) < 1e-5
    got = [p.logits]
    for k in range(10, len(ids), 4):                               # verify 4 rows, commit them, from the states
        v = eng.verify(ids[k:k + 4], logits=True)
        eng.commit(len(ids[k:k + 4]))
        got.append(v.logits)
    assert rel(torch.cat(got).double().numpy(), ref.logits) < 1e-5
    assert sorted(p.routing) == [0, 1, 2, 3]
    assert len(set(p.routing[0].ids.flatten().tolist())) >= 4       # the experts really route


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate", ["sigmoid", "silu"])
def test_target_lines_pass(specs, dtype, gate):
    spec, ids = specs[(gate, False)], token_ids()
    report = target_report(spec, dtype, ids)
    assert report.failed == 0, report.lines
    assert sum(1 for line in report.lines if line.startswith("(r) target layer") and " out [" in line) \
        == spec.num_layers, report.lines
    assert sum(1 for line in report.lines if " chosen experts " in line) == spec.num_layers, report.lines  # check_extra


@pytest.mark.parametrize("plant", ["mix and inject swapped", "PLE hash multiplier wrong"])
def test_fail_first_engine_plants_fail_an_r_line_in_bf16(specs, plant, monkeypatch):
    import torch

    from bloomery_gates.kernels.families.qwen4exp import model as kq

    spec, ids = specs[("sigmoid", False)], token_ids()
    assert target_report(spec, "bf16", ids).failed == 0
    if plant == "mix and inject swapped":
        real = kq.hc.gated_residual

        def swapped(x, norm_w, down, up, inject, streams, eps):
            """the two roles traded: the block reads the streams weighted by the inject gains, the output goes
            back through per-element mix gains averaged to one a stream"""
            got = real(x, norm_w, down, up, inject, streams, eps)
            if got.inject is None:
                return got
            h = x.shape[-1] // streams
            xn = kq.hc.grouped_norm(x, norm_w, h, eps).unflatten(-1, (streams, h))
            block_in = (got.inject.float()[..., None] * xn.float()).mean(-2).to(x.dtype)
            return kq.hc.HcIn(block_in, torch.ones_like(got.inject))
        monkeypatch.setattr(kq.hc, "gated_residual", swapped)
    else:
        real_tables = kq.kple.ngram_tables

        def off(*a, **k):
            m, sizes, offsets = real_tables(*a, **k)
            return m + torch.tensor([0, 2, 0], dtype=torch.int64), sizes, offsets
        monkeypatch.setattr(kq.kple, "ngram_tables", off)
    report = target_report(spec, "bf16", ids)
    assert report.failed >= 1, report.lines
    assert any(line.startswith("(r) target layer") and line.endswith("FAIL") for line in report.lines), report.lines


def test_drafted_and_plain_passes_give_the_same_bits_bf16(specs):
    """What ``ids identical`` will rest on: rows verified 4 at a time with a partial commit (the rejected rows'
    KV, block inputs, PLE rows and DeltaNet inputs left behind) give the bits of one-row passes, and leave the same
    committed state (KV rows, conv tails, delta-rule states)."""
    import torch

    from bloomery_gates.kernels.families.qwen4exp.model import Qwen4ExpTarget

    spec, ids = specs[("sigmoid", False)], token_ids()
    plain, drafted = (Qwen4ExpTarget(spec, "cpu", torch.bfloat16, 64, rows=4) for _ in range(2))
    plain.prefill(ids[:10])
    drafted.prefill(ids[:10])
    want = []
    for k in range(10, 20):
        want.append(plain.verify([ids[k]], logits=True).logits)
        plain.commit(1)
    got, k = [], 10
    for kept in (2, 3, 1, 4):                                       # verify 4 rows, keep some, go on from there
        wrong = [(i + 7) % 300 for i in ids[k:k + 4]]                # the rows after the kept ones: rejected drafts
        rows = ids[k:k + kept] + wrong[kept:]
        got.append(drafted.verify(rows, logits=True).logits[:kept])
        drafted.commit(kept)
        k += kept
    assert torch.equal(torch.cat(got), torch.cat(want))
    assert plain.length == drafted.length == 20
    for l in plain.attn_layers:
        assert all(torch.equal(a, b) for a, b in zip(plain.kv_rows(l), drafted.kv_rows(l), strict=True))
    for l in plain.lin_layers:
        assert all(torch.equal(a, b) for a, b in zip(plain.recurrent_state(l), drafted.recurrent_state(l), strict=True))


def test_engine_state_after_verify_and_commit_equals_the_reference_f32(specs):
    import torch

    from bloomery_gates.kernels.families.qwen4exp.model import Qwen4ExpTarget

    spec, ids = specs[("sigmoid", False)], token_ids()
    ref = rq.forward(spec, ids)
    eng = Qwen4ExpTarget(spec, "cpu", torch.float32, 64, rows=4)
    eng.prefill(ids[:10])
    eng.verify(ids[10:14])
    eng.commit(3)                                                   # 13 positions kept, one row rejected
    kv, rec = rq.kv_rows(spec, ref, 13), rq.recurrent_state(spec, ref, 13, ids)
    assert sorted(kv) == eng.attn_layers and sorted(rec) == eng.lin_layers
    for l, (k, v) in kv.items():
        ek, ev = (x.transpose(0, 1).double().numpy() for x in eng.kv_rows(l))
        assert rel(ek, k) < 1e-5 and rel(ev, v) < 1e-5
    for l, (tail, state) in rec.items():
        et, es = (x.double().numpy() for x in eng.recurrent_state(l))
        assert rel(et, tail) < 1e-5 and rel(es, state) < 1e-5


@pytest.mark.parametrize("layer_index", [0, 2])
def test_device_ngram_tables_equal_the_reference_exactly(layer_index):
    from bloomery_gates.kernels.ops import ple as kple

    want = rple.ngram_tables(151936, 3, 8, 1000, layer_index, 1234)
    got = kple.ngram_tables(151936, 3, 8, 1000, layer_index, 1234)
    for g, w in zip(got, (want.multipliers, want.sizes, want.offsets), strict=True):
        assert g.tolist() == w.tolist()
