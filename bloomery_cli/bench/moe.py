"""``bloomery bench moe --shape qwen35moe-35b-a3b | mimo2-flash``: what a verify of R rows costs on a MoE target.

One run, random weights of the shape made on the device (bench_moe_shapes), the family's target engine:
- bytes a plain step reads over the active experts only (moe_bytes: dense + head + one embedding row + k experts a
  MoE layer), the copy bandwidth, the roofline tok/s on those bytes (also at the real depth when ``--layers`` cut
  it), plain tok/s (n one-row passes, each committed, host time included) and its ratio to the roofline;
- for R = 1..R_max, the verify of R rows (the anchor + the plain run's own next R-1 ids, as a draft that is always
  right would propose) at the position after the prompt, timed (median of ``reps``, device synchronised): its cost
  relative to R = 1, the distinct experts its rows touched per MoE layer, the bytes it reads (moe_bytes) and their
  ratio to a plain step's, beside the uniform-routing expectation. The routing is the engine's own router on the
  rows (bench_moe_shapes: router weights N(0, 1/H); the expert load over the plain run is printed as ``load``);
- the same with the worst case planted (``ffn.forced_routing``: row r's slot j -> expert (r k + j) mod E);
- the cost width policy (``width.CostWidth``) fed the measured verify walls, per synthetic acceptance a (each
  proposal kept with probability a, chained): its choice of width against the best width by the measured
  walls, E(k) / wall(k) with E(k) = sum_{j<k} a^j. The draft is taken as free (the bound any draft of its size
  approaches);
- with ``drafts`` (``--drafts``, default every draft the shape has): the real MTP / DFlash drafts at these shapes
  in the drafted loop over the synthetic acceptance sweep, and the cost policy with their measured cost against
  the best measured width (``moe_drafted``).

Checks (any failing exits 1; nothing measured never prints ok): every planted worst-case pass touched exactly
min(E, R k) experts in every MoE layer; every realistic pass between k and min(E, R k); the verify of one row
read a plain step's bytes; with drafts, every drafted run's ids equal the plain run's and every draft drafted
(``moe_drafted``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.kernels.families.ffn import forced_routing
from bloomery_gates.kernels.ops.moe import Routing

from ..gatekit import resolve_device
from ..results.records import conditions
from .common import DTYPES, sync
from .dflash2 import copy_bandwidth
from .moe_bytes import MoEBytes, disjoint_ids, distinct_of, distinct_uniform, distinct_worst, load_spread, moe_bytes
from .moe_policy import policy_vs_best
from .moe_shapes import MOE_SHAPES, MoEBenchShape, build_engine, mimo2_layer_types
from .moe_stack import stack_table


def pass_routing(engine, out) -> dict[int, Routing]:
    """The last pass's routing per MoE layer (qwen35moe: on the pass; mimo2: on the engine)."""
    r = getattr(out, "routing", None)
    return dict(r) if r is not None else dict(engine.routings)


def _timed(engine, ids: list[int], device: torch.device) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = engine.verify(ids)
    sync(device)
    return time.perf_counter() - t0, out


def verify_table(engine, b: MoEBytes, anchor: int, cont: list[int], rows: int, reps: int, device: torch.device,
                 worst: bool) -> list[dict[str, Any]]:
    """R = 1..rows: median wall of ``reps`` verifies (after one warm-up), distinct experts per MoE layer, bytes."""
    e, k = b.experts, b.top_k

    def plant(r: Routing) -> Routing:
        ids = disjoint_ids(r.ids.shape[0], k, e, r.ids.device)
        return Routing(ids, r.weights, r.choice)

    table = []
    for n in range(1, rows + 1):
        ids = [anchor, *cont[:n - 1]]
        walls = []
        for i in range(reps + 1):
            if worst:
                with forced_routing(plant):
                    s, out = _timed(engine, ids, device)
            else:
                s, out = _timed(engine, ids, device)
            if i:
                walls.append(s)
        routing = pass_routing(engine, out)
        d = {l: distinct_of(r.ids[:n]) for l, r in routing.items()}
        table.append({"rows": n, "ms": statistics.median(walls) * 1e3, "walls_ms": [w * 1e3 for w in walls],
                      "distinct_mean": sum(d.values()) / len(d), "distinct_min": min(d.values()),
                      "distinct_max": max(d.values()), "distinct_uniform": distinct_uniform(e, k, n),
                      "distinct_worst": distinct_worst(e, k, n), "bytes": b.pass_bytes(n, d),
                      "gathered_expert_bytes": b.gathered(n)})
    base_ms, base_bytes = table[0]["ms"], b.plain()
    for row in table:
        row["rel_plain"] = row["ms"] / base_ms
        row["bytes_rel"] = row["bytes"] / base_bytes
    return table


