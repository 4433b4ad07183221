"""DFlash2's top-K path selector on the device, plain torch path (DRAFTERS.md section 3).

Leading batch axes are allowed everywhere ([..., J, ...], J = B-1 draft slots):

    l          = (final head^T) * output_multiplier ; c * tanh(l / c) if softcapped       float32 [..., J, V]
    (U, C)     = topk(l, K)  sorted by value descending, equal values by id ascending   [..., J, K]
    P_1 = anchor (x K) ; P_j = C_{j-1}                                                  [..., J, K]
    S_j[p, c]  = U_j[c] + sum_r A[P_j[p], r] g_j[r] Bs[C_j[c], r]      float32        [..., J, K, K]
    walk: prev = 0 ; idx_j = lowest c with S_j[prev, c] = max_c S_j[prev, c] ; d_j = C_j[idx_j] ; prev = idx_j

``scores_and_walk`` has the same signature and results as the fused Triton kernel
(``kernels.triton.selector``). ``scores`` is differentiable (training uses it with one predecessor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Selection:
    """unary / cand [..., J, K], scores [..., J, K, K], idx / ids [..., J] (int64)."""

    unary: torch.Tensor
    cand: torch.Tensor
    scores: torch.Tensor
    idx: torch.Tensor
    ids: torch.Tensor


def head_logits(final: torch.Tensor, head: torch.Tensor, multiplier: float = 1.0,
                softcap: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """final [..., H], head [V, H] -> float32 logits [..., V] (product in the storage dtype); into ``out`` (float32,
    the same values: the product cast into it, then scaled and capped in place) when given."""
    if out is not None:
        l = out.copy_(F.linear(final, head))
        if multiplier != 1.0:
            l.mul_(multiplier)
        return l.div_(softcap).tanh_().mul_(softcap) if softcap else l
    l = F.linear(final, head).float()
    if multiplier != 1.0:
        l = l * multiplier
    return softcap * torch.tanh(l / softcap) if softcap else l


def topk_candidates(l: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """l [..., V] -> (U, C) [..., K]: the K largest, value descending, equal values by id ascending, across the
    K-th place too (which of several tied values get in is the rule's, not torch.topk's: its choice among ties is
    unspecified and was seen to take higher ids at V = 101, issue 29's planted ties).

    The selection runs on one int64 key that orders (value descending, id ascending) exactly: the float32 value's
    order-preserving integer (its int32 bits, the lower 31 flipped when negative; -0.0 made +0.0 first) in the
    high word, ``2^32 - 1 - id`` in the low word."""
    x = l.float() + 0.0                                            # -0.0 -> +0.0: equal values, equal keys
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)           # monotone in the float's value
    ids = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    _, c = torch.topk(key * 2**32 + (2**32 - 1 - ids), k, dim=-1, sorted=True)
    return l.gather(-1, c), c


def predecessors(anchor: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """anchor [...], cand [..., J, K] -> P [..., J, K] (P_1 = anchor repeated, P_j = C_{j-1})."""
    first = anchor.to(cand.dtype)[..., None, None].expand(*cand.shape[:-2], 1, cand.shape[-1])
    return torch.cat([first, cand[..., :-1, :]], dim=-2)


def scores(pred: torch.Tensor, cand: torch.Tensor, unary: torch.Tensor, g: torch.Tensor, a: torch.Tensor,
           bs: torch.Tensor) -> torch.Tensor:
    """pred [..., J, P], cand [..., J, K], unary [..., J, K], g [..., J, r], a / bs [V, r] -> S [..., J, P, K]."""
    ap, bc = F.embedding(pred, a).float(), F.embedding(cand, bs).float()               # [..., J, P|K, r]
    return unary.float()[..., None, :] + torch.einsum("...pr,...kr->...pk", ap * g.float()[..., None, :], bc)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the maximum over the last axis, the lowest index on ties (int64)."""
    n = x.shape[-1]
    idx = torch.arange(n, device=x.device).expand_as(x)
    return torch.where(x == x.amax(-1, keepdim=True), idx, n).amin(-1)


def walk(s: torch.Tensor) -> torch.Tensor:
    """S [..., J, K, K] -> idx [..., J]: prev = 0, idx_j = first_argmax(S_j[prev, :]), prev = idx_j."""
    k = s.shape[-1]
    prev = torch.zeros(s.shape[:-3], dtype=torch.long, device=s.device)
    out = []
    for j in range(s.shape[-3]):
        row = s[..., j, :, :].gather(-2, prev[..., None, None].expand(*prev.shape, 1, k)).squeeze(-2)
        prev = first_argmax(row)
        out.append(prev)
    return torch.stack(out, dim=-1)


def scores_and_walk(cand: torch.Tensor, unary: torch.Tensor, g: torch.Tensor, a: torch.Tensor, bs: torch.Tensor,
                    anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (S [..., J, K, K] float32, idx [..., J], ids [..., J]): every slot's scores and the walked path."""
    s = scores(predecessors(anchor, cand), cand, unary, g, a, bs)
    idx = walk(s)
    return s, idx, cand.gather(-1, idx[..., None]).squeeze(-1)


def select(l: torch.Tensor, g: torch.Tensor, anchor: torch.Tensor, a: torch.Tensor, bs: torch.Tensor, k: int,
           fused=scores_and_walk, topk=None) -> Selection:
    """l [..., J, V] float32 logits, g [..., J, r], anchor [...] -> the Selection (``fused``: the
    scores-and-walk implementation, this torch path or the Triton kernel; ``topk`` likewise the top-K)."""
    unary, cand = (topk or topk_candidates)(l, k)        # None: this module's top-K, looked up at the call
    s, idx, ids = fused(cand, unary, g, a, bs, anchor)
    return Selection(unary, cand, s, idx, ids)
