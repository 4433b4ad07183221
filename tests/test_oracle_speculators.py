"""Tier 3 for block drafts: speculators' DFlash / DFlash2 / DSpark definitions (bloomery_cli.oracle.speculators)
against our f64 reference and the kernels, on the trained fixtures; FAIL-first: planted defects turn the gate red."""

from __future__ import annotations

import builtins
import dataclasses

import numpy as np
import pytest
from gate_run import run_named

from bloomery_cli.bands import logits_band, worst_rel
from bloomery_cli.loading import load_target
from bloomery_cli.oracle import speculators as osp
from bloomery_gates.errors import InputError
from bloomery_gates.gates import GATES
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.reference.drafts import dflash as ref_dflash
from bloomery_gates.reference.drafts import dflash2 as ref_dflash2
from bloomery_gates.reference.drafts import dspark as ref_dspark
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")
ORACLE_LINES = {"qwen3-dflash": 4, "qwen38-dflash": 4, "qwen3-dflash2": 8, "qwen38-dflash2": 8, "qwen3-dspark": 6}


@pytest.fixture(scope="module")
def speculators():
    reason = osp.missing()
    if reason:
        pytest.skip(f"{reason}: pip install --no-deps speculators==0.9.0 and its non-torch deps (see the README)")


def gate(name: str, **kw) -> tuple[int, list[str]]:
    return run_named(name, 16, 1, oracle=True, **kw)


def verdict(lines: list[str], head: str) -> str:
    """PASS / FAIL of the one line that starts with ``head``."""
    found = [line for line in lines if line.startswith(head)]
    assert len(found) == 1, (head, lines)
    return found[0].rsplit(" ", 1)[-1]


def specs(name: str):
    g = GATES[name]
    target = load_target(g.target)
    return target, g.load_draft(g.draft, target)


def reference_taps(target, n: int = 24):
    return ref_qwen3.forward(target, list(range(40, 40 + n)))


# --------------------------------------------------------------------------------------- agreement on fixtures

@pytest.mark.parametrize("name", sorted(ORACLE_LINES))
def test_gate_oracle_lines_pass(speculators, name):
    code, lines = gate(name)
    ours = [line for line in lines if line.startswith("(o) ") and " vs speculators f64: " in line]
    assert code == 0 and len(ours) == ORACLE_LINES[name], "\n".join(lines)
    assert all(line.endswith(" PASS") for line in ours)


@pytest.mark.parametrize("name", ["qwen3-dflash", "qwen3-dflash2", "qwen3-dspark"])
def test_oracle_is_truly_float64_and_stock_is_not(speculators, name):
    """Lifted, speculators equals our reference to ~1e-15; stock (RMSNorm / RoPE / softmax in float32) it is
    within the f32 band but measurably not exact: the islands are real."""
    target, draft = specs(name)
    taps = reference_taps(target)
    hf, s, anchor = ref_qwen3.hf_hidden_states(taps), taps.hidden.shape[1], int(taps.logits[-1].argmax())
    ref = {"qwen3-dflash": ref_dflash, "qwen3-dflash2": ref_dflash2, "qwen3-dspark": ref_dspark}[name].forward(
        draft, target, taps, anchor)
    f32 = logits_band("f32", draft.layer, draft.num_layers + 1, s + draft.block_size).value
    for promote, lo, hi in [(True, 0.0, 1e-13), (False, 1e-12, f32)]:
        oracle = osp.Oracle(draft, target, promote_f32=promote)
        out = oracle.dspark(hf, s, anchor, prev=ref.prev) if name == "qwen3-dspark" else oracle.dflash(hf, s, anchor)
        rel = worst_rel(ref.logits, out.logits)
        assert lo <= rel < hi, (promote, rel)


# ------------------------------------------------------------------------------------------------- FAIL-first

def fed(monkeypatch, key: str, change) -> None:
    """Plant: the oracle is fed ``change(tensor)`` for ``key`` while our reference and the kernel keep the file's."""
    real = osp.state_dict

    def planted(draft, target):
        sd = real(draft, target)
        sd[key] = change(sd[key])
        return sd

    monkeypatch.setattr(osp, "state_dict", planted)


def test_layer_ids_without_the_shift_fail(speculators, monkeypatch):
    """The oracle fed hidden_states[l] instead of [l + 1] (the z-lab vs speculators layer-id convention)."""
    monkeypatch.setattr(osp, "aux_layer_ids", lambda d: list(d.target_layer_ids))
    code, lines = gate("qwen3-dflash")
    assert code == 1, "\n".join(lines)
    for side in ("host f64", "kernel"):
        assert verdict(lines, f"(o) {side} dflash logits") == "FAIL"
        assert verdict(lines, f"(o) {side} dflash draft ids") == "FAIL"


