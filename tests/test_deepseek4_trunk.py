"""deepseek4 (DeepSeek V4) trunk, issue 26: the float64 reference (reference/families/deepseek4/model.py) pinned to
transformers' ``DeepseekV4ForCausalLM`` (bloomery_cli/families/deepseek4/oracle.py) on a tiny random checkpoint made
here (tests/deepseek4_factory.py: [sliding, CSA, HCA, CSA], CSA rate 2 with a top-2 indexer, HCA rate 4, window 4,
a hash layer first, 8 experts top-2, 4 mHC streams, the trained HC head, a YaRN compress rope), then the engine
(kernels/families/deepseek4/model.py) against the reference with ``check_target``'s lines.

Bands against HF (docs/FAMILIES_MOE.md 2.2), as tests/test_glm5next_trunk.py takes them:
  * HF with its float32 islands lifted (``Float32AsFloat64``): a true float64 forward, band 1e-12 relative to
    max |x| (measured 1.3e-15 on final and logits); the indexer's chosen entries equal exactly.
  * HF as shipped (``.to(float64)``; its norms, mHC mixes, HC head, rope tables, gate softmax and indexer scores
    in float32): float32-scale, 1e-5 relative, and no further from the reference than an all-float32 HF run.
At 12 tokens every path runs: the window (4 keys) drops keys, CSA has up to 6 entries of which the indexer keeps 2
(the choice is sparse), HCA has 3 entries, the hash layer routes by the table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import deepseek4_factory as fac
import numpy as np
import pytest
import torch

from bloomery_cli.contract import Report
from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_gates.gates.targets import check_target
from bloomery_gates.kernels.families.deepseek4 import model as kd
from bloomery_gates.kernels.ops import mhc as kmhc
from bloomery_gates.kernels.ops import router_v4 as krouter
from bloomery_gates.kernels.ops import v4_attention as kv4
from bloomery_gates.kernels.ops.moe import Routing, topk_stable
from bloomery_gates.reference.families.deepseek4 import model as ref
from bloomery_gates.reference.ops import v4_attention as rv4
from bloomery_gates.registry import FAMILIES

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
T = 12
PROMPT = 16
TORCH = {"bf16": torch.bfloat16, "f32": torch.float32}


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return fac.write(tmp_path_factory.mktemp("deepseek4") / "f32")


@pytest.fixture(scope="module")
def bf16_ckpt(tmp_path_factory) -> Path:
    """The same weights stored in bf16 (so the engine's float32 copies of norms, sinks, biases and mixes are the
    run dtype's own values, exact in the emulated reference too)."""
    return fac.write(tmp_path_factory.mktemp("deepseek4") / "bf16", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return [int(i) for i in np.random.default_rng(0).integers(0, fac.V, T)]


def reference_choice(spec, out, layer: int) -> np.ndarray:
    """The reference's CSA choice of ``layer`` as a chosen-entry mask [T, n]."""
    w = ref.as_f64(spec)
    from bloomery_gates.reference.ops import mhc as rmhc
    from bloomery_gates.reference.ops.norm import rms_norm
    p = f"model.layers.{layer}."
    x = out.hidden[layer]
    hw = rmhc.mhc_weights(x, w[p + "attn_hc.fn"], w[p + "attn_hc.base"], w[p + "attn_hc.scale"],
                          spec.hc.sinkhorn_iters, spec.hc.eps, spec.layer.rms_eps)
    a = rms_norm(rmhc.mhc_collapse(x, hw.pre), w[p + "input_layernorm.weight"], spec.layer.rms_eps)
    chosen = ref.attention(spec, w, layer, a)[1]
    return rv4.chosen_mask(chosen, len(x) // spec.attn.csa_rate)


def test_reference_taps_layers_and_paths(ckpt, ids):
    """Shapes; each layer on its own equals the whole run bit for bit; final_norm of the last streams is the head's
    input; a hash layer without ids is a named ValueError; every path really runs at 12 tokens (module
    docstring): the CSA choice is sparse and causal, the hash layer's experts are the table's."""
    spec = deepseek4_from_hf(ckpt)
    assert spec.layer_types == ("sliding", "csa", "hca", "csa") and spec.mlp_types == ("hash", "moe", "moe", "moe")
    out = ref.forward(spec, ids)
    assert out.hidden.shape == (fac.L + 1, T, fac.S, fac.H) and out.logits.shape == (T, fac.V)
    for layer in range(fac.L):
        assert (ref.reference_layer(spec, layer, out.hidden[layer], ids=ids) == out.hidden[layer + 1]).all()
    with pytest.raises(ValueError, match="layer 0 is a hash layer"):
        ref.reference_layer(spec, 0, out.hidden[0])
    assert (ref.final_norm(spec, out.hidden[-1]) == out.final).all()
    mask = reference_choice(spec, out, 1)
    n = T // fac.CSA
    vis = rv4.visible(np.arange(T), n, fac.CSA)
    assert (mask <= vis).all() and mask.sum(1).max() == fac.TOPK and vis.sum(1).max() > fac.TOPK
    w = ref.as_f64(spec)
    tab = w["model.layers.0.mlp.gate.tid2eid"].astype(np.int64)
    r = ref.route(spec, w, 0, np.ones((T, fac.H)), np.asarray(ids))
    assert (r.ids == tab[ids]).all()


def test_reference_runs_on_the_strict_device_bit_for_bit(ckpt, ids):
    """forward, reference_layer (the hash layer with its ids) and final_norm on the strict fake device (NumPy that
    refuses a host array, as CuPy does) give the host's bits: no host array is built mid-run."""
    from fake_xp import fake_device

    from bloomery_gates.reference import xp as rxp
    spec = deepseek4_from_hf(ckpt)
    host = ref.forward(spec, ids)
    with rxp.on(fake_device()):
        dev = ref.forward(spec, ids)
        got = [rxp.to_host(dev.hidden), rxp.to_host(dev.logits),
               rxp.to_host(ref.reference_layer(spec, 0, rxp.here(host.hidden[0]), ids=ids)),
               rxp.to_host(ref.final_norm(spec, rxp.here(host.hidden[-1])))]
    for a, b in zip(got, (host.hidden, host.logits, host.hidden[1], host.final), strict=True):
        assert np.array_equal(a, b)


@needs_hf
@pytest.mark.parametrize("t", [8, T])
def test_reference_equals_hf(ckpt, t):
    """The reference against transformers in both tiers (module docstring): final, logits, the streams entering
    every layer, and each CSA layer's chosen entries exactly; at 8 tokens (every path already runs: 4 CSA entries
    for a top-2 choice, 2 HCA entries, a window of 4) and at 12."""
    from bloomery_cli.families.deepseek4.oracle import build_hf_deepseek4, hf_deepseek4_taps
    spec = deepseek4_from_hf(ckpt)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, fac.V, t)]
    out = ref.forward(spec, ids)
    hf = hf_deepseek4_taps(spec, ids)
    worst = max(rel(out.final, hf.final), rel(out.logits, hf.logits))
    print(f"deepseek4 reference vs HF lifted f64: worst rel {worst:.3e}")
    assert worst < 1e-12
    assert (out.logits.argmax(-1) == hf.logits.argmax(-1)).all()
    assert len(hf.hidden) == fac.L + 1
    for layer in range(fac.L):
        assert rel(out.hidden[layer], hf.hidden[layer]) < 1e-12, layer
    assert sorted(hf.chosen) == [1, 3] and all(m.sum(1).max() == fac.TOPK for m in hf.chosen.values())
    assert rv4.visible(np.arange(t), t // fac.CSA, fac.CSA).sum(1).max() > fac.TOPK       # the choice is sparse
    for layer, mask in hf.chosen.items():
        assert np.array_equal(reference_choice(spec, out, layer), mask), layer
    islands = hf_deepseek4_taps(spec, ids, lift=False).logits
    model = build_hf_deepseek4(spec, lift=False).to(torch.float32)
    with torch.no_grad():
        fp32 = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double().numpy()
    got, f32 = rel(out.logits, islands), rel(out.logits, fp32)
    print(f"deepseek4 reference vs HF as shipped (fp32 islands): {got:.3e}; vs an fp32 HF run: {f32:.3e}")
    assert 1e-10 < got < 1e-5 and got <= f32, (got, f32)


@needs_hf
@pytest.mark.parametrize("defect", ["conjugate", "hyper_head"])
def test_fail_first_the_oracle_sees_a_reference_defect(ckpt, ids, monkeypatch, defect):
    """Planted in the reference: the output's conjugate rope dropped, or the HC head replaced by the mean; the
    lifted comparison fails (the check can fail)."""
    from bloomery_cli.families.deepseek4.oracle import hf_deepseek4_taps
    from bloomery_gates.reference.ops import mhc as rmhc
    spec = deepseek4_from_hf(ckpt)
    want = hf_deepseek4_taps(spec, ids).logits
    if defect == "conjugate":
        true = rv4.tail_rope
        monkeypatch.setattr(rv4, "tail_rope", lambda x, p, r, conjugate=False: x if conjugate else true(x, p, r))
    else:
        monkeypatch.setattr(rmhc, "hyper_head", lambda x, *a: rmhc.mhc_head(x))
    assert rel(ref.forward(spec, ids).logits, want) > 1e-6


# ---------------------------------------------------------------------------------------------- the engine


def target_report(spec, ids, dtype: str) -> Report:
    eng = kd.Deepseek4Target(spec, "cpu", TORCH[dtype], max_len=64, rows=4)
    p = eng.prefill(ids, logits=True)
    report = Report("t", emit=lambda line: None)
    check_target(report, FAMILIES["deepseek4"], spec, p, ref.forward(spec, ids), dtype, ids)
    return report


def prompt() -> list[int]:
    return [int(i) for i in np.random.default_rng(1).integers(0, fac.V, PROMPT)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_engine_target_lines_pass(bf16_ckpt, dtype):
    """Every (r) line of check_target passes: each layer from the kernel's input, the head, the logits end to end
    and the greedy ids, in the emulated bands of the reference."""
    spec = deepseek4_from_hf(bf16_ckpt)
    report = target_report(spec, prompt(), dtype)
    assert report.failed == 0, report.lines
    assert sum(1 for line in report.lines if line.startswith("(r) target layer")) == fac.L, report.lines


def test_engine_choice_and_verify_commit(bf16_ckpt):
    """f32: the engine's CSA choice equals the reference's (integers, exact); prefill 12, verify 4, commit 2, then
    a verify of the next 4 rows gives the reference's logits of those positions within f32 chain rounding (the
    rows past the commit point were overwritten, never read)."""
    spec = deepseek4_from_hf(bf16_ckpt)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, fac.V, 20)]
    eng = kd.Deepseek4Target(spec, "cpu", torch.float32, max_len=64, rows=4)
    eng.prefill(ids[:12])
    out = ref.forward(spec, ids[:12])
    for layer in (1, 3):
        got = kv4.chosen_mask(eng.chosen[layer], 12 // fac.CSA).numpy()
        assert np.array_equal(got, reference_choice(spec, out, layer)), layer
    eng.verify(ids[12:16])
    eng.commit(2)
    got = eng.verify(ids[14:18], logits=True)
    want = ref.forward(spec, ids[:18]).logits[14:18]
    assert rel(got.logits.double().numpy(), want) < 1e-5
    assert eng.kv_rows(0)[1].shape == (14, 0) and eng.kv_rows(2)[1].shape == (14, 2 * fac.D)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_engine_plain_and_drafted_passes_agree_bit_for_bit(bf16_ckpt, dtype):
    """24 positions after a 12-row prompt, run as 24 one-row verifies (each padded to 4 rows, committed 1) and as
    6 four-row verifies committed whole: the logits of every position are the same bits (what a gate's
    ``ids identical`` will rest on; the keys are the static buffers with masks; measured on CPU)."""
    spec = deepseek4_from_hf(bf16_ckpt)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, fac.V, 40)]
    plain, drafted = (kd.Deepseek4Target(spec, "cpu", TORCH[dtype], max_len=64, rows=4) for _ in range(2))
    plain.prefill(ids[:12])
    drafted.prefill(ids[:12])
    one, four = [], []
    for p in range(12, 36):
        one.append(plain.verify(ids[p:p + 1], logits=True).logits[0])
        plain.commit(1)
    for p in range(12, 36, 4):
        four += list(drafted.verify(ids[p:p + 4], logits=True).logits)
        drafted.commit(4)
    assert torch.equal(torch.stack(one), torch.stack(four))
    for layer in range(fac.L):
        assert all(torch.equal(x, y) for x, y in zip(plain.kv_rows(layer), drafted.kv_rows(layer), strict=True))


