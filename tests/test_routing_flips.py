"""Choice flips on the layer lines (gates/routing_flips.py, CONTRACT.md "Routing flips on the layer lines"): the
margin rule on planted scores, the pin in the f64 reference, and on the trained ds41-tiny fixture in bf16: every gate
prompt passes (p3, p6, p7 failed before on a router or stream top-k flip at a near-tie) with the flips counted, the
emulation continues with the kernel's choices (its band no longer absorbs a flip of its own), and FAIL-first: the
router bias applied to the weights, a row routed to its (k+1)-th expert where the margin is widest, a stream row
given its least-scored visible entry."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomery_cli.bands import Band, emulated_band, routing_flip_excused
from bloomery_gates.gates.close import exact_and_emulated
from bloomery_gates.gates.routing_flips import routing_flips
from bloomery_gates.kernels.ops import router_v4 as krouter
from bloomery_gates.kernels.ops import v41_stream as ks
from bloomery_gates.kernels.ops.moe import Routing, topk_stable
from bloomery_gates.reference.ops import moe as rmoe
from bloomery_gates.reference.ops import router_v4 as rrouter

sys.path.insert(0, str(Path(__file__).parent))
from test_deepseek41 import FIXTURE, fixture_prompts, kd, ref, target_report  # noqa: E402

FLIP = re.compile(r"^\(r\) target routing of layer (\d+) .*: (\d+) checked, (\d+) differ, (\d+) excused")
STREAM = re.compile(r"^\(r\) target stream choice of layer (\d+) .*: (\d+) checked, (\d+) differ, (\d+) excused")


def test_margin_rule_on_planted_scores():
    """Excused only where the displaced and the new experts lie within 2 * band * max|c|; a repeated expert never."""
    band = Band(0.01, "planted")                                 # bound 2 * 0.01 * 1.0 = 0.02
    c = np.array([1.0, 0.9, 0.89, 0.5])
    assert routing_flip_excused(c, [0, 1], [1, 0], band)         # same set: no flip
    assert routing_flip_excused(c, [0, 1], [0, 2], band)         # 0.9 - 0.89 = 0.01 <= 0.02
    assert not routing_flip_excused(c, [0, 1], [0, 3], band)     # 0.9 - 0.5 = 0.4
    assert not routing_flip_excused(c, [0, 1], [2, 3], band)     # 1.0 - 0.5
    assert not routing_flip_excused(c, [0, 1], [0, 0], band)     # a repeated expert
    flips = routing_flips(np.stack([c, c, c]), np.array([[0, 1]] * 3), np.array([[0, 1], [0, 2], [0, 3]]), band)
    assert (flips.differ, flips.excused) == (2, 1)
    assert flips.use.tolist() == [[0, 1], [0, 2], [0, 1]]        # the kernel's experts only where excused


def test_margin_rule_ignores_entries_not_visible():
    """-inf (an entry not visible to the row, the stream top-k's) does not enter max|c|: before, it made the bound
    infinite and excused every stream flip."""
    band = Band(0.01, "planted")
    c = np.array([1.0, 0.9, 0.5, -np.inf])
    assert not routing_flip_excused(c, [0, 1], [0, 2], band)     # 0.4 > 0.02, however many entries are hidden
    assert routing_flip_excused(c, [0, 1], [1, 0], band)


def test_group_limited_rule_sees_a_tie_of_groups():
    """glm5next's router (2 groups of 4, the best 1 kept, top-2 in it): the kernel taking the other group where the
    groups' pair sums tie within the band is excused; the same experts where the groups are far apart are not, and
    the plain top-k margin would have refused the tie (its experts 0.10 apart)."""
    def rule(x):
        return rmoe.group_limited_choice(x, 2, 2, 1)

    band = Band(0.01, "planted")                                 # eps = 0.01 * 0.671
    tie = np.array([0.671, 0.503, 0.447, 0.520, 0.569, 0.453, 0.501, 0.621])     # pair sums 1.191 vs 1.190
    far = tie.copy()
    far[0] = 0.9                                                 # pair sums 1.42 vs 1.19
    assert rule(tie[None])[0].tolist() == [0, 3]
    assert routing_flip_excused(tie, [0, 3], [7, 4], band, rule)
    assert not routing_flip_excused(tie, [0, 3], [7, 4], band)   # the top-k margin: 0.671 - 0.569 > 2 eps
    assert not routing_flip_excused(far, [0, 3], [7, 4], band, rule)
    assert not routing_flip_excused(tie, [0, 3], [7, 5], band, rule)             # not the other group's best pair
    with rmoe.pinned() as pin:                                   # the router hands its rule to the pin
        rmoe.sigmoid_group_topk(np.log(tie / (1 - tie))[None], np.zeros(8), 2, 2, 1)
    assert pin.rules[rmoe.ROUTER](tie[None])[0].tolist() == [0, 3]


def test_pin_routes_with_the_given_experts():
    """Inside ``pinned`` the router records its own choice and routes with the pinned ids (weights from its own
    scores at them); a second router call in one block raises."""
    rng = np.random.default_rng(0)
    logits, bias = rng.normal(size=(5, 8)), rng.normal(size=8) * 0.1
    own = rrouter.sqrtsoftplus_topk(logits, bias, 2)
    forced = own.ids[:, ::-1].copy()
    forced[0] = [7, 6] if set(own.ids[0]) != {6, 7} else [0, 1]
    with rmoe.pinned({rmoe.ROUTER: forced}) as pin:
        r = rrouter.sqrtsoftplus_topk(logits, bias, 2)
        with pytest.raises(ValueError, match="twice"):
            rmoe.softmax_topk(logits, 2)
    scores, ids = pin.seen[rmoe.ROUTER]
    assert np.array_equal(ids, own.ids) and np.array_equal(scores, own.choice)
    assert np.array_equal(r.ids, forced)
    assert np.allclose(r.weights, rrouter.renormalised(rrouter.sqrt_softplus(logits), forced, 1.0))


def routing_counts(report, line: re.Pattern = FLIP) -> list[tuple[int, int, int, int]]:
    return [tuple(int(g) for g in m.groups()) for m in map(line.match, report.lines) if m]


@pytest.fixture(scope="module")
def fspec():
    from bloomery_cli.loading import load_target

    return load_target(FIXTURE)


@pytest.mark.parametrize("prompt", range(8))
def test_fixture_bf16_near_tie_flips_excused(fspec, prompt):
    """bf16, ds41-tiny, every gate prompt: p3, p6 and p7 failed their layer lines on a router or stream top-k flip
    at a near-tie before the rule; now every line passes, each MoE layer has its routing line and each topk source
    (layers 1, 3, 4 of the fixture: ``spec.streams``) its stream line, and the flips are counted, every one excused."""
    report = target_report(fspec, fixture_prompts()[prompt], "bf16")
    assert report.finish() == 0, report.lines
    counts, streams = routing_counts(report), routing_counts(report, STREAM)
    assert [c[0] for c in counts] == list(range(fspec.num_layers)), report.lines
    sources = sorted({s.topk_source for s in fspec.streams if s is not None})
    assert [c[0] for c in streams] == sources and sources, report.lines
    assert sum(c[3] for c in counts + streams) >= 1 and all(c[2] == c[3] for c in counts + streams), report.lines


def test_fixture_f32_no_flips(fspec):
    """f32, p3 (5 flips in bf16): no choice differs at all."""
    report = target_report(fspec, fixture_prompts()[3], "f32")
    assert report.finish() == 0, report.lines
    assert all(c[2] == 0 for c in routing_counts(report) + routing_counts(report, STREAM)), report.lines


def test_fixture_bf16_emulation_routed_with_the_kernel(fspec):
    """bf16, p0 layer 0: the emulation flips a router choice of its own when unpinned (its band was 2.15); routed
    with the kernel's experts the line's band is the rounding band again (0.038): more than 10x narrower."""
    tok = fixture_prompts()[0]
    eng = kd.Deepseek41Target(fspec, "cpu", torch.bfloat16, max_len=80, rows=4)
    taps = eng.prefill(tok, logits=True).taps.double().numpy()
    want, emu = exact_and_emulated("bf16", lambda: ref.reference_layer(fspec, 0, taps[0], taps=taps, ids=tok))
    unpinned = emulated_band("bf16", want, emu, "unpinned").value
    report = target_report(fspec, tok, "bf16")
    pinned = next(b["band"] for b in report.facts["bands"] if b["what"].startswith("target layer 0 out"))
    assert pinned * 10 < unpinned, (pinned, unpinned)


def _bias_on_weights(logits, bias, k, scale=1.0):
    """The defect: the router's weights from the biased scores s + b (the choice is right)."""
    c = krouter.sqrt_softplus(logits) + bias.float()
    ids = topk_stable(c, k)
    return Routing(ids, krouter.renormalised(c, ids, scale), c)


REAL = krouter.sqrtsoftplus_topk


def _k_plus_1(logits, bias, k, scale=1.0):
    """The defect: the row with the widest k-th / (k+1)-th margin routed to its (k+1)-th expert."""
    r = REAL(logits, bias, k + 1, scale)
    c, ids = r.choice, r.ids[:, :k].clone()
    gap = c.gather(-1, r.ids[:, k - 1:k]) - c.gather(-1, r.ids[:, k:k + 1])
    t = int(gap[:, 0].argmax())
    ids[t, k - 1] = r.ids[t, k]
    return Routing(ids, krouter.renormalised(krouter.sqrt_softplus(logits), ids, scale), c)


def test_fixture_fail_first_bias_on_weights(fspec, monkeypatch):
    """bf16, p0: the router bias applied to the weights (every choice right) fails a layer line, exit 1."""
    monkeypatch.setattr(krouter, "sqrtsoftplus_topk", _bias_on_weights)
    report = target_report(fspec, fixture_prompts()[0], "bf16")
    assert report.finish() == 1
    assert any(line.startswith("(r) target layer") and line.endswith("FAIL") for line in report.lines), report.lines


def test_fixture_fail_first_flip_outside_the_margin(fspec, monkeypatch):
    """bf16, p0: one row per layer routed to its (k+1)-th expert where the margin is widest: the routing lines
    count it and do not excuse it (FAIL), exit 1; the layer line keeps the reference's experts."""
    monkeypatch.setattr(krouter, "sqrtsoftplus_topk", _k_plus_1)
    report = target_report(fspec, fixture_prompts()[0], "bf16")
    assert report.finish() == 1
    failed = [line for line in report.lines if FLIP.match(line) and line.endswith("FAIL")]
    assert len(failed) == fspec.num_layers, report.lines
    assert all(c[2] > c[3] for c in routing_counts(report)), report.lines


REAL_STREAM = ks.stream_choice


def _least_scored(keys, a, w, iw, num_heads, index_heads, topk, *rest, **kw):
    """The defect: the last row (every entry visible) given its least-scored entry in its k-th slot."""
    full = REAL_STREAM(keys, a, w, iw, num_heads, index_heads, 10 ** 6, *rest, **kw)
    out = full[:, :topk].clone()
    out[-1, -1] = full[-1, -1]
    return out


def test_fixture_fail_first_stream_flip_outside_the_margin(fspec, monkeypatch):
    """bf16, p0: the last row's stream choice given its least-scored entry: every stream line counts it and does not
    excuse it (FAIL), exit 1."""
    monkeypatch.setattr(ks, "stream_choice", _least_scored)
    report = target_report(fspec, fixture_prompts()[0], "bf16")
    assert report.finish() == 1
    failed = [line for line in report.lines if STREAM.match(line) and line.endswith("FAIL")]
    assert len(failed) == len(routing_counts(report, STREAM)) > 0, report.lines
