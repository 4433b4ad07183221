"""Width policies: how many ids (the anchor plus proposals) a pass verifies, decided per window.

- ``fixed`` (gates): every proposal the draft makes, as the loop always did (``width_policy("fixed")`` is None).
- ``cost`` (serving, benches): the width k with the best expected emitted ids per second,

      E(k)    = 1 + sum_{j=1}^{k-1} prod_{i<=j} a_i      a_i: running conditional acceptance of proposal i
      cost(k) = median wall of the last 8 windows that verified k ids (draft time included when k > 1)
      k*      = argmax_{k>=2} E(k) / cost(k);   the draft opens only when E(k*)/cost(k*) > 1.03 / cost(1),
                else the pass is plain (k = 1, the draft is not run; its context still follows)

  Widths 1 and max_width are measured twice first; a width never measured borrows the cost of the nearest
  measured one (drafted from drafted); every ``probe_every`` windows a probe runs instead of the choice,
  alternately the other side (plain when drafting, the best drafted width when plain) and the least recently
  seen width, so the costs and the acceptance stay current. The policy only
  changes which rows run: the emitted ids are the target's argmax either way (the gate proves it).
"""

from __future__ import annotations

import statistics
from collections import deque


class CostWidth:
    """Per-window width choice from measured cost and running acceptance. ``choose()`` -> k in 1..max_width;
    after the pass, ``observe(k, kept, seconds)``."""

    def __init__(self, max_width: int, margin: float = 1.03, probe_every: int = 8, keep: int = 8,
                 prior: float = 0.5, forget: float = 0.98):
        if max_width < 1:
            raise ValueError(f"max_width {max_width}: need at least 1")
        self.max_width, self.margin, self.probe_every = max_width, margin, probe_every
        self.walls: dict[int, deque[float]] = {k: deque(maxlen=keep) for k in range(1, max_width + 1)}
        self.hits = [prior] * max_width          # discounted counts: proposal i accepted ...
        self.tries = [1.0] * max_width           # ... out of windows that reached proposal i
        self.forget = forget
        self.windows = 0
        self.last_seen = {k: -1 for k in range(1, max_width + 1)}
        self.chosen: list[int] = []

    # --- the model
    def accept_rates(self) -> list[float]:
        return [h / t for h, t in zip(self.hits, self.tries, strict=True)]

    def expected(self, k: int) -> float:
        """E(k): expected emitted ids of a pass that verifies k ids (anchor + k-1 proposals)."""
        e, p = 1.0, 1.0
        for a in self.accept_rates()[: k - 1]:
            p *= a
            e += p
        return e

    def cost(self, k: int) -> float | None:
        if self.walls[k]:
            return statistics.median(self.walls[k])
        known = [j for j in self.walls if self.walls[j] and (j > 1) == (k > 1)] or \
            [j for j in self.walls if self.walls[j]]
        if not known:
            return None
        near = min(known, key=lambda j: (abs(j - k), -j))
        return statistics.median(self.walls[near])

    def best(self) -> int:
        """The width the model prefers now (1 = plain)."""
        c1 = self.cost(1)
        rates = {k: self.expected(k) / c for k in range(2, self.max_width + 1) if (c := self.cost(k))}
        if not rates or c1 is None:
            return self.max_width
        k = max(rates, key=lambda j: (rates[j], j))
        return k if rates[k] > self.margin / c1 else 1

    # --- the loop's side
    def choose(self) -> int:
        ends = (1, self.max_width)
        unmeasured = [k for k in ends if len(self.walls[k]) < 2]
        best = self.best()
        if unmeasured:
            k = unmeasured[0]
        elif self.probe_every and self.windows % self.probe_every == self.probe_every - 1:
            probe = self.windows // self.probe_every
            if probe % 2:                                  # the least recently seen width
                k = min(self.last_seen, key=lambda j: (self.last_seen[j], j))
            elif best == 1:                                # the alternative: the best drafted width, or plain
                k = max(range(2, self.max_width + 1), key=lambda j: self.expected(j) / (self.cost(j) or 1.0),
                        default=1)
            else:
                k = 1
        else:
            k = best
        self.chosen.append(k)
        return k

    def observe(self, k: int, kept: int, seconds: float) -> None:
        """A pass verified k ids (k-1 proposals) and kept ``kept`` rows in ``seconds`` (draft included)."""
        self.walls[k].append(seconds)
        self.last_seen[k] = self.windows
        self.windows += 1
        for i in range(min(k - 1, kept)):               # proposal i+1 was reached: the first i were kept
            self.hits[i] = self.hits[i] * self.forget + (1.0 if kept > i + 1 else 0.0)
            self.tries[i] = self.tries[i] * self.forget + 1.0

    def histogram(self) -> list[int]:
        """[k-1] = windows that verified k ids."""
        return [self.chosen.count(k) for k in range(1, self.max_width + 1)]


WIDTHS = ("fixed", "cost")


def width_policy(name: str, max_width: int):
    """None for ``fixed`` (the loop's default: all proposals), a fresh ``CostWidth`` for ``cost``."""
    if name == "fixed":
        return None
    if name == "cost":
        return CostWidth(max_width)
    raise ValueError(f"width policy {name!r}: expected one of {', '.join(WIDTHS)}")
