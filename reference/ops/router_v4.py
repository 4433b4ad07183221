"""DeepSeek V4's router (docs/FAMILIES_MOE.md section 4.4 "Router" and "Hash layers"; HF
``DeepseekV4TopKRouter`` / ``DeepseekV4HashRouter``), in float64. Rows x [T, H], router Wr [E, H], k chosen:

    l = x Wr^T                                   [T, E]  (float32 on the device, never stored in the run dtype)
    s = sqrt(softplus(l)),  softplus(l) = max(l, 0) + log1p(exp(-|l|))          the "sqrtsoftplus" score

  learned layers (``sqrtsoftplus_topk``):
    c = s + b                                    b = e_score_correction_bias [E]: the CHOICE only
    ids = topk_stable(c, k)                      value descending, equal values by lower expert index
    w_j = s_{ids_j} / (sum_i s_{ids_i} + 1e-20) * routed_scaling_factor   UNBIASED scores, always renormalised

  hash layers (the first ``hash_layer_count`` / ``mlp_layer_types == "hash_moe"`` layers, ``hash_route``):
    ids = tid2eid[token_id]                      tid2eid [V, k] int: a frozen token id -> expert ids table
    w_j = s_{ids_j} / (sum_i s_{ids_i} + 1e-20) * routed_scaling_factor          (no bias, no choice)

There are no expert groups and ``norm_topk_prob`` is unused (always renormalised). The ids are integers: the gates
check them exactly (tier 1, ``gates.moe_checks``): a learned layer's against ``topk_stable`` of the device's own
float32 choice scores, a hash layer's against the table lookup on the host. HF takes its top-k unsorted; the
chosen set is the same (ties aside), the order here is the stated one.
"""

from __future__ import annotations

import numpy as np

from ..xp import common, ns
from .moe import Routing, chosen, topk_stable


def sqrt_softplus(logits: np.ndarray) -> np.ndarray:
    """sqrt(softplus(l)) in the overflow-free form: [..., E] -> [..., E]."""
    xp = ns(logits)
    return xp.sqrt(xp.maximum(logits, 0.0) + xp.log1p(xp.exp(-xp.abs(logits))))


def renormalised(s: np.ndarray, ids: np.ndarray, scale: float) -> np.ndarray:
    """w = s[ids] / (sum s[ids] + 1e-20) * scale: s [T, E], ids [T, k] -> [T, k]."""
    xp = ns(s)
    w = xp.take_along_axis(s, ids, axis=-1)
    return w / (w.sum(axis=-1, keepdims=True) + 1e-20) * scale


def sqrtsoftplus_topk(logits: np.ndarray, bias: np.ndarray, k: int, scale: float = 1.0) -> Routing:
    """A learned layer's routing (module docstring): logits [T, E], bias [E] -> Routing (choice = s + b)."""
    _, logits, bias = common(logits, bias)
    s = sqrt_softplus(logits)
    c = s + bias
    ids = chosen(c, topk_stable(c, k))
    return Routing(ids, renormalised(s, ids, scale), c)


def hash_ids(tid2eid: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """ids = tid2eid[token_ids]: tid2eid [V, k], token_ids [T] -> [T, k] int64 (a token outside the table raises)."""
    xp = ns(tid2eid)
    t = xp.asarray(token_ids).astype(np.int64)
    if t.size and (int(t.min()) < 0 or int(t.max()) >= tid2eid.shape[0]):
        raise ValueError(f"token id outside the hash table of {tid2eid.shape[0]} rows")
    return tid2eid[t].astype(np.int64)


def hash_route(logits: np.ndarray, tid2eid: np.ndarray, token_ids: np.ndarray, scale: float = 1.0) -> Routing:
    """A hash layer's routing (module docstring): logits [T, E], tid2eid [V, k], token_ids [T] -> Routing
    (choice = s, which ranks nothing here: the table chose)."""
    s = sqrt_softplus(common(logits)[1])
    ids = hash_ids(tid2eid, token_ids)
    return Routing(ids, renormalised(s, ids, scale), s)
