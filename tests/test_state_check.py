"""(r) state after the loop (bloomery_cli.state_check): the lines on every gate, and FAIL-first.

Each FAIL-first test plants a defect that shows only after a verify and a commit, runs the real gate on the
trained fixtures (64 ids, 2 prompts), and asserts exit 1, that the state line it targets FAILs, and that every
prefill-time (r) line still PASSes. Where the plain and the drafted run share the defect, every (w) line passes
too: the state lines are then the only ones that see it.
"""

from __future__ import annotations

import pytest
import torch

from bloomery_cli.contract import Report
from bloomery_cli.gate import GateOptions, run_gate
from bloomery_cli.metrics import Tally
from bloomery_cli.state_check import rollbacks_seen, stop_rule
from bloomery_gates.gates import GATES, qwen3_dspark
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import dspark as kdspark
from bloomery_gates.kernels.drafts.dflash import DFlashDraft
from bloomery_gates.kernels.drafts.mtp import MTPDraft
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target
from bloomery_gates.kernels.families.qwen38.model import Qwen38Target

needs_fixtures = pytest.mark.skipif(not (FIXTURES / "qwen38-tiny").is_dir(), reason="fixtures/ not built")
STATE = "(r) state after "


def gate(name: str, dtype: str = "f32", g=None) -> tuple[int, list[str]]:
    lines: list[str] = []
    code, _ = run_gate(g or GATES[name], GateOptions(n=64, max_prompts=2, dtype=dtype), emit=lines.append)
    return code, lines


def prefill_lines(lines: list[str]) -> list[str]:
    """The (r) lines printed before the drafted runs: the prompt and the first block."""
    first_w = next(i for i, line in enumerate(lines) if line.startswith("(w) "))
    return [line for line in lines[:first_w] if line.startswith("(r) ")]


def state_failed(lines: list[str], what: str) -> bool:
    return any(line.startswith(STATE) and what in line and line.endswith(" FAIL") for line in lines)


def assert_caught(code: int, lines: list[str], what: str, shared: bool) -> None:
    log = "\n".join(lines)
    assert code == 1, log
    assert state_failed(lines, what), log
    assert prefill_lines(lines) and all(line.endswith(" PASS") for line in prefill_lines(lines)), log
    if shared:      # plain and drafted runs share the defect: no (w) line can see it
        assert all(line.endswith(" PASS") for line in lines if line.startswith("(w) ")), log


# ------------------------------------------------------------------------------------------------- the pieces


def test_report_state_spelling():
    lines: list[str] = []
    r = Report("x", emit=lines.append)
    assert r.state(5, "target layer 0 k_cache", (72, 2, 32), 4608, 1e-6, 1e-4)
    assert not r.state(5, "mtp store v", (3,), 3, 2.0, 1e-4)
    assert lines[0] == ("(r) state after 5 windows: target layer 0 k_cache [72x2x32] vs host f64: 4608 checked, "
                        "worst rel 1.000e-06 (band 1.000e-04) PASS")
    assert lines[1].endswith(" FAIL") and r.failed == 1


def test_stop_rule_needs_both_rollbacks():
    t = Tally()
    for p, k in [(7, 8), (7, 8), (7, 8), (7, 1)]:
        t.add(p, k)
    assert not rollbacks_seen(t) and not stop_rule(4)(t)          # a full reject, no partial accept
    t.add(7, 3)
    assert rollbacks_seen(t) and stop_rule(4)(t) and not stop_rule(6)(t)


@needs_fixtures
@pytest.mark.parametrize("name", list(GATES))
def test_every_gate_prints_passing_state_lines(name):
    code, lines = gate(name)
    state = [line for line in lines if line.startswith(STATE)]
    assert code == 0 and state and all(line.endswith(" PASS") for line in state), "\n".join(lines)
    kinds = {"next verify logits", "k_cache", "v_cache"} | ({"deltanet state", "conv tail"} if "qwen38" in name
                                                            else set())
    store = {"mtp": "mtp store k", "eagle3": "eagle3 row 1 logits"}       # EAGLE-3 checks its store through its chain
    kinds |= {store.get(name.split("-")[1], "context layer 0 k")}
    if name == "glm5next-mtp":      # MLA keeps a latent, not K/V; KDA a state and conv tail; the NextN its own latent
        kinds = {"next verify logits", "latent cache", "indexer inputs", "kda state", "conv tail", "nextn store latent"}
    assert all(any(k in line for line in state) for k in kinds), "\n".join(state)


# ------------------------------------------------------------------------------------------------- FAIL-first


def rope_one_early(monkeypatch, cls) -> None:
    """The verify (not the prefill) rotates position p by the angle of p-1: plain and drafted runs alike."""
    real = cls.verify

    def verify(self, ids, logits=False):
        cos, sin = self.cos, self.sin
        self.cos, self.sin = torch.roll(cos, 1, 0), torch.roll(sin, 1, 0)
        try:
            return real(self, ids, logits)
        finally:
            self.cos, self.sin = cos, sin

    monkeypatch.setattr(cls, "verify", verify)


@needs_fixtures
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kv_rope_one_early_in_verify(monkeypatch, dtype):
    rope_one_early(monkeypatch, Qwen3Target)
    code, lines = gate("qwen3-dflash", dtype)
    assert_caught(code, lines, "target layer 0 k_cache", shared=True)


