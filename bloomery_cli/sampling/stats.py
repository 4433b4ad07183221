"""The statistical half of the sampling check: plain vs drafted emitted ids, position by position.

Data: a [R, m] and b [R, m], the emitted ids 1..m of R seeded plain runs and R seeded drafted runs of one
prompt, and u [R, m'] the drafted runs' PITs (m' >= m positions) under the target's teacher-forced p (``pit``).
H0 (drafting is lossless): the runs of both arms have the same law, so the arm labels of the 2R runs are
exchangeable, and every drafted id is a draw from the target's p given its past.

Part 1, marginal: per position t a two-sample chi-square of homogeneity over the ids' categories (ids seen
fewer than ``MIN_COUNT`` times in both columns together pooled into one, a label-blind choice):
    X_t = sum_c (A_c - B_c)^2 / (A_c + B_c)          A_c, B_c: counts of category c in a[:, t], b[:, t]
combined over the (dependent) positions by Bonferroni: p_marginal = min(1, m min_t p_t).
The marginal p_t are permutation p-values over the run labels (``P`` relabellings shared by all positions):
p_t = (1 + #{X_t(perm) >= X_t}) / (P + 1), exact at any sample size, whatever the dependence inside a run.
Parts 2 and 3, conditional: the drafted run's emitted id's randomised PIT u_t under the target's teacher-forced
p(. | prompt, x_<t) is U[0, 1) given the past when x_t ~ p_t, so all of a run's u_t are independent U[0, 1)
(under H0 for every position at once, whatever the context). Part 2: their ``PIT_BINS``-bin histogram against the
uniform (chi-square, df = B - 1); part 3: their mean against 1/2 (a defect that over-emits likely ids, e.g. a
residual that keeps the rejected draft, lowers it). These see a defect wherever it happens, where the marginals
dilute it over contexts, and use the drafted arm's longer runs.
The three parts are combined by Bonferroni, p = min(1, 3 min(...)); the check passes when p >= alpha.
Significance: P(FAIL | H0) <= alpha.

Power (Cohen 1988): under an alternative of effect w^2 = sum_c (p1_c - p0_c)^2 / p0_c the histogram's X is about
noncentral chi-square with df = B - 1 and lambda = N w^2; ``detectable_w`` is the smallest w the level-alpha/3 test
detects with probability ``POWER``, ``detectable_shift`` the smallest |E u - 1/2| the mean test does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

ALPHA = 1e-3
POWER = 0.9
MIN_COUNT = 5
PERMUTATIONS = 20000
PIT_BINS = 11                 # df = 10, even: chi2_sf_even's closed form


@dataclass(frozen=True)
class GofResult:
    runs: int
    positions: int           # the marginal test's positions (both arms)
    pit_samples: int         # the drafted arm's PITs
    alpha: float
    p: float                 # the combined p-value: Bonferroni over the three parts
    p_marginal: float        # per-position marginal chi-square, Bonferroni over positions
    p_pit_hist: float        # the drafted PITs' histogram against U[0, 1)
    p_pit_mean: float        # the drafted PITs' mean against 1/2
    worst_position: int      # the position of the smallest marginal p_t (0-based)
    detectable_w: float      # PIT histogram: power POWER at Cohen's w >= this
    detectable_shift: float  # PIT mean: power POWER at |mean - 1/2| >= this
    categories: list[int]    # per position, the marginal test's categories
    power: float = POWER

    @property
    def ok(self) -> bool:
        return self.p >= self.alpha

    test = "per-position chi-square plain vs drafted (permutation) + drafted PIT histogram and mean (Bonferroni)"


def onehot_categories(column: np.ndarray, min_count: int = MIN_COUNT) -> np.ndarray:
    """ids [N] -> one-hot [N, C] over the ids seen >= min_count times, the rest pooled into one last category."""
    ids, inverse, counts = np.unique(column, return_inverse=True, return_counts=True)
    frequent = counts >= min_count
    cat = np.where(frequent, np.cumsum(frequent) - 1, frequent.sum())[inverse]
    c = int(frequent.sum()) + int((~frequent).any())
    return np.eye(c, dtype=np.float32)[cat]


def statistic(a_counts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """X = sum_c (A_c - B_c)^2 / N_c with B = N - A; a_counts [..., C], totals [C] (empty categories skipped)."""
    used = totals > 0
    return (((2.0 * a_counts[..., used] - totals[used]) ** 2) / totals[used]).sum(-1)


def relabellings(runs: int, permutations: int, seed: int) -> np.ndarray:
    """[P, 2R] float32: 1 where a random relabelling puts a run in the first arm (R of the 2R)."""
    rng = np.random.default_rng(seed)
    order = rng.permuted(np.tile(np.arange(2 * runs), (permutations, 1)), axis=1)[:, :runs]
    labels = np.zeros((permutations, 2 * runs), dtype=np.float32)
    np.put_along_axis(labels, order, 1.0, axis=1)
    return labels


def permutation_p(counts: np.ndarray, labels: np.ndarray) -> float:
    """counts [2R, C] per run (the first R in the first arm) -> the permutation p-value of X over run labels."""
    r = counts.shape[0] // 2
    totals = counts.sum(0)
    observed = statistic(counts[:r].sum(0), totals)
    permuted = statistic(labels @ counts, totals)
    return (1 + int((permuted >= observed - 1e-9).sum())) / (len(labels) + 1)


def pit(p_rows: np.ndarray, ids: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Randomised probability integral transform: p_rows [m, V], ids [m], v [m] ~ U[0, 1) -> u [m],
    u_t = P_t(ids more probable than x_t, ties by lower id) + v_t p_t(x_t). Under H0 (x_t ~ p_t given the past)
    u_1..u_m are independent U[0, 1)."""
    px = p_rows[np.arange(len(ids)), ids][:, None]
    col = np.arange(p_rows.shape[1])[None, :]
    above = ((p_rows > px) | ((p_rows == px) & (col < ids[:, None]))) * p_rows
    return above.sum(1) + v * px[:, 0]


