"""Speculative sampling at T > 0: the target's distribution p, the drafter's q, and the verify rule.

    p_r  = process(logits_r / T, top_k, top_p)                      [V] float64, row r of a verify   (1)
    for j = 1 .. k (the proposals d_j, drawn from q_j):
        accept d_j with probability  a_j = min(1, p_j(d_j) / q_j(d_j))                                (2)
        at the first rejection emit  x ~ norm(max(p_j - q_j, 0))    (the residual) and stop           (3)
    all k accepted: emit the bonus  x ~ p_{k+1}                                                       (4)

(1)-(4) make the emitted sequence distributed exactly as plain sampling from p (Leviathan et al. 2023,
Chen et al. 2023): P(emit x at j) = q(x) a(x) + (1 - sum_y q(y) a(y)) r(x) = min(q, p)(x) + max(p - q, 0)(x) = p(x).

q kinds:
- point mass (every drafter here proposes deterministically: the DFlash argmax block, the DFlash2 path walk,
  the DSpark Markov chain, the MTP / EAGLE-3 greedy chains): q_j = e_{d_j}, so a_j = p_j(d_j) and the
  residual is p_j with d_j removed, renormalised. Represented by ``q = None``.
- full / top-k (a drafter that samples its proposals, ``--draft-temperature``): q_j = process(draft logits_j /
  T_d, top_k_d) and d_j ~ q_j. Only a drafter whose block rows are independent given the anchor (DFlash) can be
  sampled outside its kernel: the rows' logits do not depend on the earlier drafts.

Every random choice goes through one ``choose(dist) -> index`` callable: the gate's is a seeded inverse-CDF
draw (``SeededChoice``); the exact proof (``sampling_exact``) replays every branch with its probability.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bloomery_gates.errors import InputError

Choose = Callable[[np.ndarray], int]

SAMPLEABLE_DRAFTS = ("dflash",)   # drafts whose block rows are independent given the anchor


@dataclass(frozen=True)
class Sampling:
    """The sampling conditions of a run (all of them go into the record)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0                        # 0: off
    seed: int = 0
    draft_temperature: float | None = None   # None: the drafter's deterministic proposals (q a point mass)
    draft_top_k: int = 0

    @property
    def q_kind(self) -> str:
        if self.draft_temperature is None:
            return "point mass"
        return f"top-{self.draft_top_k}" if self.draft_top_k else "full"

    def facts(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                "draft_temperature": self.draft_temperature, "draft_top_k": self.draft_top_k, "q": self.q_kind}


MIN_TEMPERATURE = 1e-6
"""The smallest T taken: at 1e-6 a logit gap of 7.1e-4 already gives exp(-gap / T) < 1e-308 (a point mass, the
greedy run), and logits of 1e3 / T stay far inside float64; a denormal T made them inf and the statistics crash."""


def sampling_options(temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None,
                     draft_temperature: float | None, draft_top_k: int | None) -> Sampling | None:
    """The CLI's sampling flags -> Sampling (None: a greedy run); a bad combination is a named InputError."""
    if temperature is None or temperature == 0:
        for flag, v in (("--top-p", top_p), ("--top-k", top_k), ("--seed", seed),
                        ("--draft-temperature", draft_temperature), ("--draft-top-k", draft_top_k)):
            if v is not None:
                raise InputError(flag, "acts only on a sampled run: give --temperature T > 0")
        return None
    if not (temperature > 0 and np.isfinite(temperature)):
        raise InputError("--temperature", f"{temperature}: expected T >= 0 (0: greedy)")
    if temperature < MIN_TEMPERATURE:
        raise InputError("--temperature", f"{temperature}: expected 0 (greedy) or T >= {MIN_TEMPERATURE:g} (below "
                                          "it logits / T leave float64's range)")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputError("--top-p", f"{top_p}: expected 0 < P <= 1")
    for flag, v in (("--top-k", top_k), ("--draft-top-k", draft_top_k), ("--seed", seed)):
        if v is not None and v < 0:
            raise InputError(flag, f"{v}: expected an integer >= 0")
    if draft_temperature is not None and not (draft_temperature >= MIN_TEMPERATURE and np.isfinite(draft_temperature)):
        raise InputError("--draft-temperature", f"{draft_temperature}: expected T_d >= {MIN_TEMPERATURE:g}")
    if draft_top_k is not None and draft_temperature is None:
        raise InputError("--draft-top-k", "needs --draft-temperature (the drafter's own sampling)")
    return Sampling(float(temperature), 1.0 if top_p is None else float(top_p), top_k or 0, seed or 0,
                    draft_temperature, draft_top_k or 0)


def check_sampleable(gate: str, draft_kind: str) -> None:
    """--draft-temperature needs a drafter whose block rows can be drawn outside its kernel."""
    if draft_kind not in SAMPLEABLE_DRAFTS:
        raise InputError("--draft-temperature", f"gate {gate}: the {draft_kind} drafter proposes deterministically "
                         f"(its q is a point mass; each draft depends on the earlier ones); only "
                         f"{', '.join(SAMPLEABLE_DRAFTS)} drafts can sample their proposals")