def _spread(routings: list[dict[int, Routing]], experts: int) -> dict[str, float]:
    per = {}
    for rt in routings:
        for l, r in rt.items():
            per.setdefault(l, []).append(r.ids[:1].cpu())
    stats = [load_spread(torch.cat(v), experts) for v in per.values()]
    return {key: sum(s[key] for s in stats) / len(stats) for key in ("max_over_mean", "min_over_mean", "entropy")}


def _moe_layers(s: MoEBenchShape, layers: int) -> int:
    return sum(m == "sparse" for m in mimo2_layer_types(s, layers)[1]) if s.family == "mimo2" else layers


def checks(b: MoEBytes, real: list[dict[str, Any]], worst: list[dict[str, Any]],
           stack_worst: list[dict[str, Any]]) -> dict[str, bool]:
    k, e = b.top_k, b.experts
    return {"stack_worst_planted": bool(stack_worst) and all(r["distinct_mean"] == min(e, r["rows"] * k)
                                                             for r in stack_worst),
            "worst_case_planted": bool(worst) and all(r["distinct_min"] == r["distinct_max"] == r["distinct_worst"]
                                                      for r in worst),
            "realistic_in_range": bool(real) and all(k <= r["distinct_min"] and
                                                     r["distinct_max"] <= min(e, r["rows"] * k) for r in real),
            "one_row_is_plain": bool(real) and real[0]["bytes"] == b.plain()}


