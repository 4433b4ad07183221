"""Micro-benchmark of DFlash2's fused kernels against the plain torch path and the bandwidth floor.

    python -m bloomery_cli.bench.dflash2 --device cuda        (``just bench-dflash2-kernels``)

Shape: the Qwen3.8-27B drafter (H = 5120, B = 8, K = 16, r = 256, V = 248320, T = 2, g = 16), random
bf16 weights, one block (batch 1). Cases:
- "conv in" / "conv out + res": one ``dynamic_conv`` side (the fused kernel: one launch);
- "conv sublayer": the kernel projection (W_kp [2*T*H/g, H]) and both sides;
- "scores + walk": all B-1 slots (the fused kernel: one launch), synchronised;
- "selector stage": top-K of the B-1 logit rows, g = W_hp h, scores + walk, the path read back to the host.
Floor = bytes the case must move (inputs read once, outputs written once) / the measured device copy
bandwidth (a large tensor copy, read + write). A case far above its floor is launch- or latency-bound.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.dtypes import TORCH
from bloomery_gates.kernels.graphs import time_replays


@dataclass(frozen=True)
class BenchShape:
    hidden: int = 5120
    block: int = 8
    top_k: int = 16
    rank: int = 256
    vocab: int = 248320
    taps: int = 2
    group: int = 16
    dtype: str = "bf16"


DTYPES = TORCH          # bloomery_gates.dtypes, the one table


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)




def copy_bandwidth(device: torch.device, nbytes: int | None = None, iters: int = 10) -> float:
    """Measured copy rate in bytes/s (read + write both counted)."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 1 << 26)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / time_replays(lambda: dst.copy_(src), device, iters, warmup=3)


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _cases(s: BenchShape, device: torch.device):
    """(name, bytes, {impl: fn}, check(out_torch, out_triton) -> str) per case."""
    from bloomery_gates.kernels import triton as kt
    from bloomery_gates.kernels.ops import dynamic_conv as conv_ops
    from bloomery_gates.kernels.ops import selector as sel_ops

    dt, gen = DTYPES[s.dtype], torch.Generator(device=device).manual_seed(0)
    h, b, j, groups = s.hidden, s.block, s.block - 1, s.hidden // s.group

    def rnd(*shape, scale=1.0, dtype=dt):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    x, y, res = rnd(1, b, h), rnd(1, b, h), rnd(1, b, h)
    w_kp, base = rnd(2 * s.taps * groups, h, scale=h ** -0.5), rnd(2, s.taps, h)
    delta = conv_ops.conv_delta(x, w_kp)
    a, bs, w_hp = rnd(s.vocab, s.rank), rnd(s.vocab, s.rank), rnd(s.rank, h, scale=h ** -0.5)
    rows, logits = rnd(j, h), rnd(j, s.vocab, dtype=torch.float32)
    unary, cand = sel_ops.topk_candidates(logits, s.top_k)
    g = F.linear(rows, w_hp)
    anchor = torch.tensor(3, device=device)
    impls = ["torch"] + (["triton"] if kt.available(device) else [])
    conv = {i: kt.conv_impl(i) for i in impls}
    fused = {i: kt.select_impl(i) for i in impls}

    def rel(a_, b_):
        a_, b_ = a_[0] if isinstance(a_, tuple) else a_, b_[0] if isinstance(b_, tuple) else b_
        return f"rel {float((a_.float() - b_.float()).abs().max() / b_.float().abs().max().clamp_min(1e-30)):.1e}"

    def walk_equal(a_, b_):
        return "walk equal" if torch.equal(a_[1].cpu(), b_[1].cpu()) else "WALK DIFFERS"

    def sublayer(i):
        d = conv_ops.conv_delta(x, w_kp)
        return conv[i](y, d, base, 1, b, res=res), conv[i](x, d, base, 0, b)

    def stage(i):
        u, c = sel_ops.topk_candidates(logits, s.top_k)
        out = fused[i](c, u, F.linear(rows, w_hp), a, bs, anchor)
        return out[0], out[1].tolist()

    side_bytes = _nbytes(x, delta[..., : delta.shape[-1] // 2], base[0], x)
    gathered = 2 * j * s.top_k * s.rank * a.element_size()
    sel_bytes = gathered + _nbytes(g, unary, cand) + j * s.top_k * s.top_k * 4 + 2 * j * 8
    return impls, [
        ("conv in", side_bytes, {i: (lambda i=i: conv[i](x, delta, base, 0, b)) for i in impls}, rel),
        ("conv out + res", side_bytes + _nbytes(res),
         {i: (lambda i=i: conv[i](y, delta, base, 1, b, res=res)) for i in impls}, rel),
        ("conv sublayer", _nbytes(w_kp) + 2 * side_bytes + _nbytes(res),
         {i: (lambda i=i: sublayer(i)) for i in impls}, rel),
        ("scores + walk", sel_bytes,
         {i: (lambda i=i: _synced(fused[i](cand, unary, g, a, bs, anchor), device)) for i in impls}, walk_equal),
        ("selector stage", sel_bytes + _nbytes(logits, w_hp, rows),
         {i: (lambda i=i: stage(i)) for i in impls}, rel),
    ]


def _synced(out, device: torch.device):
    _sync(device)
    return out


def bench_kernels(device: str | torch.device = "cuda", shape: BenchShape | None = None, iters: int = 50,
                  show: bool = True) -> dict:
    """Time each case on each available impl; returns a dict (and prints a rich table when ``show``)."""
    dev = torch.device(device)
    s = shape or BenchShape()
    bw = copy_bandwidth(dev)
    impls, cases = _cases(s, dev)
    rows = []
    for name, nbytes, fns, check in cases:
        row = {"case": name, "bytes": nbytes, "floor_us": nbytes / bw * 1e6}
        outs = {}
        for impl, fn in fns.items():
            outs[impl] = fn()
            row[f"{impl}_us"] = time_replays(fn, dev, iters, warmup=3) * 1e6
        if "triton" in outs:
            row["speedup"] = row["torch_us"] / row["triton_us"]
            row["check"] = check(outs["torch"], outs["triton"])
        rows.append(row)
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "shape": asdict(s),
           "impls": impls, "copy_bandwidth_GBps": bw / 1e9, "iters": iters, "rows": rows}
    if show:
        print_table(out)
    return out


def print_table(res: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = res["shape"]
    t = Table(title=f"DFlash2 kernels on {res['device']}: H={s['hidden']} B={s['block']} K={s['top_k']} "
                    f"r={s['rank']} V={s['vocab']} T={s['taps']} g={s['group']} {s['dtype']}; copy "
                    f"{res['copy_bandwidth_GBps']:.0f} GB/s")
    for col in ("case", "bytes", "floor us", "torch us", "triton us", "speedup", "triton / floor", "check"):
        t.add_column(col, justify="left" if col in ("case", "check") else "right")
    for r in res["rows"]:
        tri = r.get("triton_us")
        t.add_row(r["case"], f"{r['bytes']:,}", f"{r['floor_us']:.2f}", f"{r['torch_us']:.1f}",
                  f"{tri:.1f}" if tri is not None else "-", f"{r['speedup']:.1f}x" if tri is not None else "-",
                  f"{tri / r['floor_us']:.0f}x" if tri is not None else "-", r.get("check", "triton unavailable"))
    (console or Console()).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.bench.dflash2", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None, help="also write the result dict here")
    a = ap.parse_args(argv)
    res = bench_kernels(a.device, iters=a.iters)
    if a.json:
        from pathlib import Path

        from ..results.records import write_atomic
        write_atomic(Path(a.json), res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
