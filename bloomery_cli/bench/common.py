"""What the benches share (``bloomery bench``: ``bench`` for the dense pair, ``bench_hybrid`` for the hybrid
shapes; ``results_table`` reads the criterion): the run dtypes, the acceptance sweep's taus and its replay draft,
the timed decode, the engine fallback, issue 11's criterion and its bound, HF transformers' comparison."""

from __future__ import annotations

import gc
import sys
import time
from contextlib import contextmanager
from typing import Any

import torch

from bloomery_gates.dtypes import TORCH

from ..speculative import generate
from .shapes import hf_decode

DTYPES = TORCH          # bloomery_gates.dtypes, the one table
TAUS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
CRITERION = 0.85                # drafted tok/s >= CRITERION x accept_mean x plain at tau 6 (issue 11)


@contextmanager
def stages(total: int, quiet: bool):
    """A transient rich progress bar over the bench's stages; silent when ``quiet`` or stdout is not a tty."""
    if quiet or not sys.stdout.isatty():
        yield lambda what: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("bench", total=total)
        yield lambda what: bar.update(task, advance=1, description=what)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def accept_for_tau(tau: float, block: int) -> float:
    """a with sum_{j=0}^{B-1} a^j = tau (1 <= tau <= B)."""
    if tau >= block:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** j for j in range(block)) < tau else (lo, mid)
    return (lo + hi) / 2


class ReplayDraft:
    """Runs ``inner`` (so its cost is real), then proposes ``ref`` (the target's own continuation; ref[i] is the
    i-th emitted id) with each proposal right with probability ``a``, else ref + 1."""

    def __init__(self, inner, ref: list[int], a: float, vocab: int, seed: int = 0):
        import random

        self.inner, self.ref, self.a, self.vocab = inner, ref, a, vocab
        self.rng, self.i, self.off_track = random.Random(seed), 0, 0

    def prompt(self, taps) -> None:
        self.inner.prompt(taps)
        self.i = 0

    def propose(self, anchor: int):
        from bloomery_gates.kernels.drafts.dflash import Proposal

        n = len(self.inner.propose(anchor).ids)
        self.off_track += anchor != self.ref[min(self.i, len(self.ref) - 1)]
        truth = [self.ref[j] if j < len(self.ref) else 0 for j in range(self.i + 1, self.i + 1 + n)]
        return Proposal([t if self.rng.random() < self.a else (t + 1) % self.vocab for t in truth])

    def accept(self, kept: int, taps) -> None:
        self.inner.accept(kept, taps)
        self.i += kept


def timed_generate(target, draft, prompt: list[int], n: int, width=None) -> tuple[Any, float]:
    """speculative.generate, timed from the end of the prefill (and the draft's prompt) to the last id:
    returns (run, ids per second over the n-1 ids after the first)."""
    mark: dict[str, float] = {}
    dev = target.device

    class Timed:
        device = dev

        def prefill(self, ids):
            out = target.prefill(ids)
            if draft is None:
                mark["t0"] = time.perf_counter()
            return out

        verify, commit = target.verify, target.commit

    class TimedDraft:
        def prompt(self, taps):
            draft.prompt(taps)
            sync(dev)
            mark["t0"] = time.perf_counter()

        propose, accept = (draft.propose, draft.accept) if draft is not None else (None, None)

    run = generate(Timed(), TimedDraft() if draft is not None else None, prompt, n, width)
    sync(dev)
    return run, (len(run.ids) - 1) / (time.perf_counter() - mark["t0"])


def roofline(bw: float, weights: int, read: int, log) -> dict[str, float]:
    """A bench's rooflines at copy rate ``bw`` (B/s): the tok/s of a step reading every weight byte, and of one
    reading the ``read`` bytes a plain step reads (the criterion's)."""
    roof = {"copy_GBps": bw / 1e9, "roofline_tok_s": bw / weights, "roofline_read_tok_s": bw / read}
    log(f"bandwidth copy_GBps={bw / 1e9:.0f} roofline_tok_s={bw / weights:.1f} roofline_read_tok_s={bw / read:.1f}")
    return roof