def bench_moe(shape: str, device: str, dtype: str, layers: int | None, prompt_len: int, n: int, rows: int,
              reps: int, log=print, drafts: tuple[str, ...] = (), drafted_n: int | None = None) -> dict[str, Any]:
    """The record; ``drafts``: also the drafted runs of those draft kinds (``moe_drafted``), ``drafted_n`` ids each
    (default min(32, n))."""
    if shape not in MOE_SHAPES:
        raise ValueError(f"--shape {shape!r}: expected one of {', '.join(MOE_SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    s = MOE_SHAPES[shape]
    dev, dt = resolve_device(device), DTYPES[dtype]
    depth = layers or s.fit_layers or s.layers
    if not 1 <= depth <= s.layers or rows < 1 or n < rows or prompt_len < 1:
        raise ValueError(f"--layers {depth} (1..{s.layers}), --rows {rows} (>= 1), -n {n} (>= rows), --prompt-len "
                         f"{prompt_len} (>= 1)")
    nd = min(32, n) if drafted_n is None else drafted_n
    if drafts:
        from .moe_draft_shapes import DRAFTS, check_drafts

        check_drafts(tuple(drafts), shape)                  # the --drafts rule: each a draft the shape has, once
        wide = max(max(DRAFTS[shape][k].grid) for k in drafts)
        if not 1 <= nd <= n or wide > rows:
            raise ValueError(f"--drafted-n {nd} (1..n = {n}), --rows {rows} (>= {wide}, the widest drafted verify; "
                             "or --drafts none)")
    rec: dict[str, Any] = {"bench": "moe", "shape": shape, "shape_facts": s.facts(), "complete": False,
                           "conditions": {**conditions(dev), "device": str(dev), "dtype": dtype,
                                          "prompt_len": prompt_len, "n": n, "layers": depth, "rows": rows,
                                          "reps": reps, "batch": 1, "drafts": list(drafts), "drafted_n": nd}}
    log(f"bench moe shape={shape} layers={depth}/{s.layers} device={dev} "
        f"device_name={rec['conditions']['device_name']!r} dtype={dtype} prompt_len={prompt_len} n={n} rows={rows}")
    t0 = time.perf_counter()
    engine, _ = build_engine(s, dev, dt, depth, prompt_len + n + rows + 8)
    sync(dev)
    b = moe_bytes(engine.t, engine.head, engine.embed, s.top_k, s.experts)
    full = b.scaled(_moe_layers(s, s.layers), s.layers, depth)
    bw = copy_bandwidth(dev)
    rec["bytes"] = {"dense": b.dense, "head": b.head, "embed_row": b.embed_row, "expert_per_layer": b.expert,
                    "plain": b.plain(), "all_experts": b.all_experts(), "plain_full_depth": full.plain(),
                    "made_s": time.perf_counter() - t0}
    rec["bandwidth"] = {"copy_GBps": bw / 1e9, "roofline_tok_s": bw / b.plain(),
                        "roofline_tok_s_full_depth": bw / full.plain()}
    active = b.plain() - b.dense - b.head - b.embed_row
    log(f"weights plain_step_bytes={b.plain()} (dense={b.dense} head={b.head} active_experts={active}) "
        f"all_expert_bytes={b.all_experts()} full_depth_plain_bytes={full.plain()}")
    log(f"bandwidth copy_GBps={bw / 1e9:.0f} roofline_tok_s={bw / b.plain():.1f} "
        f"roofline_tok_s_full_depth={bw / full.plain():.1f}")

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, s.vocab, (prompt_len,), generator=gen).tolist()
    anchor = engine.prefill(prompt).argmax[-1]
    ids, routings, last = [], [], anchor
    engine.verify([last])                                                  # warm-up pass, not committed
    sync(dev)
    t = time.perf_counter()
    for _ in range(n):
        out = engine.verify([last])
        engine.commit(1)
        last = out.argmax[0]
        ids.append(last)
        routings.append(pass_routing(engine, out))
    sync(dev)
    wall = time.perf_counter() - t
    rec["plain"] = {"tok_s": n / wall, "ms_per_id": wall / n * 1e3, "ratio_roofline": n / wall * b.plain() / bw,
                    "distinct_ids": len(set(ids))}
    rec["load"] = _spread(routings, s.experts)
    log(f"plain tok_s={n / wall:.2f} ms_per_id={wall / n * 1e3:.3f} "
        f"ratio_roofline={rec['plain']['ratio_roofline']:.3f} distinct_ids={len(set(ids))}/{n}")
    log("load " + " ".join(f"{k}={v:.3f}" for k, v in rec["load"].items()) + " (expert picks over the plain run, "
        "mean over MoE layers)")

    engine.prefill(prompt)
    cont = ids[:rows - 1]
    rec["verify"] = verify_table(engine, b, anchor, cont, rows, reps, dev, worst=False)
    rec["verify_worst"] = verify_table(engine, b, anchor, cont, rows, reps, dev, worst=True)
    for name, table in (("verify", rec["verify"]), ("worst", rec["verify_worst"])):
        log(f"{name} plain_step_ms={table[0]['ms']:.3f} " + " ".join(
            f"R{r['rows']}={r['rel_plain']:.3f}/d{r['distinct_mean']:.1f}/b{r['bytes_rel']:.2f}" for r in table))
    iters = 20 if dev.type == "cuda" else 2
    try:
        rec["stack"] = stack_table(engine, b, rows, False, iters)
        rec["stack_worst"] = stack_table(engine, b, rows, True, iters)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:         # recorded; the check then fails (exit 1)
        log(f"stack failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        rec["stack"], rec["stack_worst"] = [], []
    for name, table in (("stack", rec["stack"]), ("stack_worst", rec["stack_worst"])):
        if table:
            log(f"{name} graphs={table[0]['graphs']} R1_ms={table[0]['ms']:.3f} " + " ".join(
                f"R{r['rows']}={r['rel']:.3f}/b{r['bytes_rel']:.2f}/{r['GBps_distinct']:.0f}GBps" for r in table))
    rec["policy"] = policy_vs_best(rec["verify"])
    for p in rec["policy"]:
        log(f"cost_policy a={p['accept']} policy_width={p['policy_width']} best_width={p['best_width']} "
            f"policy_over_best={p['policy_over_best']:.3f} best_tok_s_free_draft={p['tok_s_best']:.1f}")
    rec["checks"] = checks(b, rec["verify"], rec["verify_worst"], rec["stack_worst"])
    if drafts:
        from .moe_drafted import bench_drafted

        out = bench_drafted(engine, s, drafts, depth, prompt_len + n + rows + 8, prompt, [anchor, *ids], nd,
                            rec["plain"]["tok_s"], rec["verify"], log)
        rec["drafted"], rec["policy_drafted"] = out["drafted"], out["policy_drafted"]
        rec["checks"].update(out["checks"])
    log("checks " + " ".join(f"{k}={'ok' if v else 'FAILED'}" for k, v in rec["checks"].items()))
    rec["complete"] = True
    return rec


def plot_moe(path: Path, records: list[dict[str, Any]], dense: list[dict[str, Any]]) -> None:
    """Verify cost / plain step against R: each MoE record measured (realistic, worst) and its bytes model,
    beside the dense records' measured verify."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..results.plots import save_png

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in records:
        x = [v["rows"] for v in r["verify"]]
        lab = f"{r['shape']} ({r['conditions']['layers']}/{r['shape_facts']['layers']} layers)"
        p = ax.plot(x, [v["rel_plain"] for v in r["verify"]], "o-", label=f"{lab} measured, router")
        c = p[0].get_color()
        ax.plot(x, [v["rel_plain"] for v in r["verify_worst"]], "s-", color=c, alpha=0.6,
                label=f"{lab} measured, worst")
        ax.plot(x, [v["bytes_rel"] for v in r["verify"]], "--", color=c, label=f"{lab} bytes, router")
        ax.plot(x, [v["bytes_rel"] for v in r["verify_worst"]], ":", color=c, label=f"{lab} bytes, worst")
        if r.get("stack"):
            ax.plot(x, [v["rel"] for v in r["stack"]], "x-.", color=c, label=f"{lab} MoE stack graphed, router")
            ax.plot(x, [v["rel"] for v in r["stack_worst"]], "+-.", color=c, alpha=0.6,
                    label=f"{lab} MoE stack graphed, worst")
    for d in dense:
        ax.plot([v["rows"] for v in d["verify"]], [v["rel_plain"] for v in d["verify"]], "k^-", alpha=0.5,
                label=f"dense {d.get('shape')} measured")
    ax.set_xlabel("rows R in the verify")
    ax.set_ylabel("cost / plain step")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    c0 = records[0]["conditions"] if records else {}
    ax.set_title(f"MoE verify of R rows vs a plain step ({c0.get('device_name', '')}, {c0.get('dtype', '')})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_main(argv: list[str] | None = None) -> int:
    """``python -m bloomery_cli.bench.moe OUT.png MOE.json... [--dense DENSE.json...]``: the plot from records."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="bench_moe")
    ap.add_argument("out", type=Path)
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument("--dense", type=Path, nargs="*", default=[])
    a = ap.parse_args(argv)
    try:
        moe = [json.loads(p.read_text()) for p in a.records]
        dense = [json.loads(p.read_text()) for p in a.dense]
        if any(r.get("bench") != "moe" or not r.get("verify") for r in moe) or any("verify" not in d for d in dense):
            raise ValueError("a record is not a complete moe bench record (or a dense one lacks 'verify')")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot_moe(a.out, moe, dense)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(plot_main())
