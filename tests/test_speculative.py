"""The loop's rules on their own: kept, emitted ids, metrics."""

from __future__ import annotations

import torch

from bloomery_cli.metrics import Tally
from bloomery_cli.speculative import generate, kept_rows
from bloomery_gates.kernels.drafts.dflash import DFlashDraft
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target


def test_kept_rule_design_example():
    # DRAFTERS.md: proposals [7, 9, 2], target argmax [7, 9, 1, 4] -> kept 3 (7, 9, then 1)
    assert kept_rows([7, 9, 2], [7, 9, 1, 4]) == 3
    assert kept_rows([], [5]) == 1
    assert kept_rows([1, 2], [1, 2, 3]) == 3
    assert kept_rows([4, 2], [1, 2, 3]) == 1


def test_tally_metrics():
    t = Tally()
    for p, k in [(3, 1), (3, 4), (3, 2), (2, 3)]:
        t.add(p, k)
    assert t.accept_mean == 10 / 4
    assert t.histogram() == [1, 1, 1, 1]
    assert t.pos_accept() == [3 / 4, 2 / 4, 1 / 3]
    assert t.pos_accept_cond() == [3 / 4, 2 / 3, 1.0]
    assert t.accepts == 6 and t.proposals == 11


def test_drafted_equals_plain_on_random_pair(tiny_target, tiny_dflash):
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]

    def engine():
        return Qwen3Target(tiny_target, "cpu", torch.float32, max_len=128, rows=tiny_dflash.block_size)

    plain = generate(engine(), None, prompt, 40)
    eng = engine()
    drafted = generate(eng, DFlashDraft(tiny_dflash, eng, 128), prompt, 40)
    assert drafted.ids == plain.ids
    assert drafted.tally.windows > 0 and drafted.tally.windows < 40


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(st.lists(st.integers(0, 3), max_size=8), st.lists(st.integers(0, 3), min_size=9, max_size=9))
def test_kept_is_one_plus_longest_matching_prefix(proposals, argmax):
    k = kept_rows(proposals, argmax)
    assert 1 <= k <= len(proposals) + 1
    assert proposals[: k - 1] == argmax[: k - 1]                      # every kept proposal matched
    if k <= len(proposals):
        assert proposals[k - 1] != argmax[k - 1]                      # and the first rejected one did not


@given(st.integers(1, 7), st.lists(st.integers(0, 7), min_size=1, max_size=40))
def test_tally_rates_are_consistent(width, accepted):
    """At a fixed width (the gates' policy) the unconditional per-position rate can only fall."""
    t = Tally()
    for a in accepted:
        t.add(width, min(a, width) + 1)
    assert sum(t.histogram()) == t.windows
    assert abs(t.accept_mean - 1 - t.accepts / t.windows) < 1e-12
    pa, pc = t.pos_accept(), t.pos_accept_cond()
    assert all(0.0 <= x <= 1.0 for x in pa + pc)
    assert all(a >= b for a, b in zip(pa, pa[1:], strict=False))     # unconditional rate never rises
    assert pa[0] == pc[0]
