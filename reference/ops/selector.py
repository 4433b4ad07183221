"""DFlash2's low-rank top-K path selector and its greedy walk, in float64 (DRAFTERS.md section 3).

Over draft slots j = 1..B-1 (array row j-1), with h_j the final-normed draft hidden [H]:

    l_j        = head(h_j) * output_multiplier ;  l_j = c * tanh(l_j / c) when a softcap c is set
    (U_j, C_j) = topk(l_j, K)        values descending, equal values: the lower token id first
    g_j        = W_hp h_j                                               [r]
    P_1        = (anchor, ..., anchor) (K times) ;  P_j = C_{j-1}       predecessor candidates
    S_j[p, c]  = U_j[c] + sum_r A[P_j[p], r] * g_j[r] * Bs[C_j[c], r]   A predecessor, Bs successor codebook
    walk:      prev = 0 ; for j: idx_j = argmax_c S_j[prev, c] (ties: the lowest c) ; d_j = C_j[idx_j] ; prev = idx_j

One path, not a tree. With Bs = 0, S_j[p, :] = U_j and the walk is the per-slot argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear
from ..xp import common, ns, to_host


@dataclass(frozen=True)
class Selection:
    """unary [J, K], cand [J, K] ids, scores [J, K, K] (S_j[p, c]), idx [J] (walked c), ids [J] = cand[j, idx_j]."""

    unary: np.ndarray
    cand: np.ndarray
    scores: np.ndarray
    idx: np.ndarray
    ids: np.ndarray


def head_logits(final: np.ndarray, head: np.ndarray, multiplier: float = 1.0,
                softcap: float | None = None) -> np.ndarray:
    """final [J, H] (normed), head [V, H] -> l [J, V] = (final head^T) * multiplier, then softcapped."""
    return scaled_logits(linear(final, head), multiplier, softcap)


def scaled_logits(l: np.ndarray, multiplier: float = 1.0, softcap: float | None = None) -> np.ndarray:
    """l [J, V] (= final head^T) -> l * multiplier, then softcapped: softcap tanh(l / softcap)."""
    l = l * multiplier
    return softcap * ns(l).tanh(l / softcap) if softcap else l


def topk(l: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """l [J, V] -> (U [J, K], C [J, K]): the K largest per row, descending, ties to the lower id."""
    xp = ns(l)
    order = xp.argsort(-l, axis=-1, kind="stable")[:, :k]     # equal values keep index order: the lower id first
    return xp.take_along_axis(l, order, -1), order


def predecessors(anchor: int, cand: np.ndarray) -> np.ndarray:
    """P [J, K]: P_1 = anchor repeated, P_j = C_{j-1}."""
    xp = ns(cand)
    return xp.concatenate([xp.full((1, cand.shape[1]), anchor, dtype=cand.dtype), cand[:-1]], axis=0)


def scores(pred: np.ndarray, cand: np.ndarray, unary: np.ndarray, g: np.ndarray, a: np.ndarray,
           bs: np.ndarray) -> np.ndarray:
    """pred [J, P], cand [J, K], unary [J, K], g [J, r], a / bs [V, r] -> S [J, P, K]."""
    xp, pred, cand, unary, g, a, bs = common(pred, cand, unary, g, a, bs)
    return unary[:, None, :] + xp.einsum("jpr,jr,jkr->jpk", a[pred], g, bs[cand])


def walk(s: np.ndarray) -> np.ndarray:
    """The greedy walk over S [J, K, K]: idx [J], prev starts at 0, ties to the lowest index.

    Written as plain Python over the values (the host transcription of the kernel's rule)."""
    prev, out = 0, []
    for sj in np.asarray(to_host(s), dtype=np.float64):
        row = [float(x) for x in sj[prev]]
        best = 0
        for c in range(1, len(row)):
            if row[c] > row[best]:
                best = c
        out.append(best)
        prev = best
    return np.asarray(out, dtype=np.int64)


def select(l: np.ndarray, g: np.ndarray, anchor: int, a: np.ndarray, bs: np.ndarray, k: int) -> Selection:
    """l [J, V] (multiplied / softcapped head logits), g [J, r], codebooks [V, r] -> the walked path."""
    unary, cand = topk(l, k)
    s = scores(predecessors(anchor, cand), cand, unary, g, a, bs)
    xp = ns(s)
    idx = xp.asarray(walk(s))
    return Selection(unary, cand, s, idx, cand[xp.arange(len(idx)), idx])
