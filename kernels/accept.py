"""Drafted decode with the host off the critical path: device-side accept and rollback (issue 27).

``speculative.generate`` decides each window on the host (the verify's argmax read back with ``.tolist()``). Here a
window is one device pass (one CUDA graph replay per width R on CUDA), and the host reads window i's ids only after
window i + 1 has been queued. A window of R rows (all [.] device tensors; nothing read back inside it):

    rows    ids[0] = x (the anchor: the last emitted id), ids[1:R] = d = draft.propose_dev(p0, x, cnt, w, R-1) [R-1]
    verify  a = engine.rows_pass(ids[:R], p0)        a [R]: a[r] = the target's argmax after row r (positions p0 + r)
    accept  kept = (1 + sum_r prod_{j<=r} [d[j] == a[j]]) * live      (``kept_dev``: 1 + the longest prefix where
            proposal[r] == argmax[r-1] in window rows), live = cnt < n (a window past the n-th id keeps nothing)
    commit  engine.commit_dev(kept, R): KV rows by position (nothing to do); a hybrid's recurrent state replayed
            over the R rows with g = b = 0 on rows >= kept (an identity update: the state after row kept-1) and
            its conv tail gathered at rows kept..kept+K-2 (by index, on the device);
            draft.accept_dev(p0, R, kept) (a block draft's context of the window's rows, rows past kept beyond it;
            a chained draft's real rows and its next proposals)
    out     out = [kept, a[0..R-1], d[0..R-2]]   (the host keeps a[:kept]: ``speculative.emitted_ids``)
    next    ids[0] <- a[kept-1] (``next_anchor``), p0 += kept, cnt += kept, w += 1
            (accept, out and next: ~18 torch launches, or two Triton ones on CUDA: ``triton.window``)

``DeviceAccept.run(first, n)`` drives it: after queueing window i it copies ``out`` to a pinned host row (on the
stream, non-blocking) and reads window i-1's row once its event is done. A window is queued only while the windows
in flight cannot already reach the n-th id (each emits at most R), so near the end the host waits for the last one
instead of running a window too many: the committed state after the loop is ``generate``'s. Same semantics as
``generate`` with a fixed width R and a draft proposing R-1 ids: the emitted ids, the windows (proposals, kept),
the KV rows and the hybrid's state equal its bit for bit (tests/test_accept.py, CPU; on CUDA when present).

Capture: a graph's warm-up runs execute the window (they advance p0, cnt, w, a hybrid's state and a chained draft's
next proposals), so the engine's ``chain.keep()``, the draft's ``keep()`` and the counters are saved before and put
back after (``ChainBufs.capture``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import triton as ktriton
from .chain import MAX_K, ChainBufs
from .graphs import Staged

T = torch.Tensor


def kept_dev(props: T, argmax: T) -> T:
    """props [R-1], argmax [R] -> kept [1] (long): 1 + the longest prefix r with props[r] == argmax[r]."""
    hit = (props == argmax[:props.shape[0]]).long()
    return (hit.cumprod(0).sum(0, keepdim=True) if props.shape[0] else hit.new_zeros(1)) + 1


def next_anchor(argmax: T, kept: T) -> T:
    """argmax [R], kept [1] -> [1]: the last emitted id a[kept-1] (a[0] for a window that kept nothing)."""
    return argmax.index_select(0, (kept - 1).clamp(min=0))


class Accepts(Protocol):
    """An engine the device loop drives (``FastQwen3Target``, ``FastQwen38Target``)."""

    chain: ChainBufs
    device: torch.device
    length: int
    cap: int
    max_width: int

    def rows_pass(self, ids: T, p0: T) -> T: ...
    def commit_dev(self, kept: T, r: int) -> None: ...


class DraftsDev(Protocol):
    """A draft on the device (``kernels.accept_drafts``): ``start`` (its prompt) and ``prime`` (a chained draft's
    first propose) on the host, graph-safe propose / accept, ``sync`` after the loop, ``keep`` the tensors a window
    changes that a capture must put back."""

    def start(self, taps: T) -> None: ...
    def prime(self, first: int) -> None: ...
    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T: ...
    def accept_dev(self, p0: T, r: int, kept: T) -> None: ...
    def sync(self, length: int) -> None: ...
    def keep(self) -> tuple[T, ...]: ...


class WindowBufs(ChainBufs):
    """``ChainBufs`` (ids: anchor then proposals, p0, the window graphs) plus the counters ``cnt`` (ids emitted so
    far, the first included), ``w`` (windows run), ``n`` (ids wanted) and ``out`` [1 + 2 MAX_K]."""

    def __init__(self, fn, device: torch.device, graphs: bool, keep):
        vals = torch.zeros(4, dtype=torch.long, device=device)              # p0, cnt, w, n: one copy from the host
        super().__init__(fn, device, graphs, keep=keep, p0=vals[:1])
        self.device, self.vals = device, vals
        self.cnt, self.w, self.n = (vals[i:i + 1] for i in range(1, 4))
        self.counters = Staged(5, device)
        self.out = torch.zeros(1 + 2 * MAX_K, dtype=torch.long, device=device)
        self.host: torch.Tensor | None = None

    def keep(self) -> tuple[torch.Tensor, ...]:
        return (*super().keep(), self.cnt, self.w)

    def start(self, p0: int, first: int, n: int) -> None:
        """The first anchor, p0 and the counters (cnt 1, w 0, n) from the host: one staged copy and two device
        copies (a run's set-up is host time before its first window)."""
        self.counters.put([first, p0, 1, 0, n])
        self.ids[:1].copy_(self.counters.dev[:1])
        self.vals.copy_(self.counters.dev[1:])

    def rows_host(self, n: int, r: int) -> torch.Tensor:
        """A host buffer [>= n, 2r] for the windows' out rows (pinned on CUDA), kept from run to run: a pinned
        allocation at each run's start was host time before its first window. Every row is written before it is
        read, and a run has read every row it queued before it returns."""
        if self.host is None or self.host.shape[0] < n or self.host.shape[1] != 2 * r:
            self.host = torch.empty(n, 2 * r, dtype=torch.long, pin_memory=self.device.type == "cuda")
        return self.host


@dataclass
class DeviceRun:
    ids: list[int]                                  # the first n emitted ids
    emitted: list[int]                              # every emitted id (the first included)
    windows: list[tuple[list[int], int]] = field(default_factory=list)    # (proposals, kept) per window
    events: list = field(default_factory=list)      # CUDA: a timing event after each window's out row (benches)
    launched: torch.cuda.Event | None = None        # CUDA: a timing event queued just before the first window


class DeviceAccept:
    """The drafted loop of ``engine`` and ``draft`` at a fixed width ``r`` (module docstring); on CUDA one graph per
    width, captured on first use. ``run`` may be called again (a new prefill in between); the graphs stay valid as
    long as the draft's device buffers do (``SyntheticDraft.load`` refills them in place)."""

    def __init__(self, engine: Accepts, draft: DraftsDev, graphs: bool = True, fused: bool | None = None):
        self.engine, self.draft = engine, draft
        self.bufs = WindowBufs(self._window, engine.device, graphs, lambda: (*engine.chain.keep(), *draft.keep()))
        # the bookkeeping in two Triton launches (``triton.window``; default: where impl "auto" takes Triton)
        self.fused = ktriton.resolve_impl("auto", engine.device) == "triton" if fused is None else fused
        self.kept_buf = torch.zeros(1, dtype=torch.long, device=engine.device)

    def _window(self, r: int) -> None:
        c, e = self.bufs, self.engine
        if r > 1:
            c.ids[1:r].copy_(self.draft.propose_dev(c.p0, c.ids[:1], c.cnt, c.w, r - 1))
        a = e.rows_pass(c.ids[:r], c.p0)
        kept = self._kept(a, r)
        e.commit_dev(kept, r)
        self.draft.accept_dev(c.p0, r, kept)
        self._tail(a, kept, r)

    def _kept(self, a: T, r: int) -> T:
        """kept [1]: the acceptance decision of the window's argmax a [R] (module docstring)."""
        c = self.bufs
        if self.fused:
            from .triton import window
            return window.kept(c.ids, a, c.cnt, c.n, self.kept_buf)
        return kept_dev(c.ids[1:r], a) * (c.cnt < c.n).long()

    def _tail(self, a: T, kept: T, r: int) -> None:
        """The window's out row, the next anchor and the counters (module docstring)."""
        c = self.bufs
        if self.fused:
            from .triton import window
            window.tail(c.ids, a, kept, c.out, c.p0, c.cnt, c.w)
            return
        c.out[:1].copy_(kept)
        c.out[1:1 + r].copy_(a)
        c.out[1 + r:2 * r].copy_(c.ids[1:r])
        c.ids[:1].copy_(next_anchor(a, kept))
        c.p0.add_(kept)
        c.cnt.add_(kept)
        c.w.add_(1)

    def generate(self, prompt: list[int], n: int, r: int, mark=lambda: None, primed=lambda: None) -> DeviceRun:
        """``speculative.generate``'s loop on the device: prefill, the draft's prompt, ``mark()`` (a bench's clock:
        ``bench.timed_generate`` starts there too), the draft's first propose, ``primed()``, then ``run``."""
        first = self.engine.prefill(prompt)
        self.draft.start(first.taps)
        mark()
        self.draft.prime(first.argmax[-1])
        primed()
        return self.run(first.argmax[-1], n, r)

    def run(self, first: int, n: int, r: int) -> DeviceRun:
        """The next ids after ``first`` (the prefill's last argmax, at position ``engine.length``) until n ids (the
        first included) are emitted, in windows of r rows; ``engine.length`` advances by what was kept."""
        e, c = self.engine, self.bufs
        if not 1 <= r <= min(MAX_K, e.max_width):
            raise ValueError(f"a window of {r} rows: 1..{min(MAX_K, e.max_width)}")
        if n < 1:
            raise ValueError(f"a run of {n} ids: at least 1")
        end = e.length + max(n + r, 3 * r)              # the last window's rows; a capture's warm-ups run 2 windows
        if end > e.cap:
            raise ValueError(f"KV cache of {e.cap} positions is full (the loop may reach {end})")
        cuda = e.device.type == "cuda"
        c.start(e.length, first, n)
        if c.graphs.enabled and r not in c.graphs.graphs:
            c.capture(r, e.length, first)
            c.start(e.length, first, n)
        host = c.rows_host(n, r)
        events: list = []
        launched = None
        if cuda:
            launched = torch.cuda.Event(enable_timing=True)
            launched.record()
        pending: deque[int] = deque()
        out, windows, queued = [first], [], 0
        while len(out) < n or pending:
            more = len(out) + len(pending) * r < n            # the windows in flight cannot reach n: one more is due
            if more:
                c.graphs.run(r)
                host[queued].copy_(c.out[:2 * r], non_blocking=cuda)
                if cuda:
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record()
                pending.append(queued)
                queued += 1
            if pending and (not more or len(pending) > 1):    # read the oldest while a newer one runs
                i = pending.popleft()
                if cuda:
                    events[i].synchronize()
                row = host[i].tolist()
                kept = row[0]
                if not 1 <= kept <= r:
                    raise RuntimeError(f"window {i} kept {kept} rows of {r}: a live window keeps 1..R")
                out += row[1:1 + kept]
                windows.append((row[1 + r:2 * r], kept))
        e.length += len(out) - 1
        self.draft.sync(e.length)
        return DeviceRun(out[:n], out, windows, events, launched)