def _bias_on_weights(logits, bias, k, scale=1.0):
    """The defect: the learned router's weights taken from the biased scores s + b (the choice is right)."""
    s = krouter.sqrt_softplus(logits)
    c = s + bias.float()
    ids = topk_stable(c, k)
    return Routing(ids, krouter.renormalised(c, ids, scale), c)


PLANTS = {
    # K = V carries the rope, and the output's rope slice is no longer turned back at the query's position
    "conjugate rope on the output dropped": ("(r) target layer", lambda mp: mp.setattr(
        kv4, "tail_rope", lambda x, p, r, conjugate=False, true=kv4.tail_rope: x if conjugate else true(x, p, r))),
    # the head's collapse takes the unweighted mean of the streams instead of the trained HC head
    "HC head replaced by the mean": ("(r) target logits", lambda mp: mp.setattr(
        kmhc, "hyper_head", lambda x, *a: kmhc.mhc_head(x))),
    # the hash table read one row off: token t routed by t - 1's experts
    "hash table shifted": ("(r) target layer 0", lambda mp: mp.setattr(
        krouter, "hash_ids", lambda tab, tok: tab.roll(1, 0)[tok.long()].long())),
    # the correction bias, meant for the choice only, also weights the chosen experts
    "router bias applied to the weights": ("(r) target layer", lambda mp: mp.setattr(
        krouter, "sqrtsoftplus_topk", _bias_on_weights)),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_fail_first_bf16(bf16_ckpt, monkeypatch, plant):
    """Planted in the engine, run in bf16: the line it breaks says FAIL and the report exits 1."""
    spec = deepseek4_from_hf(bf16_ckpt)
    head, plant_it = PLANTS[plant]
    plant_it(monkeypatch)
    report = target_report(spec, prompt(), "bf16")
    assert report.finish() == 1
    failed = [line for line in report.lines if line.endswith("FAIL")]
    assert any(line.startswith(head) for line in failed), report.lines
