"""The speculative loop, one owner for every (target, draft) pair.

    pass:  rows = [x, d_1 .. d_{R-1}]  at positions s .. s+R-1       (x = last emitted id)
           a    = target.verify(rows).argmax                          a[r] = next id after row r
           kept = 1 + |longest prefix with d_{r+1} == a[r]|
           emit a[:kept]  (the last one is the target's bonus id);  target.commit(kept);
           draft.accept(kept, taps of the kept rows)
The plain run is the same loop with no draft: one row per pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .metrics import Tally
from .timing import PhaseTimer


class Target(Protocol):
    device: torch.device

    def prefill(self, ids: list[int]): ...
    def verify(self, ids: list[int]): ...
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


def generate(target: Target, draft: Draft | None, prompt: list[int], n: int, width=None) -> Run:
    """Greedy decode n ids. ``width`` caps the verified rows (anchor + proposals) per pass: an int (fixed), or
    a width policy (``choose() -> k``, ``observe(k, kept, seconds)``, see ``bloomery_cli.width``) asked per
    window; k = 1 runs a plain pass without drafting. Only drafted windows enter the tally then."""
    if width is not None and hasattr(width, "choose"):
        return _generate_policy(target, draft, prompt, n, width)
    timer = PhaseTimer(target.device)
    tally = Tally()
    first = target.prefill(prompt)
    if draft is not None:
        draft.prompt(first.taps)
    out = [first.argmax[-1]]
    while len(out) < n:
        proposals: list[int] = []
        if draft is not None:
            with timer.phase("draft"):
                proposals = draft.propose(out[-1]).ids
            if width is not None:
                proposals = proposals[: max(width - 1, 0)]
        with timer.phase("verify"):
            v = target.verify([out[-1], *proposals])
        kept = kept_rows(proposals, v.argmax)
        with timer.phase("commit"):
            target.commit(kept)
            if draft is not None:
                draft.accept(kept, v.taps)
        out.extend(emitted_ids(v.argmax, kept))
        if draft is not None:
            tally.add(len(proposals), kept)
    tally.draft_s, tally.verify_s, tally.commit_s = (timer.seconds(p) for p in ("draft", "verify", "commit"))
    return Run(out[:n], tally)


def _generate_policy(target: Target, draft: Draft | None, prompt: list[int], n: int, policy) -> Run:
    """The loop above with a per-window width policy (walls measured around draft + verify: the argmax
    readback that ends a verify waits for the device)."""
    import time

    timer = PhaseTimer(target.device)
    tally = Tally()
    first = target.prefill(prompt)
    if draft is not None:
        draft.prompt(first.taps)
    out = [first.argmax[-1]]
    while len(out) < n:
        k = policy.choose() if draft is not None else 1
        proposals: list[int] = []
        t0 = time.perf_counter()
        if k > 1:
            with timer.phase("draft"):
                proposals = draft.propose(out[-1]).ids[: k - 1]
        with timer.phase("verify"):
            v = target.verify([out[-1], *proposals])
        seconds = time.perf_counter() - t0
        kept = kept_rows(proposals, v.argmax)
        with timer.phase("commit"):
            target.commit(kept)
            if draft is not None:
                draft.accept(kept, v.taps)
        out.extend(emitted_ids(v.argmax, kept))
        if draft is not None:
            policy.observe(len(proposals) + 1, kept, seconds)
        if proposals:
            tally.add(len(proposals), kept)
    tally.draft_s, tally.verify_s, tally.commit_s = (timer.seconds(p) for p in ("draft", "verify", "commit"))
    return Run(out[:n], tally)
