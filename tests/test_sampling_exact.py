"""The exact float64 proof (sampling_exact): the law of the emitted sequence under drafting equals plain sampling
from the target, for every q kind, through the one speculative loop; each planted sampling defect breaks it."""

from __future__ import annotations

import numpy as np
import pytest

import bloomery_cli.sampling.rule as sampling
from bloomery_cli.sampling.exact import law, prove
from bloomery_cli.sampling.rule import Sampling, process

EXACT = 1e-14      # float64: sums of a few hundred products of ~10 factors
CASES = {                                                          # (conditions, draft structure, vocab, n)
    "point mass, block (DFlash, DFlash2 path, DSpark)": (Sampling(1.0), "block", 4, 4),
    "point mass, chain (MTP, EAGLE-3)": (Sampling(1.0), "chain", 4, 4),
    "point mass, target T=0.7 top-k 3 top-p 0.8": (Sampling(0.7, top_p=0.8, top_k=3), "chain", 4, 4),
    "full q (sampled block, T_d=0.8)": (Sampling(1.0, draft_temperature=0.8), "block", 3, 3),
    "top-k q (sampled block, top-2)": (Sampling(1.2, draft_temperature=0.5, draft_top_k=2), "block", 3, 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_drafted_law_equals_plain_sampling(case):
    cond, kind, vocab, n = CASES[case]
    proof = prove(cond, kind, vocab=vocab, n=n)
    assert proof.drafted_vs_product < EXACT and proof.plain_vs_product < EXACT, proof
    assert abs(proof.mass - 1.0) < EXACT and proof.sequences > 1


def test_width_cap_keeps_the_law():
    proof = prove(Sampling(1.0), "chain", vocab=3, block=4, n=4, width=2)
    assert proof.drafted_vs_product < EXACT, proof


def test_law_replays_every_branch():
    def two_draws(choose):
        return (choose(np.array([0.25, 0.75])), choose(np.array([0.5, 0.0, 0.5])))

    assert law(two_draws) == {(0, 0): 0.125, (0, 2): 0.125, (1, 0): 0.375, (1, 2): 0.375}


def test_process_temperature_top_k_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert np.allclose(process(logits, 1.0), [[0.5, 0.3, 0.15, 0.05]])
    assert np.allclose(process(logits, 1.0, top_k=2), [[0.625, 0.375, 0, 0]])
    assert np.allclose(process(logits, 1.0, top_p=0.75), [[0.625, 0.375, 0, 0]])   # 0.5 + 0.3 reaches 0.75
    assert np.allclose(process(logits, 1.0, top_p=0.85), [[0.5, 0.3, 0.15, 0]] / np.float64(0.95))
    hot = process(logits, 2.0)[0]
    assert hot[0] < 0.5 and hot[3] > 0.05 and abs(hot.sum() - 1) < 1e-15


# --- planted defects: each must break the proof ---

PLANTED_GAP = 1e-3


def test_planted_residual_from_p(monkeypatch):
    monkeypatch.setattr(sampling, "residual", lambda p, q, d: p)      # the defect: resample from p
    assert prove(Sampling(1.0), "block").drafted_vs_product > PLANTED_GAP


def test_planted_bonus_dropped(monkeypatch):
    real = sampling.verify_window

    def dropped(p_rows, proposals, q_rows, choose):
        kept, out = real(p_rows, proposals, q_rows, choose)
        full = proposals and kept == len(proposals) + 1
        return kept, out[:-1] if full else out      # all accepted: rows kept, the bonus not emitted

    monkeypatch.setattr(sampling, "verify_window", dropped)
    assert prove(Sampling(1.0), "chain").drafted_vs_product > PLANTED_GAP


def test_planted_bonus_greedy(monkeypatch):
    monkeypatch.setattr(sampling, "bonus", lambda p: np.eye(len(p))[int(np.argmax(p))])
    assert prove(Sampling(1.0), "chain").drafted_vs_product > PLANTED_GAP


def test_q_ignored_for_a_sampling_drafter_is_still_lossless(monkeypatch):
    """Not a defect: given its draw d, a sampled proposal is a point mass, and the point-mass rule (accept
    w.p. p(d), residual p without d) emits x w.p. p(d)[x = d] + (1 - p(d)) p(x)/(1 - p(d))[x != d] = p(x). It only
    accepts less often than min(1, p/q). The proof says so: the law stays exact."""
    accept, resid = sampling.accept_prob, sampling.residual
    monkeypatch.setattr(sampling, "accept_prob", lambda p, q, d: accept(p, None, d))
    monkeypatch.setattr(sampling, "residual", lambda p, q, d: resid(p, None, d))
    proof = prove(Sampling(1.0, draft_temperature=0.5, draft_top_k=2), "block", vocab=3, n=3)
    assert proof.drafted_vs_product < EXACT, proof


def softmax_q(monkeypatch):
    """The defect of a deterministic drafter verified as if it sampled: its argmax proposals checked against
    q = softmax(draft logits) (min(1, p/q), residual max(p - q, 0)) instead of the point mass they are."""
    def proposals(self, draft, anchor, k):
        prop = draft.propose(anchor, detail=True)
        return prop.ids[:k], list(process(prop.logits[:k].double().cpu().numpy(), 1.0))

    monkeypatch.setattr(sampling.Sampler, "proposals", proposals)


def test_planted_softmax_q_for_a_point_mass_drafter(monkeypatch):
    softmax_q(monkeypatch)
    assert prove(Sampling(1.0), "block").drafted_vs_product > PLANTED_GAP


def test_planted_accept_always(monkeypatch):
    monkeypatch.setattr(sampling, "accept_prob", lambda p, q, d: 1.0)
    assert prove(Sampling(1.0), "block").drafted_vs_product > PLANTED_GAP
