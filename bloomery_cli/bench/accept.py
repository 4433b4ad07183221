"""The drafted runs with device-side accept (``kernels.accept``) beside the host loop (issue 27).

Each synthetic-acceptance row of a bench (``bench._sweep``, ``bench_hybrid._sweep``) is run twice at the same
acceptance a and seed:

    host loop    ``speculative.generate`` with ``ReplayDraft`` (the real draft runs for its cost, the window's
                 argmax read back with ``.tolist()``, accept and commit decided on the host)
    device loop  ``DeviceAccept`` with ``SyntheticDraft`` (ReplayDraft's proposals from a device table, the same
                 draws), the same real draft run on the device for its cost (``DFlashDev``, ``DFlash2Dev``,
                 ``MTPDev``), kept / emitted ids / anchor / commit on the device, the host reading a window's
                 ids after the next one is queued

and the ``device_accept`` line prints, beside the host loop's tok/s:

    frac_of_bound  = (tok_s_windows / (accept_mean x plain_tok_s)) / bound.frac_max     (``host_frac_of_bound`` the
                     host loop's); plain_tok_s is the plain loop's, which pays a host round trip an id; tok_s_windows
                     the rate the windows emitted ids at, the last one's past n included, as accept_mean counts
                     them (``bench.common.window_tok_s``: over whole windows the ratio is t_plain / t_window)
    frac_of_bound_chain  the same over the chained plain decode's tok/s (``bench.chain``, ids identical, run
                     earlier in the same bench): both sides without the host's round trip, as the bound's device-time
                     ratios are. Issue 27's drafted criterion (>= 0.92) is judged on it when the chain ran (``met``);
                     over the plain loop the device loop can pass 1.0 of a bound it cannot beat
    first_propose_share  the share of the drafted run's time its draft's first propose took (CUDA events; once
                     a run), and ``windows_frac_of_bound_chain`` the same ratio over the windows alone (reported
                     beside it: the bound is a window's)
    ids_identical  the device loop's n ids == the padded plain reference's (the bench exits 1 otherwise)
    windows_identical  its (proposals, kept) per window == the host loop's (the same draws; reported)

On CUDA a ``device_accept_timeline`` line follows (``timeline``): the median window, how late the first window
ended, the bubbles between windows and the host's clock past the last one: where a run's time beyond its windows
goes (a short run's constant is what separates its ratio from the window's).

Only the fixed width runs on the device (the cost policy decides per window on the host: not run, said so)."""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

import torch

from bloomery_gates.kernels.accept import DeviceAccept
from bloomery_gates.kernels.accept_drafts import DFlash2Dev, DFlashDev, MTPDev, SyntheticDraft

from .common import sync, window_tok_s

NEEDED = 0.92                   # issue 27: drafted >= 0.92 of the bound line


def device_hooks(draft):
    """The device hooks of a bench's real draft (its cost inside the device loop)."""
    from bloomery_gates.kernels.drafts.dflash import FastDFlashDraft
    from bloomery_gates.kernels.drafts.dflash2_fast import FastDFlash2Draft
    from bloomery_gates.kernels.drafts.mtp_fast import FastMTPDraft

    for cls, hooks in ((FastDFlash2Draft, DFlash2Dev), (FastDFlashDraft, DFlashDev), (FastMTPDraft, MTPDev)):
        if isinstance(draft, cls):
            return hooks(draft)
    raise ValueError(f"no device hooks for a {type(draft).__name__}")


def timed_device(loop: DeviceAccept, prompt: list[int], n: int, rows: int):
    """``loop.generate``, timed as ``bench.timed_generate`` times the host loop: from the end of the prefill and the
    draft's prompt to the last id. -> (run, ids per second over the n-1 ids after the first, the share of that time
    the draft's first propose took, the run's ``timeline``). The share is read from CUDA events (none on a CPU: 0.0,
    and no timeline), so timing it adds no sync: the first propose (the first window's draft, run by the host) is
    the part of a run that does not scale with n."""
    dev = loop.engine.device
    cuda = dev.type == "cuda"
    mark: dict[str, float] = {}
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else []

    def start() -> None:
        sync(dev)
        mark["t0"] = time.perf_counter()
        if ev:
            ev[0].record()

    run = loop.generate(prompt, n, rows, start, ev[1].record if ev else lambda: None)
    if ev:
        ev[2].record()
    sync(dev)
    secs = time.perf_counter() - mark["t0"]
    first = ev[0].elapsed_time(ev[1]) / ev[0].elapsed_time(ev[2]) if ev else 0.0
    times = timeline(ev[0], run.events, secs * 1e3, run.launched, ev[2]) if ev and run.events else {}
    return run, (len(run.ids) - 1) / secs, first, times


