"""Speculative sampling checked exactly: the kernel's sampled runs replayed by a host transcription of the rule,
both driven by the same uniforms (common random numbers), compared id by id, window by window.

The stream and the order it is consumed in (the contract of ``sampling.SeededChoice``): run (seed, arm, i) draws
u_1, u_2, ... from PCG64(SeedSequence([seed, arm, i])), one ``random()`` per choice, in this order:

    the first id:            u -> x_0 = draw(p(prefill's last row))
    per window, k proposals: (q sampled only) u -> d_j = draw(q_j), j = 1..k, in row order
                             for j = 1..k:  u -> accept d_j  iff  u >= 1 - a_j,   a_j = min(1, p_j(d_j) / q_j(d_j))
                                            (q a point mass: a_j = p_j(d_j))
                                            at the first rejection: u -> x = draw(norm(max(p_j - q_j, 0))), stop
                             all accepted:  u -> bonus = draw(p_{k+1})
    draw(dist, u) = the first i with cumsum(dist)[i] > u   (dist a distribution: it sums to 1, never rescaled)

p_j = softmax(target logits_j / T) restricted to top-k / top-p (ties to the lower id), row j of the window's
verify (the anchor's row is j = 1); q_j the same over the draft's logits with T_d, top-k_d. The kernel side is
the loop's own ``Sampler`` (``speculative.generate``); the host side (``replay``) is written here apart from
``sampling/rule.py`` and takes, from the same run, only the logits the target and the draft returned (``Tape``), the
proposals and the emitted ids. The logits themselves are held to the float64 reference by the (r) and state
lines; this check holds the sampler: its distributions, its indexing of the verify rows, the order and number of
its draws. Both sides compute in float64 from the same logits, so the ids are equal; a differing draw whose u lies
within TOL of the cell it crosses (two float64 transcriptions a few ulps apart) is excused, and the replay of that
run stops there (its context is no longer shared).

Runs: every prompt at the gate's width (stream (seed, 5, i)) and, where the block proposes more than one id, at
width 2 (one proposal; stream (seed, 6, i)): at T = 1 on the fixtures a full window rarely accepts every proposal,
so the bonus rule is exercised by the width-2 runs (the bonus follows every accepted proposal there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..speculative import Run, generate

TOL = 1e-12            # a draw within this of a cell boundary may differ between the two float64 transcriptions
ARMS = (5, 6)          # the replay's streams: (seed, 5, i) at the gate's width, (seed, 6, i) at width 2


def host_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """logits [V] -> p [V] float64: z = logits / T; top_k: the k largest z by (value desc, id asc); softmax over
    them; top_p: walk the ids by (p desc, id asc) and keep each whose preceding mass is < top_p; renormalise."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    v = len(z)
    rank = sorted(range(v), key=lambda i: (-z[i], i)) if (top_k or top_p < 1.0) else None
    keep = np.ones(v, dtype=bool)
    if top_k:
        keep[:] = False
        keep[rank[:top_k]] = True
    m = z[keep].max()
    e = np.where(keep, np.exp(np.where(keep, z - m, 0.0)), 0.0)
    p = e / e.sum()
    if top_p < 1.0:
        inside = np.zeros(v, dtype=bool)
        before = 0.0
        for i in sorted(range(v), key=lambda i: (-p[i], i)):
            if p[i] == 0.0 or before >= top_p:
                break
            inside[i] = True
            before += p[i]
        p = np.where(inside, p, 0.0)
        p = p / p.sum()
    return p


@dataclass
class Drawn:
    index: int
    near: bool         # u within TOL of a boundary of the chosen cell


def draw(dist: np.ndarray, u: float) -> Drawn:
    """The first i with cumsum(dist)[i] > u (the last index if none)."""
    c = np.cumsum(dist)
    i = min(int(np.searchsorted(c, u, side="right")), len(dist) - 1)
    lo = c[i - 1] if i > 0 else 0.0
    return Drawn(i, bool(abs(u - lo) < TOL or abs(c[i] - u) < TOL))


class Tape:
    """Wraps the target and the draft of one run: keeps what they returned that the sampler reads (the prefill's
    last row, each verify's logits rows up to the rows kept, the draft's logits when it was asked for them) as
    float32 (exact for f32 / bf16 / f16 logits), and forwards everything else."""

    def __init__(self, target, draft):
        self.target, self.draft = TapedTarget(target), (TapedDraft(draft) if draft is not None else None)


