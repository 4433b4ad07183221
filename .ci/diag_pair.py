"""Issue 27 diagnostic (device only, never CI): the 8B down_proj + the next layer's q/k/v as two ``proj`` launches
under PDL (the engine today) against one persistent ``pair`` launch (kernels/triton/pair.py), 36 pairs in one CUDA
graph, distinct weights a pair (no L2 reuse across pairs). Prints us a pair, the fraction of the copy rate, and
whether the outputs agree (h bit for bit; z within bf16 rounding: the sum of squares is taken in another order).

python3 -P .ci/diag_pair.py [-r 1] [--layers 36] [VARIANT ...]
  VARIANT: base[%a|%b: a or b without PDL] | a | b | bn (one projection; bn: b without its norm)
    [/BN,BK,warps,stages,splits,tma: b's tiles]
  [@PDL: BLOOMERY_PDL with . for , (@off, @on.early)]
  | G[:pfBYTES[:SPIN]] (e.g. 96, 132:512:1; SPIN 0 atomic, 1 load, 2 sleep + load)
"""
import argparse
import contextlib
import os
from unittest import mock

import torch

from bloomery_cli.bench.dflash2 import copy_bandwidth
from bloomery_gates.kernels import graphs
from bloomery_gates.kernels.triton import gemv
from bloomery_gates.kernels.triton.pair import pair

CFG = (64, 256, 4, 4, 1, 1)


def no_pdl(on: bool):
    """Launches inside without PDL (when ``on``)."""
    return mock.patch.object(gemv.pdl_policy, "mode", lambda d: (0, None)) if on else contextlib.nullcontext()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-r", type=int, default=1)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("variants", nargs="*", default=["base", "96", "132", "96:512", "132:512", "64", "base"])
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    ka, na, nb, rp, eps = 12288, 4096, 6144, 16, 1e-6
    layers = [((torch.randn(na, ka, device=dev, generator=g) / 100).to(dt),
               (torch.randn(nb, na, device=dev, generator=g) / 60).to(dt),
               torch.rand(na, device=dev, generator=g) + 0.5) for _ in range(a.layers)]
    x = torch.randn(a.r, ka, device=dev, generator=g).to(dt)
    res = torch.randn(a.r, na, device=dev, generator=g).to(dt)
    outs = [(torch.empty(a.r, na, device=dev, dtype=dt), torch.empty(a.r, nb, device=dev, dtype=dt))
            for _ in range(a.layers)]
    bw = copy_bandwidth(dev)
    nbytes = (na * ka + nb * na) * 2
    print(f"diag_pair r={a.r} layers={a.layers} copy_GBps={bw / 1e9:.0f} bytes_a_pair={nbytes} "
          f"at_copy_rate_us={nbytes / bw * 1e6:.2f}", flush=True)
    ref = None
    for v in a.variants:
        kind, _, pdl = v.partition("@")
        os.environ["BLOOMERY_PDL"] = pdl.replace(".", ",")
        kind, _, bcfg = kind.partition("/")
        kind, _, plain = kind.partition("%")       # base%a / base%b: that projection launched without PDL
        if kind in ("base", "a", "b", "bn"):
            cb = tuple(int(c) for c in bcfg.split(",")) if bcfg else CFG

            def fn(_k, a_on=kind in ("base", "a"), b_on=kind in ("base", "b", "bn"), cb=cb, plain=plain,
                   norm=kind != "bn"):
                for (wa, wb, gb), (h, z) in zip(layers, outs, strict=True):
                    if a_on:
                        with no_pdl(plain == "a"):
                            gemv.proj(x, wa, None, eps, res, h, rp, CFG)
                    if b_on:
                        with no_pdl(plain == "b"):
                            gemv.proj(h, wb, gb if norm else None, eps, out=z, rp=rp, cfg=cb)
        else:
            grid, pf, spin = (kind.split(":") + ["0", "0"])[:3]

            def fn(_k, grid=int(grid), pf=int(pf), spin=int(spin)):
                for (wa, wb, gb), o in zip(layers, outs, strict=True):
                    pair(x, wa, res, gb, wb, eps, rp, CFG[:4], grid=grid, pf=pf, spin=spin, out=o)
        gs = graphs.GraphSet(fn, dev)
        gs.capture(0)
        s = graphs.time_replays(lambda gs=gs: gs.run(0), dev, a.iters, warmup=3)
        got = [(h.clone(), z.clone()) for h, z in outs]
        if ref is None and kind == "base":
            ref = got
        h_eq = z_rel = None
        if ref is not None and kind not in ("a", "b", "bn"):
            h_eq = all(torch.equal(h, h0) for (h, _), (h0, _) in zip(got, ref, strict=True))
            z_rel = max(((z.float() - z0.float()).abs().max() / z0.float().abs().max()).item()
                        for (_, z), (_, z0) in zip(got, ref, strict=True))
        us = s / a.layers * 1e6
        nb_v = {"a": na * ka * 2, "b": nb * na * 2, "bn": nb * na * 2}.get(kind, nbytes)
        print(f"variant={v} us_a_pair={us:.2f} of_copy_rate={nb_v / bw / (us / 1e6):.3f} "
              f"h_equal_base={h_eq} z_max_rel_vs_base={z_rel}", flush=True)
        del gs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
