"""DFlash2's selector on planted ties, tier 1 (issue 29 part 3).

The fixtures' logits and scores never tie, so the two tie rules of the selector were free to change:

    (U, C)  = topk(l, K)   values descending, equal values by the lower id (the K-th place included)
    idx_j   = the lowest c with S_j[prev, c] = max_c S_j[prev, c]           (the walk's first argmax)

Each case plants ties on purpose, in the draft's own shapes (J = B-1 slots, V, K, r) and in the run's dtype:
l [J, V] float32 small integers 0..3 (every row has ties inside its top K and across the K-th place), g [J, r],
A / Bs [V, r] small integers -1..1 in the run's storage dtype (exact in f32, bf16, f16), so every score
S_j[p, c] = U_j[c] + sum_r A[P_j[p], r] g_j[r] Bs[C_j[c], r] is an integer, exact in float32: the walk's rows
tie too. Half the cases set Bs = 0 (S_j[p, :] = U_j: the walk meets U's ties directly). The kernel's ``select``
(with the draft's own scores-and-walk implementation: torch, or the Triton kernel on CUDA) and the host
reference's must give the same candidates in the same order, the same walked indices and ids.
"""

from __future__ import annotations

import numpy as np
import torch

from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck

from ..kernels.ops import selector as kernel_selector
from ..reference.ops import selector as ref_selector

CASES = 8
SEED = 29


def planted(j: int, v: int, r: int, case: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """One tie case: (l [J, V], g [J, r], A [V, r], Bs [V, r], anchor), small integers as float64."""
    rng = np.random.default_rng([SEED, case])
    l = rng.integers(0, 4, (j, v)).astype(np.float64)
    g = rng.integers(-1, 2, (j, r)).astype(np.float64)
    a = rng.integers(-1, 2, (v, r)).astype(np.float64)
    bs = rng.integers(-1, 2, (v, r)).astype(np.float64) if case % 2 else np.zeros((v, r))
    return l, g, a, bs, int(rng.integers(0, v))


def check_ties(report: Report, c: DraftCheck) -> None:
    d, draft = c.draft_spec, c.draft
    j, k, r = d.block_size - 1, d.selector_top_k, d.selector_rank
    v, dev, dt = draft.a.shape[0], draft.a.device, draft.a.dtype
    differ, where = 0, ""
    for case in range(CASES):
        l, g, a, bs, anchor = planted(j, v, r, case)
        got = kernel_selector.select(torch.tensor(l, dtype=torch.float32, device=dev),
                                     torch.tensor(g, dtype=dt, device=dev), torch.tensor(anchor, device=dev),
                                     torch.tensor(a, dtype=dt, device=dev), torch.tensor(bs, dtype=dt, device=dev),
                                     k, draft.fused)
        want = ref_selector.select(l, g, anchor, a, bs, k)
        pairs = {"candidates": (got.cand, want.cand), "unary": (got.unary, want.unary),
                 "walked indices": (got.idx, want.idx), "ids": (got.ids, want.ids)}
        bad = [name for name, (x, y) in pairs.items()
               if not np.array_equal(x.detach().cpu().double().numpy(), np.asarray(y, dtype=np.float64))]
        if bad:
            differ += 1
            where = where or f"case {case}: {', '.join(bad)}"
    report.ties(f"dflash2 selector top-{k} candidate order and walk (first argmax) [{j} slots x {v}]", CASES,
                differ, where)