def chi2_sf_even(x: float, df: int) -> float:
    """P(chi-square_df >= x) for even df: exp(-x/2) sum_{k < df/2} (x/2)^k / k! (closed form)."""
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
        term *= (x / 2) / k
        total += term
    return min(1.0, math.exp(-x / 2) * total)


def pit_tests(u: np.ndarray, level: float, power: float = POWER) -> tuple[float, float, float, float]:
    """u [N] PITs -> (p histogram, p mean, detectable w, detectable mean shift). Histogram: ``PIT_BINS`` equal bins,
    X = sum (O - N/B)^2 / (N/B), df = B - 1 (even). Mean: z = (mean - 1/2) / sqrt(1 / (12 N)), two-sided normal
    p (the mean of N >= 1000 uniforms is normal to ~1e-4). Powers at ``level`` each."""
    n = u.size
    obs = np.bincount(np.minimum((u * PIT_BINS).astype(int), PIT_BINS - 1), minlength=PIT_BINS)
    x = float(((obs - n / PIT_BINS) ** 2).sum() / (n / PIT_BINS))
    p_hist = chi2_sf_even(x, PIT_BINS - 1)
    sd = math.sqrt(1.0 / (12.0 * n))
    p_mean = math.erfc(abs(float(u.mean()) - 0.5) / sd / math.sqrt(2.0))
    z = NormalDist()
    shift = (z.inv_cdf(1 - level / 2) + z.inv_cdf(power)) * sd
    return p_hist, p_mean, detectable_w(PIT_BINS - 1, n, level), shift


def two_sample_test(a: np.ndarray, b: np.ndarray, u: np.ndarray, alpha: float = ALPHA,
                    permutations: int = PERMUTATIONS, seed: int = 0) -> GofResult:
    """a, b [R, m] ids (R plain runs, R drafted runs), u [R, m'] the drafted runs' PITs -> the combined test."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"plain {a.shape} and drafted {b.shape} ids must both be [runs, positions]")
    r, m = a.shape
    labels = relabellings(r, permutations, seed)
    ps, cats = [], []
    for t in range(m):
        hot = onehot_categories(np.concatenate([a[:, t], b[:, t]]))      # [2R, C]
        ps.append(permutation_p(hot, labels))
        cats.append(hot.shape[1])
    worst = int(np.argmin(ps))
    p_marginal = min(1.0, m * ps[worst])
    p_hist, p_mean, w, shift = pit_tests(np.asarray(u).reshape(-1), alpha / 3)
    return GofResult(r, m, int(np.asarray(u).size), alpha, min(1.0, 3 * min(p_marginal, p_hist, p_mean)), p_marginal,
                     p_hist, p_mean, worst, w, shift, cats)


def detectable_w(df: int, n: int, level: float, power: float = POWER, draws: int = 20000, seed: int = 0) -> float:
    """The smallest Cohen w whose noncentral chi-square (df, lambda = n w^2) exceeds the central chi-square's
    (1 - level) quantile with probability ``power`` (Monte Carlo, seeded; bisection on lambda)."""
    if df < 1:
        return float("inf")       # one category only: nothing to tell apart
    rng = np.random.default_rng(seed)
    tail = max(int(round(50 / level)), 100000)
    crit = float(np.quantile(rng.chisquare(df, tail), 1.0 - level))
    lo, hi = 0.0, 4.0 * (crit + df)
    for _ in range(30):
        lam = 0.5 * (lo + hi)
        hit = (np.random.default_rng(seed + 1).noncentral_chisquare(df, lam, draws) > crit).mean()
        lo, hi = (lam, hi) if hit < power else (lo, lam)
    return float(np.sqrt(hi / n))