@pytest.mark.parametrize("scale, path_fails", [(1 + 1e-6, False), (3.0, True)])
def test_perturbed_selector_codebook_fails(speculators, monkeypatch, scale, path_fails):
    """Predecessor codebook x (1 + 1e-6): only the f64 host line can see it; x 3: the kernel line and the walked
    path too. The backbone was fed the same weights, so the logits lines pass."""
    fed(monkeypatch, "candidate_selector.predecessor_codebook", lambda t: t * scale)
    code, lines = gate("qwen3-dflash2")
    assert code == 1, "\n".join(lines)
    assert verdict(lines, "(o) host f64 dflash2 selector scores") == "FAIL"
    assert verdict(lines, "(o) kernel dflash2 selector scores") == ("FAIL" if path_fails else "PASS")
    for side in ("host f64", "kernel"):
        assert verdict(lines, f"(o) {side} dflash2 walked path ids") == ("FAIL" if path_fails else "PASS")
        assert verdict(lines, f"(o) {side} dflash2 logits") == "PASS"


@pytest.mark.parametrize("scale, ids_fail", [(1 + 1e-6, False), (4.0, True)])
def test_perturbed_markov_head_fails(speculators, monkeypatch, scale, ids_fail):
    fed(monkeypatch, "markov_head.markov_w2.weight", lambda t: t * scale)
    code, lines = gate("qwen3-dspark")
    assert code == 1, "\n".join(lines)
    assert verdict(lines, "(o) host f64 dspark logits+markov") == "FAIL"
    assert verdict(lines, "(o) host f64 dspark greedy chain ids") == ("FAIL" if ids_fail else "PASS")
    assert verdict(lines, "(o) kernel dspark draft ids") == ("FAIL" if ids_fail else "PASS")
    assert verdict(lines, "(o) host f64 dspark confidence logits") == "PASS"      # W2 is not in the confidence


def test_perturbed_confidence_bias_fails(speculators, monkeypatch):
    fed(monkeypatch, "confidence_head.proj.bias", lambda t: t + 0.05)
    code, lines = gate("qwen3-dspark")
    assert code == 1, "\n".join(lines)
    for side in ("host f64", "kernel"):
        assert verdict(lines, f"(o) {side} dspark confidence logits") == "FAIL"
        assert verdict(lines, f"(o) {side} dspark logits+markov") == "PASS"


def test_a_reference_defect_is_seen_by_the_oracle(speculators, monkeypatch):
    """Our f64 reference's DFlash2 applies the input-side conv kernel on the output side too: the (o) host line
    fails while the kernel still agrees with speculators (the reference is the odd one out)."""
    real = ref_dflash2.dynamic_conv
    monkeypatch.setattr(ref_dflash2, "dynamic_conv", lambda y, delta, base, side: real(y, delta, base, 0))
    code, lines = gate("qwen3-dflash2")
    assert code == 1, "\n".join(lines)
    for what in ("logits", "top-8 candidate sets", "walked path ids"):
        assert verdict(lines, f"(o) host f64 dflash2 {what}") == "FAIL"
        assert verdict(lines, f"(o) kernel dflash2 {what}") == "PASS"


def test_dspark_anchor_first_convention_is_speculators_own(speculators, monkeypatch):
    """speculators' DSpark, told the DFlash convention (sample_from_anchor False: row k's Markov input is the
    token at s+k-1), disagrees with our anchor-first reference: the convention is checked, not assumed."""
    real = osp.speculator_config

    def dflash_convention(draft, target):
        cls, cfg = real(draft, target)
        cfg.sample_from_anchor = False
        return cls, cfg

    monkeypatch.setattr(osp, "speculator_config", dflash_convention)
    code, lines = gate("qwen3-dspark")
    assert code == 1, "\n".join(lines)
    assert verdict(lines, "(o) host f64 dspark logits+markov") == "FAIL"


# ------------------------------------------------------------------------------------------ without an oracle

def test_without_speculators_a_note_not_a_failure(monkeypatch):
    monkeypatch.setattr(osp, "missing", lambda: "speculators is not importable (ModuleNotFoundError: planted)")
    code, lines = gate("qwen3-dflash")
    assert code == 0, "\n".join(lines)
    assert "(o) dflash draft vs speculators: not checked, speculators is not importable " \
           "(ModuleNotFoundError: planted)" in lines
    assert not [line for line in lines if " vs speculators f64: " in line]


def test_missing_names_the_import_error(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "speculators":
            raise ImportError("no speculators")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert osp.missing() == "speculators is not importable (ImportError: no speculators)"


def test_state_dict_mismatch_is_an_input_error(speculators):
    target, draft = specs("qwen3-dflash")
    extra = dataclasses.replace(draft, tensors={**draft.tensors, "bogus.weight": draft.tensors["norm.weight"]})
    with pytest.raises(InputError, match=r"unexpected \['bogus.weight'\]"):
        osp.Oracle(extra, target)
    fewer = dataclasses.replace(draft, tensors={k: v for k, v in draft.tensors.items() if k != "fc.weight"})
    with pytest.raises(InputError, match=r"missing \['fc.weight'\]"):
        osp.Oracle(fewer, target)


def test_a_feature_speculators_lacks_is_not_modelled(speculators):
    target, draft = specs("qwen3-dflash2")
    with pytest.raises(osp.NotModelled, match="output_multiplier=2.0"):
        osp.Oracle(dataclasses.replace(draft, output_multiplier=2.0), target)
    assert np.array_equal(osp.aux_layer_ids(draft), [l + 1 for l in draft.target_layer_ids])