@needs_fixtures
def test_hybrid_kv_rope_one_early_in_verify(monkeypatch):
    rope_one_early(monkeypatch, Qwen38Target)
    code, lines = gate("qwen38-dflash")
    assert_caught(code, lines, "target layer 3 k_cache", shared=True)


@needs_fixtures
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_dflash_context_not_written_after_accept(monkeypatch, dtype):
    def accept(self, kept, taps):
        self.ctx_len += kept                      # the defect: the kept rows' context K/V never reach the store

    monkeypatch.setattr(DFlashDraft, "accept", accept)
    code, lines = gate("qwen3-dflash", dtype)
    assert_caught(code, lines, "dflash context layer 0 k", shared=True)


@needs_fixtures
# bf16: the zeroed tail perturbs the first verify only; 8 windows later the DeltaNet state has decayed that below
# bf16 rounding (its line passes), but the K/V rows the first verify wrote into the attention layer stay wrong.
@pytest.mark.parametrize(("dtype", "caught_by"), [("f32", "deltanet state"), ("bf16", "k_cache")])
def test_prefill_leaves_conv_tail_at_zero(monkeypatch, dtype, caught_by):
    real = Qwen38Target.prefill

    def prefill(self, ids, logits=False):
        out = real(self, ids, logits)
        self.conv_tail.zero_()                    # the defect: the first verify starts from a zero tail
        return out

    monkeypatch.setattr(Qwen38Target, "prefill", prefill)
    code, lines = gate("qwen38-mtp", dtype)
    assert_caught(code, lines, caught_by, shared=True)


@needs_fixtures
def test_recurrent_state_not_rolled_back(monkeypatch):
    """commit keeps the state after the LAST verify row (the (w) lines see it too: the runs differ)."""
    monkeypatch.setattr(Qwen38Target, "_rollback_row", lambda self, kept, first, n: n - 1)
    code, lines = gate("qwen38-mtp")
    assert_caught(code, lines, "deltanet state", shared=False)


@needs_fixtures
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mtp_kept_positions_not_rewritten(monkeypatch, dtype):
    real = MTPDraft.accept

    def accept(self, kept, taps):
        real(self, kept, taps)
        # the defect: the kept drafts whose slots a chained row already wrote keep that entry (made from the
        # draft's own g) instead of being rewritten from the target's hidden rows
        m = min(kept - 1, self.width - 1)
        if m:
            self.pend_e, self.pend_h = self.pend_e[m:], self.pend_h[m:]
            self.next_slot += m

    monkeypatch.setattr(MTPDraft, "accept", accept)
    code, lines = gate("qwen38-mtp", dtype)
    assert_caught(code, lines, "mtp store k", shared=True)


@needs_fixtures
def test_dspark_cut_one_draft_too_late(monkeypatch):
    """With t = 0.2 the next block's host rule keeps 1 of 7; the defect keeps one more. (On this fixture the first
    block cuts too, so the prefill-time cut line also fails; the assertion is on the state line.)"""
    real = kdspark.keep_count

    def late(confidence, threshold, b, device):
        return (real(confidence, threshold, b, device) + 1).clamp(max=b)

    monkeypatch.setattr(kdspark, "keep_count", late)
    code, lines = gate("qwen3-dspark", g=qwen3_dspark.with_options(confidence_cut=0.2))
    assert code == 1 and state_failed(lines, "dspark confidence cut t=0.2 at the next block"), "\n".join(lines)


def test_compare_shape_or_name_mismatch_fails():
    """A state whose shape differs from the reference's (a commit that kept a row too many) or that the reference
    does not declare is a FAIL line, never a traceback."""
    import numpy as np

    from bloomery_cli.bands import Op
    from bloomery_cli.state_check import StateDecl, StateRun, compare
    from bloomery_gates.spec import LayerShape

    shape = LayerShape(8, 2, 1, 4, 16, 1e-6, 1e4)
    spec = type("S", (), {"layer": shape, "num_layers": 1, "hidden_size": 8})()
    decl = StateDecl(read=lambda e, r: {}, reference=lambda r: {"kv": np.ones((5, 4))},
                     ops=lambda r: {"kv": [Op("proj", 8)], "extra": [Op("proj", 8)]})
    proposal = type("P", (), {"ids": [3]})()
    run = StateRun(spec, None, "f32", [1, 2], [5, 6], proposal, 2, forward=lambda s, ids: None)
    lines: list[str] = []
    report = Report("x", emit=lines.append)
    compare(report, run, decl, {"kv": np.ones((6, 4)), "extra": np.ones(3)})
    assert report.failed == 2 and all(line.endswith(" FAIL") for line in lines), lines
    assert "shape [6, 4], the reference's fresh run [5, 4]" in lines[0]
    compare(report, run, decl, {"kv": np.ones((5, 4))})
    assert lines[-1].startswith("(r) state after 2 windows: kv [5x4] vs host f64: 20 checked, worst rel 0.000e+00")
    compare(report, run, decl, {})
    assert report.failed == 3 and lines[-1] == ("(r) state after 2 windows: kv: the reference's fresh run has it, "
                                                "the engine's read does not FAIL")
