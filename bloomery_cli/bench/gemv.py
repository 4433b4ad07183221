"""The decode projection's tile sizes, measured: ``kernels.triton.gemv.proj`` against cuBLAS at each weight shape
of a bench shape, the way a decode step runs it (a CUDA graph of back-to-back calls over copies of the weight
that together overflow L2, so every call reads its weight from HBM).

    python -m bloomery_cli.bench.gemv --shape qwen3-8b --shape qwen38-27b [--rows 1 --rows 16] [--json F]
        [--write-configs F]
    python -m bloomery_cli.bench.gemv --fit RECORD.json [...]      # the fit below from a record (no CUDA)

Per weight [N, K] (the norm prologue / residual epilogue as the engine uses it at that shape) and rows R: cuBLAS
(``kernels.graphs.proj``: rms kernel + mm, or addmm) and each candidate (BN, BK, warps, stages) of ``proj``, in us
per call and GB/s of weight read, as a fraction of the copy bandwidth. ``--write-configs`` writes the best
candidate at R = 1 per shape as JSON ({"NxK": [BN, BK, warps, stages, splits]}, or null where cuBLAS was faster;
``--wide`` adds the wide weights, where this cuBLAS baseline reads 10-25% below its in-step rate: judge those by a
whole-step bench):
``kernels.triton.gemv.config`` reads such a file from ``BLOOMERY_GEMV_CONFIGS`` (the measured table itself lives
in ``config``). CUDA only.

The fixed-cost fit (``fit_fixed_cost``, printed after a run and by ``--fit`` from a record): over the narrow
weights (N <= ``SMALL_N``, those ``proj`` takes) at one width, each best candidate's time per call against its
weight's bytes, least squares t = bytes / rate + c. ``rate`` (as a fraction of the copy bandwidth) is what one
more byte costs, ``c`` what a launch costs whatever its size: the ramp to the first tile, the tail, the drain
(docs/SPEED.md, "Why the 8B step stops near 0.84").
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# (N, K, norm, residual) of each narrow projection of a decode step (the wide ones stay on cuBLAS:
# ``kernels.triton.gemv.config``), and with --wide those wide ones (gate/up; the DeltaNet in-projection, q/g/k/v)
SHAPES = {
    "qwen3-8b": [(6144, 4096, True, False), (4096, 4096, False, True), (4096, 12288, False, True)],
    "qwen38-27b": [(5120, 6144, False, True), (5120, 17408, False, True)],
    # the DFlash2 draft at the 27B width (kernels/drafts/dflash2_fast.py), its own narrow weights: the conv kernel
    # projections W_kp (20 slabs of 64 at one split: few programs), the stacked q/k/v, the selector's W_hp; its
    # extension's fc (5 taps) and stacked k/v. Its o_proj / down_proj are the target's shapes above.
    "qwen38-27b-dflash2": [(1280, 5120, False, False), (8192, 5120, False, False), (256, 5120, False, False),
                           (5120, 25600, False, False), (2048, 5120, False, False)],
}
WIDE = {"qwen3-8b": [(24576, 4096, True, False)], "qwen38-27b-dflash2": [],
        "qwen38-27b": [(34816, 5120, True, False), (16480, 5120, True, False), (14336, 5120, True, False)]}
# (BN, BK, warps, stages, splits): slabs of 32..128 features, K in 1..8 splits (the sweeps before split-K: BN 16 and
# 8 warps never won, results/h200/speed/*/gemv-cuda-bf16.json)
CANDIDATES = ([(32, 256, 4, 4, s) for s in (1, 2, 4, 8)] + [(64, 256, 4, 4, s) for s in (1, 2, 3, 4, 6)]
              + [(64, 128, 4, 4, s) for s in (2, 4)] + [(128, 128, 4, 4, s) for s in (1, 2, 4)])
L2_SPAN = 512 << 20                   # the copies of one weight a graph walks over
ELEM = 2                              # bytes a weight element: the bench runs bf16 (``measure``)


def _graphed(fn_of, copies: int, per_graph: int = 24):
    """A CUDA graph of ``per_graph`` calls fn_of(i % copies); returns its replay."""
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            fn_of(i % copies)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(per_graph):
            fn_of(i % copies)
    return g, per_graph


def _us(graph, calls: int, reps: int = 10) -> float:
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / (reps * calls)


def measure(n: int, k: int, norm: bool, res: bool, rows: int, copy_GBps: float, log, candidates=None) -> dict:
    from bloomery_gates.kernels.triton.decode import TritonOps
    from bloomery_gates.kernels.triton.gemv import proj

    def cublas(x, w, g, r, out):      # the engines' path before proj: the Triton rms kernel, then mm / addmm
        a = TritonOps.rms(x, g, 1e-6) if g is not None else x
        return torch.mm(a, w.t(), out=out) if r is None else torch.addmm(r, a, w.t(), out=out)

    dev, dt = torch.device("cuda"), torch.bfloat16
    wbytes = n * k * ELEM
    copies = max(2, min(16, -(-L2_SPAN // wbytes)))
    ws = [torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    g = torch.rand(k, device=dev) + 0.5 if norm else None
    r = torch.randn(rows, n, device=dev, dtype=dt) if res else None
    out = torch.empty(rows, n, device=dev, dtype=dt)
    row = {"weight": f"{n}x{k}", "rows": rows, "norm": norm, "res": res}

    def rate(us: float) -> tuple[float, float]:
        return wbytes / (us * 1e-6) / 1e9, wbytes / (us * 1e-6) / 1e9 / copy_GBps

    us = _us(*_graphed(lambda i: cublas(x, ws[i], g, r, out), copies))
    row["cublas"] = {"us": us, "GBps": rate(us)[0], "frac_copy": rate(us)[1]}
    ref = cublas(x, ws[0], g, r, None)
    row["candidates"] = []
    for cfg in candidates or CANDIDATES:
        try:
            got = proj(x, ws[0], g, 1e-6, r, rp=16, cfg=cfg)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            us = _us(*_graphed(lambda i, cfg=cfg: proj(x, ws[i], g, 1e-6, r, out=out, rp=16, cfg=cfg),
                               copies))
            row["candidates"].append({"cfg": list(cfg), "us": us, "GBps": rate(us)[0], "frac_copy": rate(us)[1],
                                      "max_rel_vs_cublas": err})
        except Exception as e:  # noqa: BLE001  (a config that does not compile here is recorded)
            row["candidates"].append({"cfg": list(cfg), "error": f"{type(e).__name__}: {str(e)[:200]}"})
    ok = [c for c in row["candidates"] if "us" in c and c["max_rel_vs_cublas"] < 2e-2]
    best = min(ok, key=lambda c: c["us"]) if ok else None
    row["best"] = best
    log(f"gemv weight={n}x{k} rows={rows} norm={int(norm)} res={int(res)} "
        f"cublas_us={row['cublas']['us']:.1f} "
        f"({row['cublas']['frac_copy']:.3f})" + (f" best={best['cfg']} us={best['us']:.1f} ({best['frac_copy']:.3f}) "
                                                  f"rel={best['max_rel_vs_cublas']:.1e}" if best else " best=none"))
    ws.clear()
    torch.cuda.empty_cache()
    return row


@dataclass(frozen=True)
class Fit:
    """t = bytes / rate + c over ``weights`` narrow weights at ``rows`` rows; ``max_residual_us`` the worst miss."""
    rows: int
    weights: int
    rate_frac_copy: float
    fixed_us: float
    max_residual_us: float

    def line(self) -> str:
        return (f"fit rows={self.rows} weights={self.weights} rate={self.rate_frac_copy:.3f} of copy "
                f"fixed_us={self.fixed_us:.2f} max_residual_us={self.max_residual_us:.2f}")


def fit_fixed_cost(rows: list[dict], copy_GBps: float, width: int) -> Fit | None:
    """The fixed-cost fit (module docstring) of a record's ``rows`` at ``width``; None with fewer than two distinct
    weight sizes (nothing to fit a line through)."""
    from bloomery_gates.kernels.triton.gemv import SMALL_N

    pts = []
    for r in rows:
        n, k = (int(v) for v in r["weight"].split("x"))
        if r["rows"] == width and r.get("best") and n <= SMALL_N:
            pts.append((n * k * ELEM, r["best"]["us"]))
    b = np.array([p[0] for p in pts], dtype=np.float64)
    t = np.array([p[1] for p in pts], dtype=np.float64)
    if len(set(b.tolist())) < 2:
        return None
    (slope, c), *_ = np.linalg.lstsq(np.c_[b, np.ones_like(b)], t, rcond=None)
    rate_GBps = 1e-3 / slope                    # bytes per us -> GB/s
    return Fit(width, len(pts), float(rate_GBps / copy_GBps), float(c), float(np.abs(t - (b * slope + c)).max()))


def fits(rec: dict) -> list[Fit]:
    """The fit at every width a record measured."""
    out = [fit_fixed_cost(rec["rows"], rec["copy_GBps"], w) for w in sorted({r["rows"] for r in rec["rows"]})]
    return [f for f in out if f is not None]


def main(argv: list[str] | None = None) -> None:
    from bloomery_gates.kernels.triton.gemv import SMALL_N

    from ..results.records import conditions, write_atomic
    from .dflash2 import copy_bandwidth

    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.bench.gemv", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES))
    ap.add_argument("--rows", action="append", type=int)
    ap.add_argument("--wide", action="store_true", help="also the wide weights cuBLAS runs by default")
    ap.add_argument("--weight", action="append", help="only these weights (NxK), of the shapes' lists")
    ap.add_argument("--candidate", action="append", help="BN,BK,warps,stages,splits[,tma] (repeatable; tma 1: the "
                    "weight's tiles copied by TMA): these instead of the built-in candidates")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--write-configs", type=Path)
    ap.add_argument("--fit", type=Path, nargs="+", metavar="RECORD", help="print the fixed-cost fit of these "
                    "records (--json files of earlier runs) and exit; no CUDA needed")
    a = ap.parse_args(argv)
    if a.fit:                           # every record read and fitted before the first line is printed
        got: list[tuple[Path, list[Fit]]] = []
        for path in a.fit:
            try:
                got.append((path, fits(json.loads(path.read_text()))))
            except (OSError, ValueError, KeyError, TypeError) as e:
                ap.error(f"--fit {path}: not a bench_gemv record ({type(e).__name__}: {e})")
            if not got[-1][1]:
                ap.error(f"--fit {path}: fewer than two narrow weights at any width: nothing to fit")
        for path, record_fits in got:
            for f in record_fits:
                print(f"{path}: {f.line()}")
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemv: needs CUDA")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev, 2 << 30) / 1e9
    print(f"bandwidth copy_GBps={bw:.0f}")
    rec = {"conditions": conditions(dev) | {"dtype": "bf16"}, "copy_GBps": bw, "rows": []}
    best: dict[str, list[int]] = {}
    mine_cands = [tuple(int(v) for v in c.split(",")) for c in a.candidate] if a.candidate else None
    for shape in a.shape or sorted(SHAPES):
        for n, k, norm, res in SHAPES[shape] + (WIDE[shape] if a.wide else []):
            if a.weight and f"{n}x{k}" not in a.weight:
                continue
            for i, r in enumerate(a.rows or [1, 16]):      # the first width sweeps; the others check its best
                from bloomery_gates.kernels.triton.gemv import config

                mine = best.get(f"{n}x{k}")
                cands = (mine_cands if i == 0 else
                         list(dict.fromkeys([tuple(c) for c in (mine, config(n, k)) if c])))
                row = measure(n, k, norm, res, r, bw, print, cands)
                row["shape"] = shape
                rec["rows"].append(row)
                if i == 0:                  # cuBLAS where no candidate beats it (config None: the torch path); a
                    b = row["best"]         # wide weight gets its best candidate whatever (a bench decides)
                    wide = n > SMALL_N
                    best[f"{n}x{k}"] = b["cfg"] if b and (wide or b["us"] < row["cublas"]["us"]) else None
                if a.json:
                    write_atomic(a.json, rec)
    fitted = fits(rec)
    rec["fit"] = [vars(f) for f in fitted]
    for f in fitted:
        print(f.line())
    if a.json:
        write_atomic(a.json, rec)
    if a.write_configs:
        a.write_configs.write_text(json.dumps(best, indent=1))
        print(f"configs -> {a.write_configs}: {best}")


if __name__ == "__main__":
    main()
