"""The speculative loop, one owner for every (target, draft) pair.

    pass:  rows = [x, d_1 .. d_{R-1}]  at positions s .. s+R-1       (x = last emitted id)
           a    = target.verify(rows).argmax                          a[r] = next id after row r
           kept = 1 + |longest prefix with d_{r+1} == a[r]|
           emit a[:kept]  (the last one is the target's bonus id);  target.commit(kept);
           draft.accept(kept, taps of the kept rows)
The plain run is the same loop with no draft: one row per pass.
At T > 0 (a ``Sampler``) the same loop verifies with logits and emits by the sampling rule
(``bloomery_cli.sampling.rule``): accept d_j w.p. min(1, p/q), the first rejection resampled from the residual,
the bonus drawn from p; kept counts the rows it keeps exactly as in the greedy rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .metrics import Tally
from .timing import PhaseTimer


class Target(Protocol):
    device: torch.device

    def prefill(self, ids: list[int], logits: bool = False): ...
    def verify(self, ids: list[int], logits: bool = False): ...
    def commit(self, kept: int) -> None: ...


class Draft(Protocol):
    def prompt(self, taps: torch.Tensor) -> None: ...
    def propose(self, anchor: int): ...
    def accept(self, kept: int, taps: torch.Tensor) -> None: ...


def emitted_ids(argmax: list[int], kept: int) -> list[int]:
    """The ids a window emits: the target's argmax of every kept row, the bonus (last) one included."""
    return argmax[:kept]


def kept_rows(proposals: list[int], argmax: list[int]) -> int:
    """1 + the longest prefix r with proposals[r] == argmax[r]."""
    k = 0
    while k < len(proposals) and proposals[k] == argmax[k]:
        k += 1
    return k + 1


@dataclass
class Run:
    ids: list[int]        # the first n emitted ids (the prompt excluded)
    tally: Tally
    emitted: list[int] = field(default_factory=list)   # every emitted id; the cache holds prompt + emitted[:-1]
    windows: list[tuple[list[int], int]] = field(default_factory=list)   # per verify pass: (proposed ids, kept)


class FixedWidth:
    """The gates' policy: every proposal the draft makes (``width`` None), or at most ``width`` - 1 of them."""

    def __init__(self, width: int | None = None):
        self.width = width

    def choose(self) -> int:
        return self.width if self.width is not None else 1 << 30

    def observe(self, k: int, kept: int, seconds: float) -> None:
        pass


def generate(target: Target, draft: Draft | None, prompt: list[int], n: int, width=None,
             stop: Callable[[Tally], bool] | None = None, sampler=None) -> Run:
    """Decode n ids: greedy, or sampled with ``sampler`` (a ``bloomery_cli.sampling.rule.Sampler``). ``width`` caps
    the verified rows (anchor + proposals) per pass: None (all), an int,
    or a width policy (``choose() -> k``, ``observe(k, kept, seconds)``, see ``bloomery_cli.width``) asked per
    window; k = 1 runs a plain pass without drafting. Only windows that drafted enter the tally. Walls for the
    policy are taken around draft + verify (the argmax readback that ends a verify waits for the device).
    ``stop(tally)``, asked after each window, may end the run early (``Run.emitted`` then holds what it emitted)."""
    policy = width if hasattr(width, "choose") else FixedWidth(width)
    timer = PhaseTimer(target.device, getattr(draft, "device", None))
    crossing = getattr(draft, "take_crossing", None)         # a draft on its own device (``draft_device``)
    if crossing is not None:
        crossing()
    tally = Tally()
    windows: list[tuple[list[int], int]] = []
    sampled = sampler is not None
    first = target.prefill(prompt, logits=True) if sampled else target.prefill(prompt)
    if draft is not None:
        draft.prompt(first.taps)
    out = [sampler.first(first.logits) if sampled else first.argmax[-1]]
    while len(out) < n:
        k = policy.choose() if draft is not None else 1
        proposals: list[int] = []
        q_rows: list = []
        t0 = time.perf_counter()
        if k > 1:
            with timer.phase("draft"):
                if sampled:
                    proposals, q_rows = sampler.proposals(draft, out[-1], k - 1)
                else:
                    proposals = draft.propose(out[-1]).ids[: k - 1]
        with timer.phase("verify"):
            v = target.verify([out[-1], *proposals], logits=True) if sampled else target.verify([out[-1], *proposals])
        seconds = time.perf_counter() - t0
        if sampled:
            kept, emitted = sampler.window(v.logits, proposals, q_rows)
            if not emitted:
                raise ValueError(f"a sampled window kept {kept} rows and emitted no id")
        else:
            kept = kept_rows(proposals, v.argmax)
            emitted = emitted_ids(v.argmax, kept)
        with timer.phase("commit"):
            target.commit(kept)
            if draft is not None:
                draft.accept(kept, v.taps)
        out.extend(emitted)
        if draft is not None:
            policy.observe(len(proposals) + 1, kept, seconds)
        windows.append((list(proposals), kept))
        if proposals:
            tally.add(len(proposals), kept)
        if stop is not None and stop(tally):
            break
    tally.draft_s, tally.verify_s, tally.commit_s = (timer.seconds(p) for p in ("draft", "verify", "commit"))
    if crossing is not None:                                 # the taps' crossing ran inside commit: report it apart
        c = crossing()
        tally.transfer_s, tally.transfer_bytes, tally.transfer_windows = c.seconds, c.bytes, c.windows
        tally.commit_s = max(tally.commit_s - c.seconds, 0.0)
    return Run(out[:n], tally, out, windows)
