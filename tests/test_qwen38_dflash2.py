"""qwen38-dflash2: the DFlash2 drafter on a qwen38 hybrid target (kernel, training forward and f64 reference on
a tiny random qwen38 with a feature on the last layer, so the zero-centred final norm matters), and the gate on
the bundled fixture: it passes, and a planted defect (selector reduced to per-slot argmax) turns it red."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_dflash2 import PROMPT, TIGHT, make_dflash2, np64
from test_qwen38 import make_qwen38

from bloomery_cli.bands import worst_rel
from bloomery_cli.gate import GateOptions, run_gate
from bloomery_gates.gates import GATES
from bloomery_gates.gates import qwen38_dflash2 as gate_mod
from bloomery_gates.kernels.drafts import dflash2 as kd2
from bloomery_gates.kernels.families.qwen38.model import Qwen38Target, forward_train
from bloomery_gates.kernels.ops import selector as ksel
from bloomery_gates.reference.drafts import dflash2 as rd2
from bloomery_gates.reference.families.qwen38 import model as rq38

LAST = (0, 2)          # three layers: feature 2 is the last layer's output, read through the final norm (1 + w)


def test_registered():
    g = GATES["qwen38-dflash2"]
    assert g is gate_mod.GATE and g.family == "qwen38" and g.draft_kind == "dflash2"
    assert g.draft.name == "qwen38-tiny-dflash2-b8" and g.target.name == "qwen38-tiny"
    assert any("4.80" in a and "Qwen3.8-27B" in a and "external" in a for a in g.anchors)
    assert any("5.97" in a and "Qwen3.5-4B" in a for a in g.anchors)


def test_kernel_on_qwen38_engine_matches_reference():
    target = make_qwen38()
    d = make_dflash2(target, layer_ids=LAST)
    eng = Qwen38Target(target, "cpu", torch.float32, 128, rows=d.block_size)
    draft = kd2.DFlash2Draft(d, eng, 128, impl="torch")
    pre = eng.prefill(PROMPT, logits=True)
    draft.prompt(pre.taps)
    got = draft.propose(pre.argmax[-1], detail=True)
    ref = rd2.forward(d, target, rq38.forward(target, PROMPT), pre.argmax[-1])
    assert worst_rel(np64(got.logits), ref.logits) < 1e-4
    assert got.ids == ref.ids.tolist()


def test_forward_train_uses_the_zero_centred_final_norm():
    target = make_qwen38()
    d = make_dflash2(target, layer_ids=LAST)
    ids = torch.tensor([PROMPT + [7, 11, 13, 17, 19]])
    anchors = torch.tensor([[2, 6, 9]])
    _, hidden = forward_train(target.tensors, target, ids)
    got = kd2.forward_train(d.tensors, d, target.tensors, target, hidden, ids, anchors).logits[0]
    taps = rq38.forward(target, ids[0].tolist())
    ref = [rd2.forward(d, target, taps, int(ids[0, s]), s=s).logits for s in (2, 6, 9)]
    assert max(worst_rel(np64(got[a]), ref[a]) for a in range(3)) < 10 * TIGHT
    wrong = kd2.forward_train(d.tensors, d, target.tensors, replace(target, family="qwen3"), hidden, ids,
                              anchors).logits[0]                     # the final norm's gain read as w, not 1 + w
    assert worst_rel(np64(wrong[0]), ref[0]) > 1e-3


# ------------------------------------------------------------------------------------------ the gate, on the fixture

needs_fixture = pytest.mark.skipif(
    not (gate_mod.GATE.draft / "config.json").is_file() or not (gate_mod.GATE.target / "config.json").is_file(),
    reason=f"fixture {gate_mod.GATE.draft} (or its target) absent: build it with "
           "`python -m bloomery_cli.families.qwen38.fixture_dflash2 --out fixtures`")


def _run(n: int = 64):
    code, rep = run_gate(gate_mod.GATE, GateOptions(n=n, max_prompts=2), emit=lambda _: None)
    lines = {line.split(":")[0]: line.endswith("PASS") for line in rep.lines if line.startswith(("(r)", "(w)"))}
    return code, rep, lines


@needs_fixture
def test_gate_passes_on_fixture():
    code, rep, lines = _run()
    assert code == 0, "\n".join(rep.lines)
    assert all(lines.values()), lines
    assert "(r) dflash2 walked path vs host walk of its own scores" in lines
    assert "ids identical 64" in rep.lines and any(line.startswith("(b)") for line in rep.lines)
    assert rep.facts["passed"] is True and rep.facts["acceptance"]["accept_mean"] > 1.0


@needs_fixture
def test_gate_red_when_selector_reduced_to_argmax(monkeypatch):
    real = ksel.select
    argmax = lambda l, g, an, a, bs, k, *impls: real(l, g, an, a, torch.zeros_like(bs), k, *impls)  # noqa: E731
    monkeypatch.setattr(kd2, "select", argmax)
    code, rep, lines = _run()
    assert code == 1, "\n".join(rep.lines)
    failed = [k for k, ok in lines.items() if not ok]
    assert any(k.startswith("(r) dflash2 selector scores") for k in failed), failed
    assert all(ok for k, ok in lines.items() if k.startswith("(w)"))      # still lossless: a worse draft only
    assert "ids identical 64" in rep.lines
