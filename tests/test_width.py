"""The cost width policy: its model (E(k), costs), its choices at the extremes of acceptance, and, at gate
level, that it never changes an id."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from bloomery_cli.speculative import generate
from bloomery_cli.width import CostWidth, width_policy


def simulate(a: float, max_width: int = 16, windows: int = 400, draft_cost: float = 0.2, seed: int = 0) -> CostWidth:
    """Drive the policy with a synthetic pass cost (1 + 0.01 k, the draft extra when k > 1) and a draft whose
    every proposal is kept with probability a."""
    rng = random.Random(seed)
    pol = CostWidth(max_width)
    for _ in range(windows):
        k = pol.choose()
        kept = 1
        while kept < k and rng.random() < a:
            kept += 1
        noise = 1 + 0.02 * rng.random()
        pol.observe(k, kept, (1.0 + 0.01 * k + (draft_cost if k > 1 else 0.0)) * noise)
    return pol


def mode(xs: list[int]) -> int:
    return max(set(xs), key=xs.count)


def test_near_zero_acceptance_picks_plain():
    pol = simulate(0.02)
    assert mode(pol.chosen[50:]) == 1
    assert pol.best() == 1


def test_near_one_acceptance_picks_widest():
    pol = simulate(0.98)
    assert mode(pol.chosen[50:]) == 16
    assert pol.best() == 16


def test_middle_acceptance_drafts_narrower_than_max():
    pol = simulate(0.6, draft_cost=0.05)
    assert 2 <= pol.best() < 16          # E(k) saturates near 1/(1-a) = 2.5 while the cost keeps growing


def test_expected_kept_formula():
    pol = CostWidth(4)
    pol.hits, pol.tries = [0.5, 0.5, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]
    assert pol.expected(1) == 1.0
    assert pol.expected(3) == pytest.approx(1 + 0.5 + 0.25)
    assert pol.expected(4) == pytest.approx(1 + 0.5 + 0.25 + 0.25)


def test_cost_is_median_of_recent_and_borrows_nearest():
    pol = CostWidth(8)
    for s in (5.0, 1.0, 2.0):
        pol.observe(1, 1, s)
    assert pol.cost(1) == 2.0
    for s in range(20):
        pol.observe(8, 1, 10.0 + s)
    assert pol.cost(8) == pytest.approx(statistics.median([10.0 + s for s in range(12, 20)]))
    assert pol.cost(5) == pol.cost(8)            # a drafted width borrows from a drafted one


def test_width_policy_names():
    assert width_policy("fixed", 8) is None
    assert isinstance(width_policy("cost", 8), CostWidth)
    with pytest.raises(ValueError, match="expected one of fixed, cost"):
        width_policy("widest", 8)


def test_cost_policy_keeps_ids_on_the_fixture_pair():
    """Gate level: the trained fixture pair, the gate's padded engine, the cost policy choosing widths per
    window: drafted ids equal the plain run's."""
    from bloomery_cli.gate import read_prompts
    from bloomery_cli.loading import load_dflash, load_target, load_tokenizer
    from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS
    from bloomery_gates.kernels.drafts.dflash import DFlashDraft
    from bloomery_gates.kernels.families.qwen3.model import Qwen3Target

    target = load_target(FIXTURES / "qwen3-tiny")
    dspec = load_dflash(FIXTURES / "qwen3-tiny-dflash-b8", target)
    prompts = read_prompts(PROMPTS, lambda: load_tokenizer(FIXTURES / "qwen3-tiny"), 2)
    n, b = 64, dspec.block_size
    for p in prompts:
        engine = Qwen3Target(target, "cpu", torch.float32, len(p) + n + b + 1, rows=b)
        plain = generate(engine, None, p, n)
        pol = CostWidth(b, probe_every=4)
        drafted = generate(engine, DFlashDraft(dspec, engine, len(p) + n + b + 1), p, n, width=pol)
        assert drafted.ids == plain.ids
        assert len(set(pol.chosen)) > 2                       # it really varied the width
        assert drafted.tally.windows == sum(1 for k in pol.chosen if k > 1)

