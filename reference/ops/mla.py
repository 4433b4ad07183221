"""GLM-5.3's MLA without RoPE, in float64 (docs/FAMILIES_MOE.md section 4.3: ``q_lora_rank``, ``kv_lora_rank``,
``qk_nope_head_dim``, ``v_head_dim``, ``qk_rope_head_dim`` 0; "Positions: NoPE everywhere"; GGUF ``attn_q_a``,
``attn_q_a_norm``, ``attn_q_b``, ``attn_kv_a_mqa``, ``attn_kv_a_norm``, ``attn_k_b`` / ``attn_v_b`` (kv_b split),
``attn_output``; the cache holds the latent).

n heads, key width dn (qk_nope_head_dim), value width dv; weights q_a [ql, H], q_a_norm [ql], q_b [n dn, ql],
kv_a [kl, H], kv_a_norm [kl], kv_b [n (dn + dv), kl], o [H, n dv]:

    q_resid = rms(x_q q_a^T) q_a_norm                 (the DSA indexer reads it too)                [T, ql]
    q       = q_resid q_b^T                                                                       [T, n, dn]
    c_s     = rms(x_s kv_a^T) kv_a_norm               the latent: what the cache keeps, one per row  [L, kl]
    [k_s | v_s] = c_s kv_b^T  per head                                                   [L, n, dn], [L, n, dv]
    out_t   = o( softmax_s( q_t . k_s / sqrt(dn), s in mask[t] ) v )                              [T, H]

No position enters anywhere (no rotary part); the mask (causal, or DSA's chosen tokens) is the only order. The
RMSNorms are plain (w, not 1 + w). Storage points as ``reference.ops.attention.sink_attention`` and the
projections and norms (``st``), as ``kernels.ops.mla`` stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import linear
from ..xp import common
from .attention import sink_attention
from .norm import rms_norm


@dataclass
class MlaWeights:
    """One MLA layer's weights (module docstring)."""

    q_a: np.ndarray
    q_a_norm: np.ndarray
    q_b: np.ndarray
    kv_a: np.ndarray
    kv_a_norm: np.ndarray
    kv_b: np.ndarray
    o: np.ndarray


def q_resid(x: np.ndarray, w: MlaWeights, eps: float) -> np.ndarray:
    """rms(x q_a^T) q_a_norm: x [T, H] -> [T, ql]."""
    return rms_norm(linear(x, w.q_a), w.q_a_norm, eps)


def latent(x: np.ndarray, w: MlaWeights, eps: float) -> np.ndarray:
    """The cached latent rms(x kv_a^T) kv_a_norm: x [L, H] -> [L, kl]."""
    return rms_norm(linear(x, w.kv_a), w.kv_a_norm, eps)


def mla_attention(qr: np.ndarray, c: np.ndarray, mask: np.ndarray, w: MlaWeights, heads: int,
                  dn: int) -> np.ndarray:
    """q_resid [T, ql], latent c [L, kl], mask bool [T, L] -> out [T, H] (module docstring)."""
    _, qr, c, mask = common(qr, c, mask)
    t, length = qr.shape[0], c.shape[0]
    q = linear(qr, w.q_b).reshape(t, heads, dn)
    kv = linear(c, w.kv_b).reshape(length, heads, -1)
    out = sink_attention(q, kv[..., :dn], kv[..., dn:], mask, None)
    return linear(out.reshape(t, -1), w.o)