def plain_row(plain, tok_s: float, roof: dict[str, float], log, tail: str = "") -> dict[str, Any]:
    """The plain loop's record (tok/s, its share of each roofline, its first 64 ids) and line."""
    row = {"tok_s": tok_s, "ratio_roofline": tok_s / roof["roofline_tok_s"],
           "ratio_roofline_read": tok_s / roof["roofline_read_tok_s"], "ids": plain.ids[:64]}
    log(f"plain tok_s={tok_s:.2f} ratio_roofline={row['ratio_roofline']:.3f} "
        f"ratio_roofline_read={row['ratio_roofline_read']:.3f} ms_per_id={1e3 / tok_s:.3f}{tail}")
    return row


def padded_reference(target, prompt: list[int], n: int, b: int, plain, rec: dict[str, Any], log):
    """The plain run with every pass padded to the verify's b rows (``target.rows``): the sweep's reference, whose
    ids the drafted runs must equal; whether its first n equal the unpadded plain run's is recorded and logged."""
    target.rows = b
    ref, _ = timed_generate(target, None, prompt, n + b)
    target.rows = None
    rec["plain"]["ids_equal_padded"] = ref.ids[:n] == plain.ids
    log(f"reference width={b} ids_equal_plain={ref.ids[:n] == plain.ids}")
    return ref


def first_engine(paths, build, label, dev: torch.device, log, what: str = "engine"):
    """(target, draft, mode) of the first path in ``paths`` that runs: ``build(*path)`` builds, warms and captures
    one and returns (target, draft, mode, capture seconds); a path that raises is logged with ``label(path)`` and
    its reason, and the next is tried; none running is a RuntimeError naming ``what``."""
    last = None
    for path in dict.fromkeys(paths):
        try:
            t, d, mode, secs = build(*path)
            log(f"engine {mode} capture_s={secs:.2f}")
            return t, d, mode
        except Exception as e:  # noqa: BLE001  (fall back to a slower path, the reason recorded)
            last = e.with_traceback(None)   # not its frames: they hold the failed engine
            log(f"engine {label(path)} failed: {type(e).__name__}: {str(e)[:300]}")
        if dev.type == "cuda":              # the failed path's memory free before the next is built (whatever the
            gc.collect()                    # failed build left in a reference cycle too)
            torch.cuda.empty_cache()
    raise RuntimeError(f"no {what} path ran: {last}")


def verify_costs(target, prompt: list[int], rmax: int, iters: int, log) -> list[dict[str, Any]]:
    """Device ms of one verify pass of R rows, R = 1..rmax (both benches): its graph replayed back to back (no
    commit: each replay writes the same positions). ``criterion_bound`` is a ratio of device times with no host time
    at all; ``target.verify`` would add its staging and its argmax read back (~0.3 ms a pass at 27B) to both of its
    terms (results/h200/speed/efe4252-mtp/NOTE.md)."""
    from bloomery_gates.kernels.graphs import time_replays

    target.prefill(prompt)
    rows: list[dict[str, Any]] = []
    for r in range(1, rmax + 1):
        target.inp.put([target.length] + [1] * r)
        sec = time_replays(lambda r=r: target.graphs.run(r), target.device, iters)
        rows.append({"rows": r, "ms": sec * 1e3, "rel_plain": sec * 1e3 / rows[0]["ms"] if rows else 1.0})
    log(f"verify plain_step_ms={rows[0]['ms']:.3f} " + " ".join(f"R{x['rows']}={x['rel_plain']:.3f}" for x in rows))
    return rows


