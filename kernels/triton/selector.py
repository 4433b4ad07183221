"""Fused selector scores + greedy walk (Triton): two launches for all B-1 slots of a block.

Scores: one program per slot (n, j), all slots at once (each slot's scores read only its own candidates and its
predecessor's, never the walk):

    pred[p]  = anchor if j == 0 else cand[j-1, p]                      (P_1 = anchor, P_j = C_{j-1})
    S_j[p,c] = unary[j, c] + sum_r A[pred[p], r] * g[j, r] * Bs[cand[j, c], r]     float32, r in tiles of BR

Walk: one program per block n, over the slots j in order, reading the stored scores:

    row      = S_j[prev, :] ;  idx_j = min{c : row[c] == max(row)} ;  ids_j = cand[j, idx_j] ;  prev = idx_j

Top-K (``topk_candidates``, the same signature and results as ``kernels.ops.selector.topk_candidates``): the
rule's int64 key per logit, key = ord(l) * 2^32 + (2^32 - 1 - id) (ord: the float32's order-preserving integer,
-0.0 taken as +0.0), unique per id, so "value descending, id ascending" is "key descending". Stage 1, program (row,
block of BV ids): its block's K largest keys by K max-extractions; stage 2, program row: the K largest of the
row's NB x K keys the same way, the id decoded from the low word and its logit gathered. The global top K lie in
the union of the blocks' top K, so the two stages give torch's ``topk`` over the keys exactly; 2 launches for what
torch ran as ~15 kernels over the [B-1, V] keys.

Same signature and results as ``kernels.ops.selector.scores_and_walk`` (the torch path); the walk
breaks ties to the lowest candidate index, and the scores of every slot are written out (for checks).
The rank r and the slot count J are compile-time constants (fixed per draft; the loops over them unrolled
or bounded at compile time, and the CPU interpreter runs them). Why two launches: one program walking the slots
and gathering the codebook rows of each in turn was latency-bound (0.115 ms for B-1 = 7 slots at K = 16, r = 256
on the H200: ``bloomery bench --profile``'s draft block); the gathers of the slots now run side by side and the
walk reads 7 x K x K floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NEG: tl.constexpr = tl.constexpr(-(2**63))      # below every key (a key's low word is 2^32 - 1 - id > 0 or its
                                                # high word exceeds -2^31): a taken or padded slot
BV = 4096                                       # ids a stage-1 program scans


@triton.jit
def _scores_kernel(cand_ptr, unary_ptr, g_ptr, a_ptr, b_ptr, anchor_ptr, s_ptr, J, K, R: tl.constexpr,
                   KP: tl.constexpr, BR: tl.constexpr):
    slot = tl.program_id(0)            # n * J + j
    n = slot // J
    j = slot % J
    kk = tl.arange(0, KP)
    km = kk < K
    rr = tl.arange(0, BR)
    anchor = tl.load(anchor_ptr + n).to(tl.int64)
    cand = tl.load(cand_ptr + slot * K + kk, mask=km, other=0).to(tl.int64)
    before = tl.load(cand_ptr + (slot - 1) * K + kk, mask=km & (j > 0), other=0).to(tl.int64)
    pred = tl.where(j > 0, before, anchor)
    acc = tl.zeros([KP, KP], dtype=tl.float32)
    for r0 in range(0, R, BR):
        rm = (r0 + rr) < R
        gv = tl.load(g_ptr + slot * R + r0 + rr, mask=rm, other=0.0).to(tl.float32)
        av = tl.load(a_ptr + pred[:, None] * R + r0 + rr[None, :], mask=km[:, None] & rm[None, :],
                     other=0.0).to(tl.float32)
        bv = tl.load(b_ptr + cand[:, None] * R + r0 + rr[None, :], mask=km[:, None] & rm[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum((av * gv[None, :])[:, None, :] * bv[None, :, :], axis=2)
    u = tl.load(unary_ptr + slot * K + kk, mask=km, other=0.0).to(tl.float32)
    tl.store(s_ptr + slot * K * K + kk[:, None] * K + kk[None, :], u[None, :] + acc, mask=km[:, None] & km[None, :])


@triton.jit
def _walk_kernel(cand_ptr, s_ptr, idx_ptr, ids_ptr, J: tl.constexpr, K, KP: tl.constexpr):
    n = tl.program_id(0)
    kk = tl.arange(0, KP)
    km = kk < K
    prev = n * 0
    for j in range(0, J):
        slot = n * J + j
        cand = tl.load(cand_ptr + slot * K + kk, mask=km, other=0).to(tl.int64)
        row = tl.load(s_ptr + slot * K * K + prev * K + kk, mask=km, other=float("-inf"))
        best = tl.max(row, axis=0)
        idx = tl.min(tl.where(km & (row == best), kk, KP), axis=0)
        tl.store(idx_ptr + slot, idx.to(tl.int64))
        tl.store(ids_ptr + slot, tl.sum(tl.where(kk == idx, cand, 0), axis=0))
        prev = idx


def scores_and_walk(cand: torch.Tensor, unary: torch.Tensor, g: torch.Tensor, a: torch.Tensor, bs: torch.Tensor,
                    anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cand / unary [..., J, K], g [..., J, r], a / bs [V, r], anchor [...] ->
    (S [..., J, K, K] float32, idx [..., J] int64, ids [..., J] int64)."""
    *lead, j, k = cand.shape
    r = g.shape[-1]
    n = cand.numel() // (j * k) if j * k else 0
    dev = cand.device
    s = torch.empty(*lead, j, k, k, dtype=torch.float32, device=dev)
    idx = torch.empty(*lead, j, dtype=torch.int64, device=dev)
    ids = torch.empty(*lead, j, dtype=torch.int64, device=dev)
    if n == 0 or j == 0:
        return s, idx, ids
    kp = max(2, triton.next_power_of_2(k))
    br = max(2, min(triton.next_power_of_2(r), 8192 // (kp * kp)))
    anc = anchor.reshape(-1).to(device=dev, dtype=torch.int64).contiguous()
    cand = cand.contiguous().to(torch.int64)
    _scores_kernel[(n * j,)](cand, unary.float().contiguous(), g.contiguous(), a.contiguous(), bs.contiguous(), anc,
                             s, j, k, r, KP=kp, BR=br)
    _walk_kernel[(n,)](cand, s, idx, ids, j, k, KP=kp)
    return s, idx, ids


@triton.jit
def _topk_block_kernel(l_ptr, V, NB, key_ptr, K: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    ids = blk * BV + tl.arange(0, BV)
    m = ids < V
    x = tl.load(l_ptr + row.to(tl.int64) * V + ids, mask=m, other=0.0).to(tl.float32)
    bits = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))                  # -0.0 -> +0.0
    okey = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    key = tl.where(m, okey * 4294967296 + ((4294967296 - ids.to(tl.int64)) - 1), NEG)      # int64 arithmetic
    out = tl.arange(0, KP)
    top = tl.full([KP], NEG, tl.int64)
    for t in tl.static_range(K):
        best = tl.max(key, axis=0)
        top = tl.where(out == t, best, top)
        key = tl.where(key == best, NEG, key)
    tl.store(key_ptr + (row.to(tl.int64) * NB + blk) * K + out, top, mask=out < K)


@triton.jit
def _topk_merge_kernel(key_ptr, l_ptr, V, NB, u_ptr, c_ptr, K: tl.constexpr, BM: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, BM)
    key = tl.load(key_ptr + row.to(tl.int64) * NB * K + i, mask=i < NB * K, other=NEG)
    for t in tl.static_range(K):
        best = tl.max(key, axis=0)
        c = (4294967296 - (best - ((best >> 32) << 32))) - 1             # the low word: 2^32 - 1 - id
        tl.store(c_ptr + row * K + t, c)
        tl.store(u_ptr + row * K + t, tl.load(l_ptr + row.to(tl.int64) * V + c))
        key = tl.where(key == best, NEG, key)


def topk_candidates(l: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """l [..., V] -> (U [..., K] in l's dtype, C [..., K] int64): ``kernels.ops.selector.topk_candidates``' rule
    (module docstring: value descending, equal values by id ascending, across the K-th place too)."""
    *lead, v = l.shape
    if not 1 <= k <= v:
        raise ValueError(f"top-{k} of {v} logits")
    x = l.reshape(-1, v).contiguous()
    rows = x.shape[0]
    u = torch.empty(*lead, k, dtype=l.dtype, device=l.device)
    c = torch.empty(*lead, k, dtype=torch.int64, device=l.device)
    if rows == 0:
        return u, c
    nb = triton.cdiv(v, BV)
    keys = torch.empty(rows * nb * k, dtype=torch.int64, device=l.device)
    _topk_block_kernel[(rows, nb)](x, v, nb, keys, K=k, KP=max(2, triton.next_power_of_2(k)), BV=BV, num_warps=8)
    _topk_merge_kernel[(rows,)](keys, x, v, nb, u, c, K=k, BM=max(2, triton.next_power_of_2(nb * k)), num_warps=4)
    return u, c
