"""Mixture-of-experts blocks on the device (torch, CPU or CUDA); the math is in ``reference.ops.moe`` (name for
name). Rows x [N, H]; E experts, k chosen; fused weights gate_up [E, 2I, H], down [E, H, I] as HF stores them.

Routers work in float32 (router logits l = x Wr^T with both cast to float32; never stored in the run dtype) and
choose with ``topk_stable``: a stable descending sort, so equal scores go to the lower expert index (the stated
tie rule, reproduced exactly by the host transcription ``reference.ops.moe`` run on these float32 scores).

Routed experts, gather-based: the (row, slot) pairs are taken in chunks; each pair's expert matrices are gathered
(gate_up[ids] [P, 2I, H], down[ids] [P, H, I]) and applied with one batched matrix-vector product, so at a given
row count a row's numbers depend only on that row (never on which other rows share its expert; the gates' passes
have equal row counts, padded):

    y_p = down_{e_p} ( silu(g_p) * u_p ),  [g_p | u_p] = gate_up_{e_p} x_{t_p}           (run dtype)
    out_t = sum_j w_tj y_tj                                     float32 accumulation, stored in the run dtype
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .mlp import swiglu

T = torch.Tensor
GATHER_BUDGET = 1 << 28          # bytes of gathered expert weights per chunk (at least one pair per chunk)


@dataclass
class Routing:
    """ids [N, k] int64 (choice order), weights [N, k] float32, choice [N, E] float32 (what was ranked)."""

    ids: T
    weights: T
    choice: T


def topk_stable(x: T, k: int) -> T:
    """Indices of the k largest along the last axis, value descending, equal values by lower index."""
    return torch.sort(x, dim=-1, descending=True, stable=True)[1][..., :k]


def router_logits(x: T, w: T) -> T:
    """l = x Wr^T in float32: x [N, H], Wr [E, H] -> [N, E]."""
    return F.linear(x.float(), w.float())


def softmax_topk(logits: T, k: int) -> Routing:
    """ids = topk_stable(l, k); w = softmax of the chosen logits (= softmax over all, renormalised)."""
    ids = topk_stable(logits, k)
    return Routing(ids, torch.softmax(logits.gather(-1, ids), dim=-1), logits)


def group_limited_choice(choice: T, k: int, n_group: int, topk_group: int) -> T:
    """Keep the ``topk_group`` groups with the largest sum of their 2 best choice scores; top-k over those."""
    n, e = choice.shape
    per = e // n_group
    grouped = choice.view(n, n_group, per)
    top2 = grouped.gather(-1, topk_stable(grouped, min(2, per)))
    gscore = top2[..., 0] + top2[..., 1] if per >= 2 else top2[..., 0]
    keep = torch.zeros(n, n_group, dtype=torch.bool, device=choice.device)
    keep.scatter_(1, topk_stable(gscore, topk_group), True)
    masked = choice.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    return topk_stable(masked, k)


def sigmoid_group_topk(logits: T, bias: T, k: int, n_group: int = 1, topk_group: int = 1, norm: bool = True,
                       scale: float = 1.0) -> Routing:
    """s = sigmoid(l); choose on s + bias (group-limited); weights from the unbiased s, renormalised, scaled."""
    s = torch.sigmoid(logits)
    c = s + bias.float()
    ids = group_limited_choice(c, k, n_group, topk_group)
    w = s.gather(-1, ids)
    if norm:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return Routing(ids, w * scale, c)


def routed_experts(x: T, routing: Routing, gate_up: T, down: T, budget: int = GATHER_BUDGET) -> T:
    """x [N, H] -> [N, H] in x's dtype (see the module docstring)."""
    n, k = routing.ids.shape
    i = down.shape[-1]
    flat_ids = routing.ids.reshape(-1)
    rows = torch.arange(n, device=x.device).repeat_interleave(k)
    per_pair = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    chunk = max(1, budget // per_pair)
    ys = []
    for s in range(0, n * k, chunk):
        e, xr = flat_ids[s:s + chunk], x[rows[s:s + chunk]]
        gu = torch.bmm(gate_up[e], xr[:, :, None])[..., 0]                    # [P, 2I]
        a = F.silu(gu[:, :i]) * gu[:, i:]
        ys.append(torch.bmm(down[e], a[:, :, None])[..., 0])                   # [P, H]
    y = torch.cat(ys).view(n, k, -1).float()
    return (routing.weights.float()[..., None] * y).sum(1).to(x.dtype)


def shared_expert(x: T, w_gate: T, w_up: T, w_down: T, gate: T | None) -> T:
    """swiglu(x) [N, H], times sigmoid(x Wsg^T) [N, 1] when the gate Wsg [1, H] is given (Qwen), else plain."""
    y = swiglu(x, w_gate, w_up, w_down)
    return y if gate is None else y * torch.sigmoid(F.linear(x, gate))


def moe_block(x: T, routing: Routing, gate_up: T, down: T, shared: tuple[T, T, T, T | None] | None) -> T:
    """routed_experts(x) + shared_expert(x) when ``shared`` = (Wg, Wu, Wd, gate or None) is given."""
    out = routed_experts(x, routing, gate_up, down)
    return out if shared is None else out + shared_expert(x, *shared)


def routed_experts_dense(x: T, routing: Routing, gate_up: T, down: T) -> T:
    """The same as ``routed_experts`` with every expert on every row and the unchosen ones weighted 0 (differentiable
    and fast for training over many rows; the engine runs ``routed_experts``)."""
    n, e, i = x.shape[0], gate_up.shape[0], down.shape[-1]
    dense_w = torch.zeros(n, e, device=x.device, dtype=routing.weights.dtype).scatter(1, routing.ids, routing.weights)
    gu = torch.einsum("nh,eoh->neo", x, gate_up)
    y = torch.einsum("nei,ehi->neh", F.silu(gu[..., :i]) * gu[..., i:], down)
    return (dense_w[..., None] * y.float()).sum(1).to(x.dtype)
