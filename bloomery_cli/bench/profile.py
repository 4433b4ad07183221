"""``bloomery bench ... --profile``: where one decode step's time goes (torch.profiler; CUPTI on CUDA).

Two views of the same pass (a plain step of one row unless told otherwise):

- the pass as it runs in the bench (CUDA-graph replays where the engine graphs it): wall ms per step, kernels per
  step, the sum of their device times, and the rest (``gaps_ms``: launch latency between back-to-back kernels,
  which a graph shortens but does not remove), then the kernels by total device time:

      profile plain wall_ms=15.84 kernels=913 kernel_ms=14.10 gaps_ms=1.74
      profile kernel ms=6.912 share=0.490 calls=257 name=nvjet_tst_64x8_64x16_...

- the same pass run eagerly with shapes recorded: each matrix product (``aten::mm`` / ``aten::addmm``) by weight
  shape, its device time per call and the rate it reads its weight at, as a fraction of the copy bandwidth the
  bench measured (``frac_copy``: the GEMV's efficiency; the roofline assumes 1):

      profile gemm weight=5120x34816 calls=64 us=43.1 GBps=4136 frac_copy=0.971

The profile is measured after the bench's own figures (it never runs inside a timed region); on a CPU the same lines
come from CPU op times. Names are cut to 72 characters.

Under programmatic dependent launch (the graphed passes' default on sm_90+, ``kernels.triton.pdl_policy``) a kernel
is launched while the one before it still runs and waits for it inside its own time: the kernels' times overlap,
their sum can pass the wall (``gaps_ms`` < 0), and a short kernel after a long one shows the long one's tail. The
profile says so (``profile note``, the record's ``pdl``); ``BLOOMERY_PDL=off`` gives each kernel's own time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

TOP = 14
GEMM_OPS = ("aten::mm", "aten::addmm")


def _dev_us(evt: Any, cuda: bool, own: bool = True) -> float:
    """An event's device time in us, its own (``own``) or with its children's (an op's kernels); CPU time on a CPU.
    torch renamed cuda_* to device_* in 2.4; both are read."""
    pre = "self_" if own else ""
    if not cuda:
        return float(getattr(evt, f"{pre}cpu_time_total"))
    for attr in (f"{pre}device_time_total", f"{pre}cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def _is_kernel(evt: Any) -> bool:
    dt = getattr(evt, "device_type", None)
    return dt is not None and str(dt).endswith("CUDA")


def _profile(fn: Callable[[], None], dev: torch.device, steps: int, shapes: bool):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    with profile(activities=acts, record_shapes=shapes) as prof:
        for _ in range(steps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return prof


def kernel_table(fn: Callable[[], None], dev: torch.device, steps: int, wall_ms: float) -> dict[str, Any]:
    """Kernels of ``steps`` calls of ``fn`` by total device time (CPU ops by self time on a CPU)."""
    cuda = dev.type == "cuda"
    prof = _profile(fn, dev, steps, shapes=False)
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for evt in prof.key_averages():
        if cuda and not _is_kernel(evt):
            continue
        us = _dev_us(evt, cuda)
        if us <= 0:
            continue
        rows[evt.key][0] += us
        rows[evt.key][1] += evt.count
    total_ms = sum(us for us, _ in rows.values()) / 1e3 / steps
    calls = sum(c for _, c in rows.values()) / steps
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {"wall_ms": wall_ms, "kernel_ms": total_ms, "gaps_ms": wall_ms - total_ms, "kernels": calls,
            "top": [{"name": k, "ms": us / 1e3 / steps, "share": us / 1e3 / steps / wall_ms if wall_ms else 0.0,
                     "calls": c / steps} for k, (us, c) in top]}


def _weight_shape(shapes: list) -> tuple[int, int] | None:
    """The largest 2-D operand of a matrix product (the weight, [in, out] as ``w.t()`` is passed)."""
    mats = [tuple(s) for s in shapes if isinstance(s, list | tuple) and len(s) == 2]
    return max(mats, key=lambda s: s[0] * s[1]) if mats else None


def gemm_table(fn: Callable[[], None], dev: torch.device, steps: int, copy_GBps: float,
               esize: int) -> list[dict[str, Any]]:
    """Matrix products of an eager pass by weight shape: device us per call, GB/s read of the weight."""
    cuda = dev.type == "cuda"
    prof = _profile(fn, dev, steps, shapes=True)
    rows: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0])
    for evt in prof.key_averages(group_by_input_shape=True):
        if evt.key not in GEMM_OPS:
            continue
        w = _weight_shape(evt.input_shapes or [])
        if w is None:
            continue
        rows[w][0] += _dev_us(evt, cuda, own=False)
        rows[w][1] += evt.count
    out = []
    for (k, n), (us, c) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        per = us / c if c else 0.0
        gbps = k * n * esize / (per * 1e-6) / 1e9 if per else 0.0
        out.append({"weight": f"{n}x{k}", "calls": c / steps, "us": per, "GBps": gbps,
                    "frac_copy": gbps / copy_GBps if copy_GBps else 0.0})
    return out


def profile_step(label: str, graphed: Callable[[], None], eager: Callable[[], None] | None, dev: torch.device,
                 wall_ms: float, copy_GBps: float, esize: int, log, steps: int = 5) -> dict[str, Any]:
    """Both views (module docstring) of one pass, logged; the record's ``profile[label]``."""
    rec: dict[str, Any] = {}
    try:
        k = kernel_table(graphed, dev, steps, wall_ms)
        rec["kernels"] = k
        log(f"profile {label} wall_ms={wall_ms:.3f} kernels={k['kernels']:.0f} kernel_ms={k['kernel_ms']:.3f} "
            f"gaps_ms={k['gaps_ms']:.3f}")
        for r in k["top"]:
            log(f"profile kernel ms={r['ms']:.3f} share={r['share']:.3f} calls={r['calls']:.0f} name={r['name'][:72]}")
        if eager is not None:
            rec["gemm"] = gemm_table(eager, dev, max(1, steps // 2), copy_GBps, esize)
            for g in rec["gemm"]:
                log(f"profile gemm weight={g['weight']} calls={g['calls']:.0f} us={g['us']:.1f} "
                    f"GBps={g['GBps']:.0f} frac_copy={g['frac_copy']:.3f}")
    except Exception as e:  # noqa: BLE001  (a profiler that cannot run on this build is reported, not fatal)
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"profile {label} failed: {rec['error'][:300]}")
    return rec


def profile_window(sweep, rec: dict[str, Any], log, steps: int = 5) -> None:
    """``rec['profile']['window']``: the device loop's window (``kernels.accept.DeviceAccept``: draft, verify,
    accept, commit in one graph of ``sweep.rows`` rows; nothing without a device loop, ``sweep`` None), after its
    sweep has run: the ids wanted are all out, so each replay keeps nothing and re-runs the same positions (the same
    kernels and bytes as a live window). The window counter is put back before each replay (one 8-byte copy): a
    synthetic draft reads its draws by it, and replays past the run's windows would index past its table. Its
    device ms per replay (``time_replays``), then ``profile_step``'s kernel table: where a drafted window's time
    goes beside the bound's verify + draft read."""
    if sweep is None:
        return
    from bloomery_gates.kernels.graphs import time_replays

    loop, r = sweep.loop, sweep.rows
    dev = loop.engine.device
    w0 = loop.bufs.w.clone()

    def window() -> None:
        loop.bufs.w.copy_(w0)
        loop.bufs.graphs.run(r)

    wall_ms = time_replays(window, dev, 20) * 1e3
    rec.setdefault("profile", {})["window"] = profile_step(
        f"window{r}", window, None, dev, wall_ms, rec["bandwidth"]["copy_GBps"], loop.engine.embed.element_size(),
        log, steps=steps)


def profile_engine(target, draft, prompt: list[int], verify_rows: list[dict[str, Any]], draft_ms: float,
                   copy_GBps: float, log) -> dict[str, Any]:
    """The plain step, the widest verify and the draft's block of a bench's engines (``target.graphs`` a
    ``kernels.graphs.GraphSet`` over the engine's pass of R rows), each with the wall ms the bench measured."""
    from bloomery_gates.kernels.triton import pdl_policy

    esize = target.embed.element_size()
    out: dict[str, Any] = {}
    if pdl_policy.in_effect(target.device):
        out["pdl"] = pdl = pdl_policy.describe(target.device)
        log(f"profile note pdl={pdl}: a kernel launched early waits for the one before inside its own time, so the "
            "kernel times overlap (gaps_ms can be < 0); BLOOMERY_PDL=off for each kernel's own time")
    widest = verify_rows[-1]
    for label, r, ms in (("plain", 1, verify_rows[0]["ms"]), (f"verify{widest['rows']}", widest["rows"],
                                                             widest["ms"])):
        target.prefill(prompt)
        target.inp.put([target.length] + [1] * r)
        out[label] = profile_step(label, lambda r=r: target.graphs.run(r), lambda r=r: target.graphs.fn(r),
                                  target.device, ms, copy_GBps, esize, log)
    if draft is not None:
        first = target.prefill(prompt)
        draft.prompt(first.taps)
        anchor = first.argmax[-1]
        out["draft"] = profile_step("draft", lambda: draft.propose(anchor), None, target.device, draft_ms,
                                    copy_GBps, esize, log)
    target.prefill(prompt)
    return out
