"""Plain decode with the host off the critical path: K committed one-row steps per CUDA graph replay (issue 27).

An engine that chains owns ``ChainBufs`` (``chain``) and a graph-safe ``_chain_pass(k)``: K steps, step j reading
its id from ``chain.ids[j]`` and writing its argmax into ``chain.ids[j + 1]``, its position ``chain.p0`` advanced
by one per step, each step committed (KV rows by position; a hybrid's recurrent state and conv tail advanced), and
finally ``chain.ids[0] <- chain.ids[k]`` so the next replay continues. ``decode_plain`` (below) drives it:

    replays  n = q K + m ids: q replays of the K-step graph, then one of the m-step graph (exact: a recurrent state
             must not run past the n-th id, so no replay overshoots; an attention-only engine's overshoot would
             only write KV past the committed length, but one rule serves both)
    host     replay i's ids are copied to a pinned host row on the stream and read only after replay i + 1 has
             been queued, so the device never waits on the host and the host reads ids once per K
    capture  a graph's warm-up runs execute the pass: they advance the state, so ``ChainBufs.keep`` (the engine's
             committed state tensors) is saved before and put back after; the inputs are staged again after it

On CPU (no graphs) the same passes run eagerly: the ids are the plain loop's bit for bit (tests/test_chain.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from .graphs import GraphSet, Staged, held

MAX_K = 64


class ChainBufs:
    """The chain's device inputs: ``ids`` [1 + MAX_K] (the step's id, then each step's argmax), ``p0`` [1] the next
    step's position, ``staged`` [p0, first] from the host; ``graphs`` one graph per step count; ``keep()`` the
    committed state a capture's warm-ups change (restored after)."""

    def __init__(self, fn: Callable[[int], None], device: torch.device, graphs: bool,
                 keep: Callable[[], tuple[torch.Tensor, ...]] = tuple, p0: torch.Tensor | None = None):
        self.ids = torch.zeros(1 + MAX_K, dtype=torch.long, device=device)
        self.p0 = torch.zeros(1, dtype=torch.long, device=device) if p0 is None else p0   # [1] (a view: WindowBufs)
        self.staged = Staged(2, device)
        self.graphs = GraphSet(fn, device, enabled=graphs)
        self._keep = held(keep)                         # an engine's bound method held weakly (graphs.held)

    def keep(self) -> tuple[torch.Tensor, ...]:
        return self._keep()()

    def stage(self, p0: int, first: int) -> None:
        self.staged.put([p0, first])
        self.p0.copy_(self.staged.dev[:1])
        self.ids[:1].copy_(self.staged.dev[1:2])

    def capture(self, k: int, p0: int, first: int) -> None:
        saved = [t.clone() for t in self.keep()]
        self.graphs.capture(k)
        for t, s in zip(self.keep(), saved, strict=True):
            t.copy_(s)
        self.stage(p0, first)


class Chains(Protocol):
    chain: ChainBufs
    device: torch.device
    length: int
    cap: int


def decode_plain(engine: Chains, first: int, n: int, k: int) -> list[int]:
    """The next n greedy ids after ``first`` (the last pass's argmax, at position ``engine.length``), committed, K
    steps a replay (module docstring). ``engine.length`` advances by n."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"chain of {k} steps: 1..{MAX_K}")
    if n < 1:
        raise ValueError(f"a chain of {n} ids: at least 1")
    end = engine.length + max(n, 2 * k)                     # a capture's 2 warm-up runs write KV up to 2K rows ahead
    if end > engine.cap:
        raise ValueError(f"KV cache of {engine.cap} positions is full (chain ends at {end})")
    c, cuda = engine.chain, engine.device.type == "cuda"
    sizes = [k] * (n // k) + ([n % k] if n % k else [])
    c.stage(engine.length, first)
    for s in sorted(set(sizes)):
        if c.graphs.enabled and s not in c.graphs.graphs:
            c.capture(s, engine.length, first)
    host = torch.zeros(len(sizes), k, dtype=torch.long, pin_memory=cuda)
    done: list[torch.cuda.Event] = []
    ids: list[int] = []
    for i, s in enumerate(sizes):
        c.graphs.run(s)
        host[i, :s].copy_(c.ids[1:s + 1], non_blocking=cuda)
        if cuda:
            done.append(torch.cuda.Event())
            done[-1].record()
        if i:                                               # the previous replay's ids, read while this one runs
            if cuda:
                done[i - 1].synchronize()
            ids += host[i - 1, :sizes[i - 1]].tolist()
    if cuda:
        done[-1].synchronize()
    ids += host[-1, :sizes[-1]].tolist()
    engine.length += n
    return ids