class TapedTarget:
    def __init__(self, inner):
        self.inner, self.first, self.rows, self._last = inner, None, [], None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, ids, logits: bool = False):
        out = self.inner.prefill(ids, logits=logits)
        if logits:
            self.first = out.logits[-1].float().cpu().numpy()
        return out

    def verify(self, ids, logits: bool = False):
        out = self.inner.verify(ids, logits=logits)
        self._last = out.logits if logits else None
        return out

    def commit(self, kept: int) -> None:
        if self._last is not None:
            self.rows.append(self._last[:kept].float().cpu().numpy())
        self._last = None
        self.inner.commit(kept)


class TapedDraft:
    def __init__(self, inner):
        self.inner, self.logits = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor: int, detail: bool = False):
        if not detail:
            return self.inner.propose(anchor)
        out = self.inner.propose(anchor, detail=True)
        self.logits.append(out.logits.float().cpu().numpy())
        return out


@dataclass
class ReplayResult:
    runs: int = 0
    windows: int = 0            # windows compared
    ids: int = 0                # ids compared
    differ: int = 0             # runs whose replay met a differing id or kept count
    excused: int = 0            # of those, at a draw within TOL of a boundary
    first: list[str] = field(default_factory=list)   # where the unexcused ones differed (a few)


def replay(run: Run, tape: Tape, cond, stream: np.random.Generator) -> tuple[int, int, str | None, bool]:
    """The host rule over one taped run: (windows compared, ids compared, where it differed or None, excused)."""
    t, tk, tp = cond.temperature, cond.top_k, cond.top_p
    sampled_q = cond.draft_temperature is not None
    first = draw(host_probs(tape.target.first, t, tk, tp), stream.random())
    if first.index != run.emitted[0]:
        return 0, 0, f"first id: host {first.index} kernel {run.emitted[0]}", first.near
    pos, ids, q_at = 1, 1, 0
    for w, (proposals, kept) in enumerate(run.windows):
        rows = tape.target.rows[w]
        k = len(proposals)
        q = None
        near = False
        if sampled_q and k:
            qrows = tape.draft.logits[q_at]
            q_at += 1
            q = [host_probs(qrows[j], cond.draft_temperature, cond.draft_top_k) for j in range(k)]
            for j in range(k):
                d = draw(q[j], stream.random())
                if d.index != proposals[j]:
                    return w, ids, f"window {w} proposal {j + 1}: host {d.index} kernel {proposals[j]}", d.near
        out: list[int] = []
        for j, d in enumerate(proposals):
            if j >= len(rows):                        # the host accepts further than the kernel kept
                break
            p = host_probs(rows[j], t, tk, tp)
            a = min(1.0, p[d]) if q is None else (min(1.0, p[d] / q[j][d]) if q[j][d] > 0 else 1.0)
            u = stream.random()
            near = abs(u - (1.0 - a)) < TOL
            if u >= 1.0 - a:
                out.append(d)
                continue
            r = p.copy()
            if q is None:
                r[d] = 0.0
            else:
                r = np.maximum(p - q[j], 0.0)
            got = draw(r / r.sum(), stream.random())
            out.append(got.index)
            near = near or got.near
            break
        else:
            if k < len(rows):
                got = draw(host_probs(rows[k], t, tk, tp), stream.random())
                out.append(got.index)
                near = got.near
        kernel = run.emitted[pos:pos + kept]
        if out != kernel:
            return w, ids, f"window {w} of {k} proposals: host {out} kernel {kernel} (kept {kept})", near
        pos += kept
        ids += kept
    return len(run.windows), ids, None, False


def check_replay(engine, draft, prompts: list[list[int]], n: int, cond, width, block: int) -> ReplayResult:
    """Every prompt's taped drafted sampled runs (``ARMS``), each replayed by the host rule on its own stream."""
    from .rule import Sampler, SeededChoice

    res = ReplayResult()
    widths = [(ARMS[0], width)] + ([(ARMS[1], 2)] if block > 2 else [])
    for arm, wd in widths:
        for i, prompt in enumerate(prompts):
            tape = Tape(engine, draft)
            stream = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cond.seed, arm, i])))
            try:
                run = generate(tape.target, tape.draft, prompt, n, width=wd,
                               sampler=Sampler(cond, SeededChoice(cond.seed, arm, i)))
                windows, ids, where, near = replay(run, tape, cond, stream)
            except (RuntimeError, ValueError, IndexError) as e:      # a broken run or tape: a difference, never PASS
                windows, ids, where, near = 0, 0, f"broke: {type(e).__name__}: {e}", False
            res.runs += 1
            res.windows += windows
            res.ids += ids
            if where is not None:
                res.differ += 1
                res.excused += int(near)
                if not near and len(res.first) < 3:
                    res.first.append(f"stream ({cond.seed}, {arm}, {i}) {where}")
    return res
