"""The host's share of a plain id, and plain decode with the host off the critical path (issue 27 part 2).

``host_share(target, prompt, plain_ids, plain_ms_per_id)`` on a ``FastQwen3Target`` or ``FastQwen38Target``:
  device_step_ms  one plain step's device time: the width-1 pass (and, on the hybrid, its commit of one row)
                  replayed back to back (CUDA events; nothing read back between replays), i.e. what an id costs
                  when the host never makes the device wait
  host_share      1 - device_step_ms / ms_per_id: the part of an id's wall time that is not the step's device work
                  (the argmax readback's round trip, the host's Python, launch gaps between graphs)
  chain K         ``decode_plain`` (``kernels.chain``): K one-row steps a graph replay, the argmax fed forward on the
                  device, the host reading a replay's ids only once the next replay is queued. Its ids must equal
                  the plain loop's (``ids_identical``; the bench exits 1 otherwise).

``python -m bloomery_cli.bench.chain --shape qwen3-8b --device cuda [-n 256] [--k 8,16] [--json F]``: the plain
loop and the chains at a bench shape (random weights made on the device), without the rest of the bench.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from bloomery_gates.kernels.graphs import time_replays

from .common import sync, timed_generate

KS = (8, 16)


def host_share(target, prompt: list[int], plain_ids: list[int], plain_ms_per_id: float, ks=KS, iters: int = 20,
               log=print, roofline_read_tok_s: float | None = None) -> dict[str, Any]:
    dev = target.device
    n = len(plain_ids)
    target.prefill(prompt)
    target.verify([plain_ids[0]])                                   # stages (and captures) the width-1 pass
    target.commit(1)                                                # and its commit (a hybrid's: state, tail)
    dev_ms = time_replays(target.replay_plain_step, dev, iters) * 1e3
    out: dict[str, Any] = {"device_step_ms": dev_ms, "plain_ms_per_id": plain_ms_per_id,
                           "host_share_plain": 1.0 - dev_ms / plain_ms_per_id, "chains": []}
    log(f"host plain_ms_per_id={plain_ms_per_id:.3f} device_step_ms={dev_ms:.3f} "
        f"host_share={out['host_share_plain']:.4f}")
    for k in ks:
        first = target.prefill(prompt).argmax[-1]
        target.decode_plain(first, n - 1, k)        # the timed call once: captures its K and tail graphs, warms up
        first = target.prefill(prompt).argmax[-1]
        sync(dev)
        t0 = time.perf_counter()
        ids = target.decode_plain(first, n - 1, k)
        sync(dev)
        wall = time.perf_counter() - t0
        ms = wall / (n - 1) * 1e3
        row = {"k": k, "ms_per_id": ms, "tok_s": 1e3 / ms, "host_share": 1.0 - dev_ms / ms,
               "ids_identical": first == plain_ids[0] and ids == plain_ids[1:]}
        roof = ""
        if roofline_read_tok_s:
            row["ratio_roofline_read"] = row["tok_s"] / roofline_read_tok_s
            roof = f" ratio_roofline_read={row['ratio_roofline_read']:.3f}"
        out["chains"].append(row)
        log(f"chain k={k} tok_s={row['tok_s']:.1f} ms_per_id={ms:.3f} host_share={row['host_share']:.4f}{roof} "
            f"ids_identical={row['ids_identical']}")
    out["ids_identical_all"] = all(r["ids_identical"] for r in out["chains"])
    return out


@dataclass(frozen=True)
class Variant:
    """One engine variant of a diagnostic (.ci/diag_*.py): its plain loop's ids and tok/s, one graphed plain step's
    device time, the chained plain decode at K = 16."""
    ids: list[int]
    plain_tok_s: float
    device_step_ms: float
    chain_tok_s: float
    host_share: float
    chain_ids_as_plain: bool

    def line(self, read: int, bw: float) -> str:
        """Its numbers as the diagnostics print them (``read`` bytes a step, ``bw`` the copy rate in B/s)."""
        return (f"plain_tok_s={self.plain_tok_s:.1f} device_step_ms={self.device_step_ms:.3f} "
                f"chain16 tok_s={self.chain_tok_s:.1f} ms_per_id={1e3 / self.chain_tok_s:.3f} "
                f"ratio_roofline_read={self.chain_tok_s * read / bw:.3f} host_share={self.host_share:.4f} "
                f"chain_ids_as_plain={self.chain_ids_as_plain}")


def measure_variant(target, prompt: list[int], n: int, iters: int = 50) -> Variant:
    """``target``'s plain loop over n ids once (``timed_generate``), then ``host_share`` at K = 16."""
    plain, tok_s = timed_generate(target, None, prompt, n)
    h = host_share(target, prompt, plain.ids, 1e3 / tok_s, (16,), iters=iters, log=lambda *_: None)
    c = h["chains"][0]
    return Variant(plain.ids, tok_s, h["device_step_ms"], c["tok_s"], c["host_share"], c["ids_identical"])


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from bloomery_gates.errors import InputError
    from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target

    from ..gatekit import resolve_device
    from ..results.records import conditions, write_atomic
    from .common import DTYPES, timed_generate
    from .dflash2 import copy_bandwidth
    from .shapes import SHAPES, random_pair, read_per_step

    ap = argparse.ArgumentParser(prog="bench_chain")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--k", default="8,16")
    ap.add_argument("--json", type=str, default=None)
    a = ap.parse_args(argv)
    try:
        if a.shape not in SHAPES or a.dtype not in DTYPES or a.n < 2:
            raise ValueError(f"--shape {a.shape!r} ({', '.join(SHAPES)}), --dtype {a.dtype!r}, -n {a.n} (>= 2)")
        ks = tuple(int(x) for x in a.k.split(","))
        dev = resolve_device(a.device)
    except (ValueError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dt = DTYPES[a.dtype]
    bw = copy_bandwidth(dev)
    tspec, _ = random_pair(SHAPES[a.shape], dev, dt)
    read = read_per_step(tspec)
    prompt = torch.randint(0, tspec.vocab_size, (a.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    target = FastQwen3Target(tspec, dev, dt, a.prompt_len + a.n + 64, max_width=max(ks), graphs=True)
    target.prefill([1, 2, 3])
    target.capture([1])
    mode = f"ops={target.ops.name} graphs={'on' if target.graphs.enabled else 'off'}"
    plain, tok_s = timed_generate(target, None, prompt, a.n)
    print(f"bench_chain shape={a.shape} device_name={conditions(dev)['device_name']!r} dtype={a.dtype} "
          f"prompt_len={a.prompt_len} n={a.n} engine {mode}")
    print(f"plain tok_s={tok_s:.1f} ratio_roofline_read={tok_s * read / bw:.3f} copy_GBps={bw / 1e9:.0f} "
          f"read_per_step={read}")
    rec = {"bench": "chain", "shape": a.shape, "conditions": conditions(dev) | {"dtype": a.dtype, "n": a.n,
           "prompt_len": a.prompt_len, "engine": mode}, "copy_GBps": bw / 1e9, "read_per_step": read,
           "plain": {"tok_s": tok_s, "ratio_roofline_read": tok_s * read / bw}}
    rec["host"] = host_share(target, prompt, plain.ids, 1e3 / tok_s, ks, roofline_read_tok_s=bw / read)
    if a.json:
        write_atomic(a.json, rec)
    return 0 if rec["host"]["ids_identical_all"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
