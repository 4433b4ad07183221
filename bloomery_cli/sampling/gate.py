"""The gate's sampling part (``--temperature T > 0``): the (s) statistical check and accept_mean at T.

(s): R seeded plain runs emitting m + 1 ids and R seeded drafted runs emitting m' + 1 of the first prompt; the
ids at positions 1..m of both (position 0 is drawn from the prefill's last row by the same code in both runs)
go to the per-position two-sample test, the drafted ids 1..m' and their PITs under the target's p from one
teacher-forced prefill of prompt + the run's ids to the PIT tests (``sampling_stats``). Run i of arm a
(0 plain, 1 drafted) draws from the stream (seed, a, i), its PIT's randomisation from (seed, 3 + a, i).
Acceptance at T: one drafted run of every prompt, n ids, stream (seed, 2, prompt index); the same definitions
as the greedy acceptance (``metrics.Tally``).
"""

from __future__ import annotations

import numpy as np

from ..metrics import Tally
from ..speculative import Run, generate
from .rule import Sampler, Sampling, SeededChoice
from .stats import pit, two_sample_test

# The (s) statistical line's power against each sampling defect class, measured (issue 29: the defect planted,
# the gate run at its default budget, f32 CPU, first prompt, n=32; tests/issue29_plants.py): the p it printed. Every
# class is caught by the (s) replay line (exact, common random numbers), in f32 and bf16 (tests/test_issue29_*).
POWER_BY_DEFECT = {
    "residual not renormalised": {"qwen38-mtp T=1": {"p": 1.18e-39, "seen": True},
                                  "qwen3-dflash T=1": {"p": 3.72e-05, "seen": True},
                                  "qwen3-dflash T=1 Td=0.7": {"p": 2.03e-76, "seen": True}},
    "bonus from the draft's distribution": {"qwen38-mtp T=1": {"p": 0.0352, "seen": False},
                                            "qwen3-dflash T=1": {"p": 1.0, "seen": False},
                                            "qwen3-dflash T=1 Td=0.7": {"p": 0.205, "seen": False}},
    "bonus from the last draft row's p": {"qwen38-mtp T=1": {"p": 0.146, "seen": False},
                                          "qwen3-dflash T=1": {"p": 1.0, "seen": False},
                                          "qwen3-dflash T=1 Td=0.7": {"p": 0.205, "seen": False}},
    # measured before issue 29 (docs/CONTRACT.md, tests/test_sampling_gate.py)
    "resample from p instead of the residual": {"qwen38-mtp T=1": {"p": 3e-12, "seen": True, "earlier": True}},
    "bonus dropped (all accepted)": {"qwen38-mtp T=1": {"p": 0.21, "seen": False, "earlier": True}},
}

RUNS = 64          # per arm
POSITIONS = 16     # the per-position test's positions, both arms
PIT_POSITIONS = 48 # the drafted runs' length: their PITs


def sampled_ids(engine, draft, prompt: list[int], cond: Sampling, runs: int, positions: int, arm: int,
                width=None, pits: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """([runs, positions] emitted ids 1..positions of each seeded run, [runs, positions] their PITs if asked)."""
    ids = np.zeros((runs, positions), dtype=np.int64)
    u = np.zeros((runs, positions)) if pits else None
    for i in range(runs):
        run = generate(engine, draft, prompt, positions + 1, width=width,
                       sampler=Sampler(cond, SeededChoice(cond.seed, arm, i)))
        ids[i] = run.ids[1:]
        if pits:
            forced = engine.prefill(prompt + run.ids[:positions], logits=True).logits[len(prompt):]   # p of ids 1..m
            v = np.random.default_rng(np.random.SeedSequence([cond.seed, 3 + arm, i])).random(positions)
            u[i] = pit(Sampler(cond, None).probs(forced), ids[i], v)
    return ids, u


def check_sampling(report, engine, draft, prompt: list[int], cond: Sampling, width=None, runs: int = RUNS,
                   positions: int = POSITIONS, pit_positions: int = PIT_POSITIONS) -> bool:
    """(s) plain vs drafted sampling on ``prompt``; a drafted run that breaks is a failed check."""
    plain, _ = sampled_ids(engine, None, prompt, cond, runs, positions, 0)
    try:
        drafted, u = sampled_ids(engine, draft, prompt, cond, runs, max(positions, pit_positions), 1, width, pits=True)
    except (RuntimeError, ValueError, IndexError) as e:
        return report.check(f"(s) sampling: drafted run broke: {type(e).__name__}: {e}", False)
    res = two_sample_test(plain, drafted[:, :positions], u, seed=cond.seed)
    report.facts["sampling_test"] = {"test": res.test, "runs": res.runs, "positions": res.positions,
                                     "pit_samples": res.pit_samples, "alpha": res.alpha, "p": res.p,
                                     "p_marginal": res.p_marginal, "p_pit_hist": res.p_pit_hist,
                                     "p_pit_mean": res.p_pit_mean, "worst_position": res.worst_position + 1,
                                     "detectable_w": round(res.detectable_w, 4),
                                     "detectable_shift": round(res.detectable_shift, 4), "categories": res.categories,
                                     "power_by_defect": POWER_BY_DEFECT}
    return report.sampling(res)


def sampled_acceptance(engine, draft, prompts: list[list[int]], n: int, cond: Sampling,
                       width=None) -> tuple[Tally, list[Tally], list[Run]]:
    """Drafted sampled runs of every prompt: (pooled tally, per-prompt tallies, the runs)."""
    runs = [generate(engine, draft, p, n, width=width, sampler=Sampler(cond, SeededChoice(cond.seed, 2, i)))
            for i, p in enumerate(prompts)]
    per_prompt = [r.tally for r in runs]
    pooled = Tally()
    for t in per_prompt:
        pooled = pooled.merge(t)
    return pooled, per_prompt, runs
