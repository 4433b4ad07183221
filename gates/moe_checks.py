"""Checks of the MoE blocks a gate runs (kernels.ops.moe against reference.ops.moe).

Tier 1, the chosen experts: the device's ids [N, k] against the host transcription of the device's own rule
(``reference.ops.moe.topk_stable`` / ``group_limited_choice``) run on the device's own float32 choice scores
[N, E]. Both break ties by the lower expert index, so the two must be equal row for row: no excuse, no band.
The expert load (how many (row, slot) picks each expert got) goes to the record, so a router that collapsed onto
one expert is visible.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bloomery_cli.bands import Op, chain_band, worst_rel
from bloomery_cli.contract import Report

from ..kernels.ops import moe as kmoe
from ..kernels.ops.moe import Routing
from ..reference.ops import moe as rmoe

Rule = Callable[[np.ndarray], np.ndarray]      # float32 choice scores [N, E] -> ids [N, k]
HOST = "host transcription of the kernel's rule"


def softmax_rule(k: int) -> Rule:
    """The softmax top-k router's choice: topk_stable of the logits."""
    return lambda c: rmoe.topk_stable(c, k)


def group_rule(k: int, n_group: int, topk_group: int) -> Rule:
    """The sigmoid router's choice: group-limited topk_stable of sigmoid(l) + bias."""
    return lambda c: rmoe.group_limited_choice(c, k, n_group, topk_group)


def moe_ops(hidden: int, expert_ff: int, k: int, shared_ff: int | None, gated: bool) -> list[Op]:
    """The reductions one MoE block chains (for the band's float32 accumulation term): router, gate/up, down, the
    k-way weighted sum, and the shared expert (its gate) when present."""
    ops = [Op("router", hidden), Op("expert gate/up", hidden), Op("silu(gate) * up", 1), Op("expert down", expert_ff),
           Op("weighted sum", k)]
    if shared_ff is not None:
        ops += [Op("shared gate/up", hidden), Op("shared down", shared_ff), Op("routed + shared", 1)]
        ops += [Op("shared_expert_gate", hidden)] if gated else []
    return ops


def expert_load(ids: np.ndarray, num_experts: int) -> list[int]:
    """Picks per expert over all (row, slot) pairs of ids [N, k]."""
    return np.bincount(ids.reshape(-1), minlength=num_experts).tolist()


def chosen_experts(report: Report, what: str, routing: Routing, rule: Rule) -> bool:
    """(r) <what> chosen experts [N x k] vs the host transcription: N checked, rows that differ (must be 0)."""
    got = routing.ids.detach().cpu().numpy()
    want = rule(routing.choice.detach().float().cpu().numpy())
    n, k = got.shape
    differ = int((got != want).any(axis=-1).sum())
    report.facts.setdefault("expert_load", {})[what] = expert_load(got, routing.choice.shape[-1])
    return report.integer_match(f"{what} chosen experts [{n}x{k}]", n, differ, 0, ref=HOST)


def rule_of(moe) -> Rule:
    """The host transcription of the device router of ``moe`` (``bloomery_gates.spec.MoEShape``)."""
    return softmax_rule(moe.top_k) if moe.router == "softmax" else group_rule(moe.top_k, moe.n_group, moe.topk_group)


def check_routing(report: Report, spec, prefill, dtype: str) -> None:
    """Tier 1 for every MoE layer of the prefill pass: ``(r) target layer <l> chosen experts [T x k] vs host
    transcription of the kernel's rule: T checked, 0 differ``; the load per expert goes to the record."""
    rule = rule_of(spec.moe)
    for l, routing in sorted((prefill.routing or {}).items()):
        chosen_experts(report, f"target layer {l}", routing, rule)


PROBE_SCALE = 2.5          # a routed scaling factor that is not 1: the fixtures' is 1.0, which hides where it goes
PROBE_ROWS = 64


def routed_scale_probe(report: Report, moe, bias: torch.Tensor, seed: int = 29) -> bool:
    """Tier 2 on a planted input (issue 29 part 5): the sigmoid router's weights at ``routed_scaling_factor``
    PROBE_SCALE, kernel (``kernels.ops.moe.sigmoid_group_topk``, float32) against the reference (float64), on
    seeded logits [PROBE_ROWS, E] and the checkpoint's own score bias, with its top-k, groups and normalisation.
    With the fixture's factor 1.0 a factor applied before the renormalisation cancels out and no run can see it;
    at 2.5 it moves every weight by 2.5x. The ids must be equal (exact, no band), the weights within the float32
    chain's band (sigmoid, the k-way sum, the division, the scale)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(PROBE_ROWS, bias.shape[-1], generator=gen) * 2.0
    b = bias.detach().float().cpu()
    got = kmoe.sigmoid_group_topk(logits, b, moe.top_k, moe.n_group, moe.topk_group, moe.norm_topk, PROBE_SCALE)
    want = rmoe.sigmoid_group_topk(logits.double().numpy(), b.double().numpy(), moe.top_k, moe.n_group,
                                   moe.topk_group, moe.norm_topk, PROBE_SCALE)
    what = f"router weights at routed_scaling_factor {PROBE_SCALE:g} (probe) [{PROBE_ROWS}x{moe.top_k}]"
    same = bool(np.array_equal(got.ids.numpy(), np.asarray(want.ids)))
    ok = report.integer_match(f"{what} ids", PROBE_ROWS, 0 if same else PROBE_ROWS, 0, ref=HOST)
    band = chain_band("f32", [Op("sigmoid", 1), Op("weight sum", moe.top_k), Op("divide", 1), Op("scale", 1)],
                      what)
    worst = worst_rel(got.weights.double().numpy(), np.asarray(want.weights))
    return report.reference(what, got.weights.numel(), worst, band.value) and ok