def process(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """logits [..., V] -> probabilities [..., V] float64: softmax(logits / T) restricted to the top_k largest
    (0: all), then to the smallest set, largest first, whose mass reaches top_p (the token crossing it kept),
    renormalised. Ties are broken by the lower id (a stable sort), the same in every run."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    order = np.argsort(-z, axis=-1, kind="stable") if top_k or top_p < 1.0 else None
    if top_k:
        z = np.where(np.argsort(order, axis=-1, kind="stable") < top_k, z, -np.inf)   # rank of each id < top_k
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p        # mass strictly above each token
        inside = np.zeros(z.shape, dtype=bool)
        np.put_along_axis(inside, order, before < top_p, axis=-1)
        p = np.where(inside, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def accept_prob(p: np.ndarray, q: np.ndarray | None, d: int) -> float:
    """(2) a = min(1, p(d) / q(d)); q None (a point mass on d): a = p(d)."""
    if q is None:
        return float(min(1.0, p[d]))
    return float(min(1.0, p[d] / q[d])) if q[d] > 0 else 1.0


def residual(p: np.ndarray, q: np.ndarray | None, d: int) -> np.ndarray:
    """(3) norm(max(p - q, 0)) [V]; q None: p with d removed, renormalised. Only asked after a rejection,
    which has probability sum(max(q - p, 0)) = sum(max(p - q, 0)) > 0, so the norm is positive."""
    r = p.copy()
    if q is None:
        r[d] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    return r / r.sum()


def bonus(p: np.ndarray) -> np.ndarray:
    """(4) the bonus row's distribution: p itself."""
    return p


def verify_window(p_rows: np.ndarray, proposals: list[int], q_rows: list[np.ndarray | None],
                  choose: Choose) -> tuple[int, list[int]]:
    """(2)-(4) over one window: p_rows [k+1, V] (row j is the target after the anchor and d_1..d_j), proposals
    d_1..d_k, q_rows (k entries, None = point mass). Returns (kept rows, emitted ids): kept = accepted + 1 (the
    anchor's row and every accepted draft's), emitted = the accepted drafts, then the residual draw or the bonus."""
    out: list[int] = []
    for j, d in enumerate(proposals):
        a = accept_prob(p_rows[j], q_rows[j], d)
        if choose(np.array([1.0 - a, a])) == 1:
            out.append(d)
            continue
        out.append(choose(residual(p_rows[j], q_rows[j], d)))
        return j + 1, out
    out.append(choose(bonus(p_rows[len(proposals)])))
    return len(proposals) + 1, out


class SeededChoice:
    """choose(dist) -> one index drawn by inverse CDF from a seeded PCG64 stream: u ~ U[0, 1), the first i with
    cumsum(dist)[i] > u (a zero-probability index is never drawn; the last index if none). ``dist`` is a
    distribution: it sums to 1 and the draw does not rescale it, so a distribution left unnormalised draws
    differently from the rule (``sampling_replay`` states the order the draws are consumed in and checks it)."""

    def __init__(self, *seed: int):
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(seed))))

    def __call__(self, dist: np.ndarray) -> int:
        c = np.cumsum(dist)
        i = int(np.searchsorted(c, self.rng.random(), side="right"))
        return min(i, len(dist) - 1)


@dataclass
class Sampler:
    """What the speculative loop asks at T > 0: p from the target's logits, the proposals and their q, and the
    verify rule. ``choose`` is the source of every random choice of the run."""

    cond: Sampling
    choose: Choose

    def probs(self, logits) -> np.ndarray:
        """Target logits [R, V] (a torch tensor or an array) -> p [R, V] float64."""
        rows = logits.double().cpu().numpy() if hasattr(logits, "double") else np.asarray(logits, np.float64)
        return process(rows, self.cond.temperature, self.cond.top_k, self.cond.top_p)

    def first(self, logits) -> int:
        """The first id after the prompt: a draw from p of the prompt's last row."""
        return self.choose(self.probs(logits[-1:])[0])

    def proposals(self, draft, anchor: int, k: int) -> tuple[list[int], list[np.ndarray | None]]:
        """The first k proposals and their q rows: the drafter's own ids with q a point mass, or (draft
        temperature set) ids drawn from q = process(draft logits / T_d, top_k_d), row by row."""
        if self.cond.draft_temperature is None:
            ids = draft.propose(anchor).ids[:k]
            return ids, [None] * len(ids)
        logits = draft.propose(anchor, detail=True).logits[:k]
        q = process(logits.double().cpu().numpy(), self.cond.draft_temperature, self.cond.draft_top_k)
        return [self.choose(row) for row in q], list(q)

    def window(self, logits, proposals: list[int], q_rows: list[np.ndarray | None]) -> tuple[int, list[int]]:
        return verify_window(self.probs(logits), proposals, q_rows, self.choose)