def window_tok_s(tok_s: float, run) -> float:
    """The rate a drafted run's windows emitted ids at: ``tok_s`` (its n - 1 ids after the first, per second)
    scaled to every id they emitted (``run.emitted``, the last window's past n included). accept_mean counts those
    ids, so the ratio drafted / (accept_mean x plain) takes this rate: with tok_s it would also measure the run's
    cut at n (the last window's ids past n are dropped, up to R - 1 of them: 1-6% at n = 64, nothing as n grows),
    not the engine. Over whole windows the ratio is t_plain / t_window, the quantity ``criterion_bound`` bounds.
    -> tok_s x (len(emitted) - 1) / (len(ids) - 1)."""
    return tok_s * (len(run.emitted) - 1) / max(len(run.ids) - 1, 1)


def criterion_bound(verify: list[dict[str, Any]], rows: int, draft_read: int, copy_GBps: float, log=None
                    ) -> dict[str, Any]:
    """The best drafted / (accept_mean x plain) any draft could reach on this target and this verify: a window is
    at least a verify of ``rows`` rows plus the draft reading its bytes once at the copy rate (``draft_read``: its
    weights and the head per head pass), with no host time at all:

        frac_max = t_plain / (t_verify(rows) + draft_read / copy_bandwidth)

    Below ``CRITERION`` the criterion cannot be met by any draft of that size, however fast its kernels."""
    plain_ms = verify[0]["ms"]
    v = next(x for x in verify if x["rows"] == rows)
    read_ms = draft_read / (copy_GBps * 1e9) * 1e3
    frac = plain_ms / (v["ms"] + read_ms)
    out = {"frac_max": frac, "attainable": frac >= CRITERION, "verify_rel": v["rel_plain"], "rows": rows,
           "draft_read_bytes": draft_read, "draft_read_ms": read_ms, "draft_read_rel": read_ms / plain_ms}
    if log:
        log(f"bound frac_max={frac:.3f} needed={CRITERION} attainable={out['attainable']} (verify R{rows} "
            f"{v['rel_plain']:.3f} + draft reads {draft_read / 1e9:.2f} GB at the copy rate = {read_ms:.3f} ms = "
            f"{out['draft_read_rel']:.3f} of a plain step)")
    return out


def guarded(rec: dict, key: str, log, fn) -> None:
    """rec[key] = fn() (when it returns something); a failure is logged and recorded instead of ending the bench."""
    try:
        out = fn()
        if out is not None:
            rec[key] = out
    except Exception as e:  # noqa: BLE001
        log(f"{key} failed: {type(e).__name__}: {str(e)[:300]}")
        rec[key + "_error"] = f"{type(e).__name__}: {e}"


def hf_compare(tspec, target, dev, prompt, tokens, plain, plain_tok_s, log, build=None,
               label: str = "transformers generate") -> dict[str, Any]:
    """HF transformers' eager ``generate`` on the same weights (``bench_shapes.hf_decode``; ``build`` picks the
    class), in the same run: its tok/s, ours over it, whether its ids equal ours. A missing or failing
    transformers is recorded, not fatal (the rest of the record still counts)."""
    try:
        kw = {} if build is None else {"build": build}
        hf = hf_decode(tspec, dev, prompt, tokens, target.prefill(prompt, logits=True).logits, **kw)
    except ImportError:
        log("transformers not installed: no HF comparison")
        return {"error": "transformers not installed"}
    except Exception as e:  # noqa: BLE001  (the rest of the record still counts)
        log(f"transformers failed: {type(e).__name__}: {str(e)[:300]}")
        return {"error": f"{type(e).__name__}: {e}"}
    hf["ratio_ours"] = plain_tok_s / hf["tok_s"]
    hf["ids_equal_ours"] = hf.pop("ids") == plain.ids[: tokens + 1]
    log(f"{label} attn=eager tok_s={hf['tok_s']:.2f} ours_over_hf={hf['ratio_ours']:.1f}x "
        f"ids_equal_ours={hf['ids_equal_ours']} prefill_logits_rel={hf['prefill_logits_rel']:.2e} "
        f"version={hf['transformers']}")
    return hf
