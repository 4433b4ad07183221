"""The exact float64 proof that speculative sampling is lossless, on a toy vocabulary.

The law of a run's first n emitted ids is computed by replaying the one speculative loop
(``speculative.generate`` with a ``sampling.Sampler``) down every branch of its random choices:

    law(x_1..x_n) = sum over choice paths c that emit x_1..x_n of  prod_i dist_i(c_i) / sum(dist_i)

Each choice is a finite draw (accept / reject is the Bernoulli [1 - a, a], a residual, a bonus, a draft from q),
so this sum integrates every uniform exactly: no sampling, no tolerance beyond float64 rounding. The drafted law
must equal the plain loop's law and the direct product law prod_t p(x_t | prompt, x_<t) computed from the toy
target without the loop, to ~1e-15, for every q kind: point mass (block or chain drafts), full, top-k.

The toy target's logits for a context are a fixed random table of its last two ids and its length (so p changes
along the sequence); the toy drafts read the same context (the target's committed ids) with their own table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..speculative import generate
from .rule import Sampler, Sampling, process

DRAFT_KINDS = ("block", "chain")     # point-mass proposal structures: a DFlash-like block, an MTP-like chain


def law(program: Callable[[Callable[[np.ndarray], int]], tuple]) -> dict[tuple, float]:
    """Every outcome of ``program(choose)`` with its exact probability, by depth-first replay of its choices:
    a path runs the program with a script of choices to replay, branches at each new choice over every index of
    nonzero probability (the first taken, the others queued), and multiplies the normalised probabilities."""
    out: dict[tuple, float] = defaultdict(float)
    pending: list[tuple[int, ...]] = [()]
    while pending:
        script = pending.pop()
        trail: list[int] = []
        prob = [1.0]

        def choose(dist: np.ndarray, script=script, trail=trail, prob=prob) -> int:
            nz = np.flatnonzero(dist > 0)
            if len(trail) < len(script):
                c = script[len(trail)]
            else:
                c = int(nz[0])
                pending.extend(tuple(trail) + (int(alt),) for alt in nz[1:])
            trail.append(c)
            prob[0] *= float(dist[c] / dist.sum())
            return c

        out[program(choose)] += prob[0]
    return dict(out)


class Table:
    """Deterministic logits of a context: table[len(ctx) mod L, ctx[-2], ctx[-1]] -> [V] float64."""

    def __init__(self, vocab: int, seed: int, scale: float = 1.5, lengths: int = 16):
        g = np.random.default_rng(seed)
        self.t = g.normal(0.0, scale, (lengths, vocab, vocab, vocab))
        self.vocab = vocab

    def __call__(self, ctx: list[int]) -> np.ndarray:
        return self.t[len(ctx) % len(self.t), ctx[-2] if len(ctx) > 1 else 0, ctx[-1]]


@dataclass
class ToyPass:
    argmax: list[int]
    taps: torch.Tensor
    logits: torch.Tensor


@dataclass
class ToyTarget:
    """The Target protocol over a ``Table``: a cache of committed ids; verify rows see cache + rows[:r+1]."""

    table: Table
    device: torch.device = torch.device("cpu")
    cache: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    def _pass(self, ctxs: list[list[int]]) -> ToyPass:
        logits = torch.tensor(np.stack([self.table(c) for c in ctxs]), dtype=torch.float64)
        return ToyPass(logits.argmax(-1).tolist(), torch.zeros(1, len(ctxs), 1), logits)

    def prefill(self, ids: list[int], logits: bool = False) -> ToyPass:
        self.cache, self.rows = list(ids), []
        return self._pass([ids[: i + 1] for i in range(len(ids))])

    def verify(self, ids: list[int], logits: bool = False) -> ToyPass:
        self.rows = list(ids)
        return self._pass([self.cache + ids[: i + 1] for i in range(len(ids))])

    def commit(self, kept: int) -> None:
        self.cache += self.rows[:kept]


@dataclass
class ToyProposal:
    ids: list[int]
    logits: torch.Tensor


@dataclass
class ToyDraft:
    """The Draft protocol: ``block`` (every row from the context + anchor and its row index, like DFlash) or
    ``chain`` (row i from the context + anchor + the earlier drafts, like MTP / EAGLE-3 / the DSpark chain);
    ids are the argmax of each row (a deterministic proposal), logits the rows (q when sampled)."""

    target: ToyTarget
    table: Table
    kind: str = "block"
    block: int = 3

    def prompt(self, taps) -> None:
        pass

    def accept(self, kept: int, taps) -> None:
        pass

    def propose(self, anchor: int, detail: bool = False) -> ToyProposal:
        ctx, ids, rows = self.target.cache + [anchor], [], []
        for i in range(self.block - 1):
            row = self.table(ctx + ids) if self.kind == "chain" else self.table(ctx + [i] * (i + 1))
            rows.append(row)
            ids.append(int(np.argmax(row)))
        return ToyProposal(ids, torch.tensor(np.stack(rows), dtype=torch.float64))


def product_law(table: Table, cond: Sampling, prompt: list[int], n: int) -> dict[tuple, float]:
    """The target's own law of n sampled ids, prod_t p(x_t | prompt, x_<t), without the loop."""
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in out.items():
            p = process(table(prompt + list(seq))[None], cond.temperature, cond.top_k, cond.top_p)[0]
            for x in np.flatnonzero(p > 0):
                nxt[seq + (int(x),)] = pr * p[x]
        out = nxt
    return out


def run_law(target: ToyTarget, draft: ToyDraft | None, cond: Sampling, prompt: list[int], n: int,
            width: int | None = None) -> dict[tuple, float]:
    """The loop's exact law of its first n emitted ids (``draft`` None: the plain run)."""
    return law(lambda choose: tuple(generate(target, draft, prompt, n, width=width,
                                             sampler=Sampler(cond, choose)).ids))


def max_gap(a: dict[tuple, float], b: dict[tuple, float]) -> float:
    """max over sequences of |a - b| (a sequence missing from one side counts with probability 0)."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@dataclass(frozen=True)
class Proof:
    drafted_vs_product: float
    plain_vs_product: float
    mass: float
    sequences: int


def prove(cond: Sampling, kind: str = "block", vocab: int = 4, block: int = 3, n: int = 4,
          prompt: tuple[int, ...] = (1, 2), width: int | None = None, seed: int = 0) -> Proof:
    """The drafted and plain laws against the product law, on a toy target and draft of ``vocab`` ids."""
    target_table, draft_table = Table(vocab, seed), Table(vocab, seed + 1)
    target = ToyTarget(target_table)
    draft = ToyDraft(target, draft_table, kind, block)
    direct = product_law(target_table, cond, list(prompt), n)
    drafted = run_law(target, draft, cond, list(prompt), n, width)
    plain = run_law(target, None, cond, list(prompt), n)
    return Proof(max_gap(drafted, direct), max_gap(plain, direct), sum(drafted.values()), len(drafted))
