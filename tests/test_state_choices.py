"""The state check's fresh runs with the kernel's choices (``gates.routing_flips.state_choices``,
``bloomery_cli.state_check.ChoiceLog``): the log keeps what the cache holds (the last pass to run a position wins),
a layered pin keys a whole forward's choices by layer, and a kernel that routes its verify passes to other experts
fails the state line of that layer's routing (the prefill's lines cannot see it)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomery_cli.state_check import ChoiceLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
needs_fixture = pytest.mark.skipif(not (FIXTURES / "ds41-tiny-dspark-b7.gguf").is_file(),
                                   reason="fixtures/ds41-tiny-dspark-b7.gguf not built")


class FakeEngine:
    """Passes that report layer 0's routing as ids [R, 1] = the position + 100 * the pass number."""

    def __init__(self):
        self.length, self.passes = 0, 0

    def _pass(self, p0: int, r: int):
        self.passes += 1
        ids = torch.tensor([[p0 + i + 100 * self.passes] for i in range(r + 2)])      # 2 padding rows
        return types.SimpleNamespace(routing={0: types.SimpleNamespace(ids=ids)}, choices={"c": ids})

    def prefill(self, ids, logits=False):
        out = self._pass(0, len(ids))
        self.length = len(ids)
        return out

    def verify(self, ids, logits=False):
        return self._pass(self.length, len(ids))

    def commit(self, kept):
        self.length += kept


def test_choice_log_keeps_the_last_pass_per_position():
    log = ChoiceLog(FakeEngine())
    log.prefill([1, 2, 3])                     # positions 0..2, pass 1
    log.verify([4, 5, 6])                      # positions 3..5, pass 2
    log.commit(1)                              # position 3 kept; 4, 5 are run again
    log.verify([5, 6])                         # positions 4..5, pass 3
    routing, choices = log.ids(6)
    want = np.array([[100], [101], [102], [203], [304], [305]])
    assert np.array_equal(routing[0], want) and np.array_equal(choices["c"], want)
    assert log.ids(7)[0][0] is None            # position 6 never ran: no ids, not a guess
    assert log.length == 4                     # everything else is the engine's


def test_layered_pin_keys_each_layer_and_pins_it():
    from bloomery_gates.reference.ops.moe import ROUTER, at_layer, chosen, pinned

    scores = np.array([[0.0, 1.0, 2.0]])

    def forward():
        out = []
        for l in range(2):
            with at_layer(l):
                out.append(chosen(scores, np.array([[2]])))
        return out

    with pinned({(ROUTER, 1): np.array([[0]])}, layered=True) as pin:
        out = forward()
    assert [o.tolist() for o in out] == [[[2]], [[0]]]
    assert set(pin.seen) == {(ROUTER, 0), (ROUTER, 1)}
    with pinned({}) as pin, pytest.raises(ValueError, match="twice"):   # unlayered: one choice per block
        forward()


@needs_fixture
def test_fail_first_verify_routed_elsewhere_fails_the_state_line_in_bf16(tmp_path, monkeypatch):
    """Layer 2's router sends every row of a verify pass (R <= 8; the prompt's prefill is longer) to the next
    expert over: the prefill's lines pass, the state line of layer 2's routing fails."""
    from test_deepseek41_dspark import gate_lines

    from bloomery_gates.kernels.families.deepseek4 import model as kdm

    real = kdm.route

    def planted(spec, t, l, b, ids):
        r = real(spec, t, l, b, ids)
        if l == 2 and b.shape[0] <= 8:
            return type(r)((r.ids + 1) % spec.moe.num_experts, r.weights, r.choice)
        return r

    monkeypatch.setattr(kdm, "route", planted)
    code, lines = gate_lines(tmp_path, dtype="bf16")
    state = [x for x in lines if x.startswith("(r) state after") and "routing of layer 2" in x]
    assert code == 1 and state and state[0].endswith("FAIL"), "\n".join(lines)
    assert all(x.endswith("PASS") for x in lines if x.startswith("(r) target routing")), "\n".join(lines)
