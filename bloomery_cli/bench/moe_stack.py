"""The MoE bench's device-bound view: every MoE FFN of the target (router, routed experts, shared expert) on R
rows, one CUDA graph per (R, routing) replayed back to back, so that what is timed is the device's work on the
expert bytes and not the eager engine's launches and host time (the engine's own verify is timed in bench_moe).

Rows x [1, R, H] ~ N(0, 1) in the run dtype (RMS 1, as the normed rows the FFN sees); every MoE layer l reads the
same x with its own router, so the rows route as the engine's rows do (bench_moe_shapes' router). The worst case
plants disjoint expert sets (``ffn.forced_routing``). Bytes of the stack at R rows (moe_bytes' split):

    stack_bytes(R) = sum_l ( ffn_l + d_l(R) b_l )       ffn_l: layer l's router and shared expert, b_l: one expert

and ``gathered`` = sum_l R k b_l, what the gather-based ``routed_experts`` reads (one expert's matrices per
(row, slot) pair, repeats included). GB/s are reported on both.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from bloomery_gates.kernels.families.ffn import forced_routing, route
from bloomery_gates.kernels.graphs import GraphSet, time_replays
from bloomery_gates.kernels.ops.moe import Routing

from .moe_bytes import MoEBytes, disjoint_ids, distinct_of

T = torch.Tensor


def moe_layers(engine) -> list[int]:
    spec = engine.spec
    mimo = getattr(spec, "mimo", None)
    return [l for l in range(spec.num_layers) if mimo is None or mimo.mlp_types[l] == "sparse"]


def _moe_shape(engine):
    mimo = getattr(engine.spec, "mimo", None)
    return mimo.moe if mimo is not None else engine.spec.moe


def stack_fn(engine) -> Callable[[T], T]:
    """x [1, R, H] -> x + sum over MoE layers of that layer's FFN(x)."""
    spec, t, layers = engine.spec, engine.t, moe_layers(engine)
    if getattr(spec, "mimo", None) is not None:
        from bloomery_gates.kernels.families.mimo2.model import ffn

        def one(x: T, l: int) -> T:
            return ffn(spec, t, l, x)
    else:
        from bloomery_gates.kernels.families.ffn import moe_ffn

        def one(x: T, l: int) -> T:
            return moe_ffn(spec, t, f"model.layers.{l}.", x)

    def run(x: T) -> T:
        acc = x
        for l in layers:
            acc = acc + one(x, l)
        return acc
    return run


def ffn_bytes(engine) -> dict[int, int]:
    """Per MoE layer, the bytes of its FFN that every row count reads whole (router, bias, shared expert)."""
    out = {}
    for l in moe_layers(engine):
        p = f"model.layers.{l}.mlp."
        out[l] = sum(x.numel() * x.element_size() for n, x in engine.t.items()
                     if n.startswith(p) and ".experts." not in n)
    return out


def stack_table(engine, b: MoEBytes, rows: int, worst: bool, iters: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """R = 1..rows: seconds per replay of the MoE stack (CUDA graphs on CUDA), distinct experts, bytes, GB/s."""
    dev, moe = engine.device, _moe_shape(engine)
    h, layers = engine.shape.hidden_size, moe_layers(engine)
    fixed = ffn_bytes(engine)
    run = stack_fn(engine)
    gen = torch.Generator(device=dev).manual_seed(seed)
    xs = {r: torch.randn(1, r, h, generator=gen, device=dev, dtype=engine.dtype) for r in range(1, rows + 1)}

    def plant(r: Routing) -> Routing:
        return Routing(disjoint_ids(r.ids.shape[0], moe.top_k, moe.num_experts, r.ids.device), r.weights, r.choice)

    def body(r: int) -> None:
        if worst:
            with forced_routing(plant):
                run(xs[r])
        else:
            run(xs[r])

    graphs = GraphSet(body, dev)
    table = []
    for r in range(1, rows + 1):
        with forced_routing(plant) if worst else nullcontext():
            d = {l: distinct_of(route(moe, engine.t, f"model.layers.{l}.mlp.", xs[r][0]).ids) for l in layers}
        graphs.capture(r)
        s = time_replays(lambda r=r: graphs.run(r), dev, iters)
        nbytes = sum(fixed.values()) + sum(d[l] * b.expert[l] for l in layers)
        gathered = sum(fixed.values()) + b.gathered(r)
        table.append({"rows": r, "ms": s * 1e3, "distinct_mean": sum(d.values()) / len(d), "bytes": nbytes,
                      "gathered_bytes": gathered, "GBps_distinct": nbytes / s / 1e9,
                      "GBps_gathered": gathered / s / 1e9, "graphs": graphs.enabled})
    for row in table:
        row["rel"] = row["ms"] / table[0]["ms"]
        row["bytes_rel"] = row["bytes"] / table[0]["bytes"]
    return table
