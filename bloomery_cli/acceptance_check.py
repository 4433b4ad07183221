"""Acceptance consistency: the printed figures re-derived from the emitted ids and the window boundaries.

A run holds ``emitted`` (every id it emitted, e_0 the prefill's) and per verify pass the proposals d_1..d_k. A
window that starts at emitted index s kept

    kept = 1 + max{ m <= k : d_r == e_{s+r} for every r < m }                                  (1)

rows: its accepted drafts are emitted as themselves, and the id it emits after them is never the next proposal
(greedy: a[kept-1] != d_kept by the argmax rule; sampled: a rejection draws from norm(max(p - q, 0)), which is 0 at
d since the rejection means p(d) < q(d), and with q a point mass it removes d). The next window starts at
s + kept; the last one must end at len(emitted). From the kept of every drafted window (k >= 1), pooled over the
runs:

    accept_mean = sum kept / W ;  kept=[h_1, ...] with h_i = #{kept = i}
    pos_accept[i] = #{k > i, kept > i+1} / #{k > i} ;  pos_accept_cond[i] = #{k > i, kept > i+1} / #{k > i, kept > i}

each a ratio of integers, compared with the Tally's figures exactly (both are the correctly rounded float of the
same rational). A run's recorded kept that disagrees with (1), a boundary past the end, or any figure that differs
fails the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .metrics import Tally


@dataclass
class Rederived:
    """Drafted windows re-derived from ids: (proposed, kept) pairs and what disagreed on the way."""

    proposed: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    ids: int = 0
    problems: list[str] = field(default_factory=list)


def kept_from_ids(proposals: list[int], emitted: list[int], start: int) -> int:
    """(1): 1 + the longest prefix of the proposals emitted as themselves from ``start`` on."""
    m = 0
    while m < len(proposals) and start + m < len(emitted) and proposals[m] == emitted[start + m]:
        m += 1
    return m + 1


def rederive(runs) -> Rederived:
    """Every run's windows (``speculative.Run``: ``windows`` [(proposals, kept)], ``emitted``) re-derived by (1)."""
    out = Rederived()
    for i, run in enumerate(runs):
        pos = 1                                     # e_0 is drawn from the prefill, before any window
        for w, (proposals, recorded) in enumerate(run.windows):
            kept = kept_from_ids(list(proposals), run.emitted, pos)
            if kept != recorded:
                out.problems.append(f"run {i} window {w}: ids give kept {kept}, the loop recorded {recorded}")
            if proposals:
                out.proposed.append(len(proposals))
                out.kept.append(kept)
            pos += kept
        if pos != len(run.emitted):
            out.problems.append(f"run {i}: windows end at id {pos}, {len(run.emitted)} emitted")
        out.ids += len(run.emitted)
    return out


def figures(proposed: list[int], kept: list[int]) -> dict[str, object]:
    """accept_mean, the kept histogram and both per-position rates as exact rationals (written apart from Tally)."""
    w = len(kept)
    hist = [0] * max(kept, default=1)
    for k in kept:
        hist[k - 1] += 1
    pos, cond = [], []
    for i in range(max(proposed, default=0)):
        asked = [k for p, k in zip(proposed, kept, strict=True) if p > i]
        reached = [k for k in asked if k > i]
        hit = sum(1 for k in asked if k > i + 1)
        pos.append(Fraction(hit, len(asked)) if asked else Fraction(0))
        cond.append(Fraction(hit, len(reached)) if reached else Fraction(0))
    return {"accept_mean": Fraction(sum(kept), w) if w else Fraction(0), "kept": hist,
            "pos_accept": pos, "pos_accept_cond": cond}


def tally_figures(t: Tally) -> dict[str, object]:
    return {"accept_mean": t.accept_mean, "kept": t.histogram(), "pos_accept": t.pos_accept(),
            "pos_accept_cond": t.pos_accept_cond()}


def as_floats(x: object) -> object:
    if isinstance(x, Fraction):
        return float(x)
    if isinstance(x, list):
        return [as_floats(v) for v in x]
    return x


def compare(runs, pooled: Tally) -> tuple[Rederived, list[str]]:
    """(the re-derivation, the names of the figures or windows that differ); no drafted window at all is a
    difference (nothing to check is not a PASS)."""
    got = rederive(runs)
    bad = list(got.problems)
    if not got.kept:
        bad.append("no drafted window")
    want = tally_figures(pooled)
    mine = figures(got.proposed, got.kept)
    bad += [name for name in want if as_floats(mine[name]) != want[name]]
    return got, bad