def timeline(start, events: list, run_ms: float, launched=None, returned=None) -> dict[str, float]:
    """Where a device run's time goes past its windows (CUDA events: ``start`` at the clock's start, one after each
    window): window_ms the median interval between windows' ends, start_extra_ms the first window's end past one
    window (the set-up and the first graph's launch), bubbles_ms the intervals past the median (the host's round
    trips near the end), after_last_ms the host clock past the last window's end. With ``launched`` (queued just
    before the first window) and ``returned`` (just after the run returned; the device idle by then, so its time is
    the host's): setup_ms the host's time before the first window (the draft's first propose, which
    first_propose_share also counts, and the run's set-up), host_tail_ms the host's reads and return after the last
    window."""
    ends = [start.elapsed_time(e) for e in events]
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    med = statistics.median(gaps) if gaps else ends[0]
    out = {"window_ms": med, "start_extra_ms": ends[0] - med, "bubbles_ms": ends[-1] - ends[0] - med * len(gaps),
           "after_last_ms": run_ms - ends[-1]}
    if launched is not None:
        out["setup_ms"] = start.elapsed_time(launched)
    if returned is not None:
        out["host_tail_ms"] = start.elapsed_time(returned) - ends[-1]
    return out


class DeviceSweep:
    """One ``DeviceAccept`` over the bench's target and draft (its graphs captured once, on the first row)."""

    def __init__(self, target, draft, rows: int, n: int, ref_len: int, chain_tok_s: float | None = None):
        self.target, self.rows, self.chain_tok_s = target, rows, chain_tok_s
        self.synth = SyntheticDraft(target.device, target.spec.vocab_size, rows - 1, max(n, ref_len) + 2 * rows,
                                    inner=device_hooks(draft))
        self.loop = DeviceAccept(target, self.synth, graphs=target.graphs.enabled)
        self.warm = False

    def timed(self, prompt: list[int], n: int):
        return timed_device(self.loop, prompt, n, self.rows)

    def row(self, prompt: list[int], ref: list[int], n: int, a: float, seed: int, plain_tok_s: float,
            host: dict[str, Any], host_windows: list, bound: dict | None, log) -> dict[str, Any]:
        self.synth.load(ref, a, seed)
        if not self.warm:                               # captures the window graph (untimed, as the host's is)
            self.timed(prompt, n)
            self.warm = True
        run, tok_s, first, times = self.timed(prompt, n)
        kept = [k for _, k in run.windows]
        am = sum(kept) / len(kept) if kept else 0.0
        windows_rate = window_tok_s(tok_s, run)
        frac = windows_rate / (am * plain_tok_s) if am else 0.0
        fmax = (bound or {}).get("frac_max")
        out = {"a": a, "accept_mean": am, "tok_s": tok_s, "tok_s_windows": windows_rate, "host_tok_s": host["tok_s"],
               "ratio_to_host": tok_s / host["tok_s"], "tau_x_plain_frac": frac, "windows": len(kept),
               "ids_identical": run.ids == ref[:n], "windows_identical": run.windows == host_windows,
               "first_propose_share": first}
        roof = ""
        if fmax:
            judged = frac / fmax
            out |= {"frac_of_bound": frac / fmax, "host_frac_of_bound": host["tau_x_plain_frac"] / fmax,
                    "bound_frac_max": fmax}
            chain = ""
            if self.chain_tok_s and am:
                judged = out["frac_of_bound_chain"] = windows_rate / (am * self.chain_tok_s) / fmax
                out["chain_tok_s"] = self.chain_tok_s
                out["windows_frac_of_bound_chain"] = judged / (1 - first)       # the same without the first propose
                chain = (f" frac_of_bound_chain={judged:.3f} first_propose_share={first:.3f} "
                         f"windows_frac_of_bound_chain={out['windows_frac_of_bound_chain']:.3f}")
            out["met"] = judged >= NEEDED
            roof = (f" frac_of_bound={out['frac_of_bound']:.3f} host_frac_of_bound={out['host_frac_of_bound']:.3f}"
                    f"{chain} bound_frac_max={fmax:.3f} needed={NEEDED} met={out['met']}")
        log(f"device_accept a={a:.4f} accept_mean={am:.3f} tok_s={tok_s:.2f} host_loop_tok_s={host['tok_s']:.2f} "
            f"ratio_to_host={out['ratio_to_host']:.3f} frac_of_tau_x_plain={frac:.3f}{roof} "
            f"ids_identical={out['ids_identical']} windows_identical={out['windows_identical']}")
        if times:
            out["timeline"] = times
            log(f"device_accept_timeline a={a:.4f} windows={len(kept)} "
                + " ".join(f"{k}={v:.3f}" for k, v in times.items()))
        return out


