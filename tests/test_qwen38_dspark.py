"""qwen38-dspark: the DSpark drafter (speculators layout) on the qwen38 hybrid fixture target. The gate passes on
the trained fixture (lossless, both branches), and each planted defect turns it red (FAIL-first): the embedding
feature (target layer id -1, speculators' aux index 0) read as Python's taps[-1] (the last layer), the feature
layers read one off (the speculators index used as a layer id), the Markov prev id one row late."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from bloomery_cli.gate import GateOptions, run_gate
from bloomery_cli.loading import load_dspark, load_target
from bloomery_gates.gates import GATES
from bloomery_gates.gates import qwen38_dspark as gate_mod
from bloomery_gates.kernels.drafts import dflash as kdflash
from bloomery_gates.kernels.drafts.dspark import DSparkDraft

needs_fixture = pytest.mark.skipif(
    not (gate_mod.GATE.draft / "config.json").is_file() or not (gate_mod.GATE.target / "config.json").is_file(),
    reason=f"fixture {gate_mod.GATE.draft} (or its target) absent: build it with "
           "`python -m bloomery_cli.families.qwen38.fixture_dspark --out fixtures`")


def test_registered():
    g = GATES["qwen38-dspark"]
    assert g is gate_mod.GATE and g.family == "qwen38" and g.draft_kind == "dspark"
    assert g.draft.name == "qwen38-tiny-dspark-b7-speculators" and set(g.options) == {"confidence_cut"} \
        and g.options["confidence_cut"].default == 0.0


@needs_fixture
def test_fixture_is_the_speculators_layout_with_the_embedding_feature():
    import json

    cfg = json.loads((gate_mod.GATE.draft / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["aux_hidden_state_layer_ids"] == [0, 2, 3]
    spec = load_dspark(gate_mod.GATE.draft, load_target(gate_mod.GATE.target))
    assert spec.target_layer_ids == (-1, 1, 2) and spec.markov_head_type == "vanilla" and spec.confidence


def _run(gate=gate_mod.GATE, n: int = 64):
    code, rep = run_gate(gate, GateOptions(n=n, max_prompts=2), emit=lambda _: None)
    lines = {line.split(":")[0]: line.endswith("PASS") for line in rep.lines if line.startswith(("(r)", "(w)"))}
    return code, rep, lines


def _failed(lines: dict[str, bool]) -> list[str]:
    return [k for k, ok in lines.items() if not ok]


@needs_fixture
def test_gate_passes_on_fixture():
    code, rep, lines = _run()
    assert code == 0, "\n".join(rep.lines)
    assert all(lines.values()), lines
    assert any(k.startswith("(r) dspark markov chain") for k in lines)
    assert any(k.startswith("(r) dspark confidence logits") for k in lines)
    assert "ids identical 64" in rep.lines and any(line.startswith("(b)") and line.endswith("PASS")
                                                   for line in rep.lines)


@needs_fixture
def test_fail_first_embedding_feature_read_as_the_last_layer(monkeypatch):
    real = kdflash.context_features

    def wraps(taps, layer_ids, *args):          # taps[l + 1] with l = -1 is right; taps[l] would wrap to taps[-1]
        return real(taps, [len(taps) - 2 if l == -1 else l for l in layer_ids], *args)

    monkeypatch.setattr(kdflash, "context_features", wraps)
    code, rep, lines = _run()
    assert code == 1 and any(k.startswith("(r) dspark logits+markov") for k in _failed(lines)), "\n".join(rep.lines)


@needs_fixture
def test_fail_first_feature_layers_one_off(monkeypatch):
    real = kdflash.context_features
    monkeypatch.setattr(kdflash, "context_features",
                        lambda taps, layer_ids, *args: real(taps, [l + 1 for l in layer_ids], *args))
    code, rep, lines = _run()
    assert code == 1 and any(k.startswith("(r) dspark logits+markov") for k in _failed(lines)), "\n".join(rep.lines)


class LaggedDraft(DSparkDraft):
    """Planted: the Markov prev id one row late (row k reads d_{k-2}; the anchor for rows 0 and 1)."""

    def decode(self, hn, anchor):
        base = F.linear(hn, self.head)
        chain, rows = [anchor], []
        for k in range(base.shape[0]):
            rows.append(base[k] + F.linear(F.embedding(chain[max(k - 1, 0)], self.w1), self.w2)[0])
            chain.append(rows[-1].argmax().view(1))
        return torch.stack(rows), torch.cat(chain[:-1])


@needs_fixture
def test_fail_first_markov_prev_one_row_late():
    planted = replace(gate_mod.GATE, make_draft=lambda s, e, m, confidence_cut=0.0: LaggedDraft(s, e, m))
    code, rep, lines = _run(planted)
    assert code == 1 and any(k.startswith("(r) dspark logits+markov") for k in _failed(lines)), "\n".join(rep.lines)


@needs_fixture
@pytest.mark.parametrize("name", ["qwen38-dspark", "qwen3-dspark"])
def test_emulation_stores_the_markov_logits_where_the_kernel_does(name):
    """Issue 30: the emulated run must round where the kernel stores. The kernel stores the Markov term W2 W1[prev]
    and then base + term in bf16; an emulation that kept both in float64 under-counted two roundings of every
    logit, so a correct kernel's rms rel sat at 1.8-2.0x the emulated one and the line at 0.9-1.02 of its band,
    passing or failing with the CPU's bf16 paths. On CPU the emulation reproduces torch's bf16 rounding almost bit
    for bit, so kernel / emulated rms must be near 1 (it was 1.81 on the line that failed)."""
    from bloomery_cli.bands import M_RMS

    code, rep = run_gate(GATES[name], GateOptions(dtype="bf16", n=16, max_prompts=1), emit=lambda _: None)
    assert code == 0, "\n".join(rep.lines)
    (b,) = [b for b in rep.facts["bands"] if b["what"].startswith("dspark logits+markov")]
    emulated = b["rms_band"] / M_RMS          # the emulated rms rel plus e_acc (~1e-6 here, float32 sums)
    assert 0.7 < b["rel_rms"] / emulated < 1.3, b
