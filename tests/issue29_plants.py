"""Planted defects for issue 29's FAIL-first tests (test code only: every plant is a monkeypatch)."""

from __future__ import annotations

import numpy as np

import bloomery_cli.sampling.rule as sampling
from bloomery_cli.sampling.rule import process


def residual_not_renormalised(monkeypatch) -> None:
    """norm(max(p - q, 0)) left as max(p - q, 0): the draw takes u against a CDF that ends below 1."""
    def residual(p, q, d):
        r = p.copy()
        if q is None:
            r[d] = 0.0
        else:
            r = np.maximum(p - q, 0.0)
        return r

    monkeypatch.setattr(sampling, "residual", residual)


def _window_with_bonus(monkeypatch, bonus_of) -> None:
    """Sampler.window whose all-accepted bonus is drawn from ``bonus_of(sampler, p_rows, k)``."""
    def window(self, logits, proposals, q_rows):
        p_rows = self.probs(logits)
        out = []
        for j, d in enumerate(proposals):
            a = sampling.accept_prob(p_rows[j], q_rows[j], d)
            if self.choose(np.array([1.0 - a, a])) == 1:
                out.append(d)
                continue
            out.append(self.choose(sampling.residual(p_rows[j], q_rows[j], d)))
            return j + 1, out
        out.append(self.choose(bonus_of(self, p_rows, len(proposals))))
        return len(proposals) + 1, out

    monkeypatch.setattr(sampling.Sampler, "window", window)


def bonus_from_last_draft_row(monkeypatch) -> None:
    """The bonus drawn from p_k (the last draft row's target distribution) instead of p_{k+1}."""
    _window_with_bonus(monkeypatch, lambda self, p_rows, k: p_rows[max(k - 1, 0)])


def bonus_from_draft(monkeypatch) -> None:
    """The bonus drawn from the draft's distribution: process(draft logits / T) of the row after the last
    proposal (the draft's last row where it has no further one)."""
    real = sampling.Sampler.proposals

    def proposals(self, draft, anchor, k):
        prop = draft.propose(anchor, detail=True)
        self._draft_rows = prop.logits.double().cpu().numpy()
        if self.cond.draft_temperature is None:
            return prop.ids[:k], [None] * len(prop.ids[:k])
        return real(self, _Once(prop), anchor, k)

    def bonus_of(self, p_rows, k):
        if k == 0:                                   # a plain pass: no draft row to draw from
            return p_rows[0]
        rows = self._draft_rows
        return process(rows[min(k, len(rows) - 1)][None], self.cond.temperature)[0]

    monkeypatch.setattr(sampling.Sampler, "proposals", proposals)
    _window_with_bonus(monkeypatch, bonus_of)


class _Once:
    """A draft that answers propose with a proposal already made (the plant must not propose twice)."""

    def __init__(self, prop):
        self.prop = prop

    def propose(self, anchor, detail=False):
        return self.prop


SAMPLING_PLANTS = {"residual not renormalised": residual_not_renormalised,
                   "bonus from the draft's distribution": bonus_from_draft,
                   "bonus from the last draft row's p": bonus_from_last_draft_row}


def cut_one_late(monkeypatch) -> None:
    """DSpark's cut keeps one draft past the first low confidence."""
    import bloomery_gates.kernels.drafts.dspark as dspark

    real = dspark.keep_count

    def keep_count(confidence, threshold, b, device):
        k = real(confidence, threshold, b, device)
        return k if confidence is None or threshold <= 0 else (k + 1).clamp(max=b)

    monkeypatch.setattr(dspark, "keep_count", keep_count)


def cut_on_raw_logit(monkeypatch) -> None:
    """DSpark's cut compares the raw confidence logit z with t, not sigmoid(z)."""
    import torch

    import bloomery_gates.kernels.drafts.dspark as dspark

    real = dspark.keep_count

    def keep_count(confidence, threshold, b, device):
        z = None if confidence is None else torch.logit(confidence.double()).float()
        return real(z, threshold, b, device)

    monkeypatch.setattr(dspark, "keep_count", keep_count)


CUT_PLANTS = {"cut one draft too late": cut_one_late, "cut on the raw logit": cut_on_raw_logit}


def ties_candidates_by_id_descending(monkeypatch) -> None:
    """DFlash2's top-K: equal values ordered by the higher id first (the rule says the lower)."""
    import bloomery_gates.kernels.ops.selector as selector

    def topk_candidates(l, k):
        u, c = selector.torch.topk(l, k, dim=-1, sorted=True)
        c, perm = c.sort(dim=-1, descending=True)
        u = u.gather(-1, perm)
        u, perm = u.sort(dim=-1, descending=True, stable=True)
        return u, c.gather(-1, perm)

    monkeypatch.setattr(selector, "topk_candidates", topk_candidates)


def ties_walk_last_argmax(monkeypatch) -> None:
    """DFlash2's walk: the last index of the maximum (the rule says the first)."""
    import bloomery_gates.kernels.ops.selector as selector

    real = selector.first_argmax

    def last_argmax(x):
        return x.shape[-1] - 1 - real(x.flip(-1))

    monkeypatch.setattr(selector, "first_argmax", last_argmax)


TIE_PLANTS = {"candidate tie order": ties_candidates_by_id_descending, "walk last argmax": ties_walk_last_argmax}


def accept_mean_without_bonus(monkeypatch) -> None:
    """accept_mean computed over accepted drafts only (the bonus row left out of kept)."""
    from bloomery_cli.metrics import Tally

    monkeypatch.setattr(Tally, "accept_mean",
                        property(lambda self: sum(k - 1 for k in self.kept) / self.windows if self.windows else 0.0))


def gate_run(gate: str, prompts, dtype: str, *flags: str, n: int = 24) -> tuple[int, list[str]]:
    """``bloomery gate run`` through the CLI on the given prompts file: (exit code, printed lines)."""
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    result = CliRunner().invoke(app, ["gate", "run", gate, "-n", str(n), "--prompts", str(prompts), "--dtype", dtype,
                                      *flags])
    return result.exit_code, result.output.splitlines()


def shrink_s(monkeypatch, runs: int = 4) -> None:
    """The (s) statistical line on ``runs`` runs per arm: the tests that use it assert other lines."""
    import bloomery_cli.sampling.gate as sampling_gate

    real = sampling_gate.check_sampling
    monkeypatch.setattr(sampling_gate, "check_sampling", lambda *a, **k: real(*a, **{**k, "runs": runs}))


def line(lines: list[str], head: str) -> str:
    return next(x for x in lines if x.startswith(head))