def measured_row(target, draft, prompt: list[int], n: int, rows: int, plain_ids: list[int], plain_tok_s: float,
                 host: dict[str, Any], log) -> dict[str, Any]:
    """The real draft (its own proposals, on the device: ``device_hooks``) in the device loop at the fixed width,
    beside the host loop's measured run: its tok/s, acceptance and ids against the plain run's."""
    loop = DeviceAccept(target, device_hooks(draft), graphs=target.graphs.enabled)
    loop.generate(prompt, n, rows)                      # captures the window graph (untimed)
    run, tok_s, _, _ = timed_device(loop, prompt, n, rows)
    kept = [k for _, k in run.windows]
    am = sum(kept) / len(kept) if kept else 0.0
    out = {"accept_mean": am, "tok_s": tok_s, "host_tok_s": host["tok_s"], "ratio_to_host": tok_s / host["tok_s"],
           "speedup": tok_s / plain_tok_s, "ids_identical": run.ids == plain_ids[:n]}
    log(f"device_accept measured accept_mean={am:.3f} tok_s={tok_s:.1f} host_loop_tok_s={host['tok_s']:.1f} "
        f"ratio_to_host={out['ratio_to_host']:.3f} speedup={out['speedup']:.2f} "
        f"ids_identical_plain={out['ids_identical']}")
    return out


def start_device(rec: dict[str, Any], target, draft, rows: int, n: int, ref_len: int, width: str, log
                 ) -> DeviceSweep | None:
    """``rec['device_accept']`` started; the sweep's ``DeviceSweep``, or None (a line and the record say why) for the
    cost policy or when it cannot be built (then ``device_ok`` fails)."""
    rec["device_accept"] = []
    if width != "fixed":
        rec["device_accept_skipped"] = f"width policy {width}: the device loop runs the fixed width only"
        log(f"device_accept skipped: {rec['device_accept_skipped']}")
        return None
    chains = [c["tok_s"] for c in rec.get("host", {}).get("chains", []) if c.get("ids_identical")]
    try:
        return DeviceSweep(target, draft, rows, n, ref_len, max(chains, default=None))
    except (ValueError, RuntimeError) as e:
        rec["device_accept_error"] = f"{type(e).__name__}: {e}"
        log(f"device_accept failed: {rec['device_accept_error'][:300]}")
        return None


def add_row(dev: DeviceSweep | None, rec: dict[str, Any], log, *args) -> None:
    """The device loop's row beside the host row just run (``DeviceSweep.row``'s arguments); a failure is logged
    and recorded (``device_ok`` then fails)."""
    if dev is None:
        return
    try:
        rec["device_accept"].append(dev.row(*args, log=log))
    except Exception as e:  # noqa: BLE001  (recorded; the bench exits 1 through device_ok)
        rec["device_accept_error"] = f"{type(e).__name__}: {e}"
        log(f"device_accept failed: {rec['device_accept_error'][:300]}")


def device_ok(rec: dict[str, Any]) -> bool:
    """Fails closed: True only when the device loop ran every row of a fixed-width sweep with the reference's ids
    (or was skipped for the cost policy, said so), and the measured real-draft run, where it ran, has the plain
    run's ids."""
    if "device_measured_error" in rec or not rec.get("device_measured", {"ids_identical": True})["ids_identical"]:
        return False
    if "device_accept_skipped" in rec:
        return True
    rows = rec.get("device_accept") or []
    if "device_accept_error" in rec:
        return False
    return bool(rows) and len(rows) == len(rec.get("sweep") or []) and all(r["ids_identical"] for r in rows)
