"""qwen4exp's PLE (per-layer n-gram memory), in float64 (docs/FAMILIES_MOE.md section 4.5 "PLE": ``ple_layer_ids``,
``ple_embed_dim``, ``ple_conv_kernel_size``, ``ngram_size``, ``heads_per_ngram``, ``ngram_vocab_size_base``,
``seed``; GGUF ``ple.{ngram_size, heads_per_ngram, conv_kernel, eos_token_id, layer_multipliers, head_offsets,
head_vocab_sizes}``, ``per_layer_token_embd``, ``ple_{key, value, norm_key, norm_query, norm_conv, conv1d}``).

Hashed n-gram ids (integers, exact). With N = ngram_size, m [N] odd multipliers, and for each n = 2..N its
heads_per_ngram heads j with a prime size p_j and an offset o_j into one table:

    history   = [eos] * (N-1) + ids             (or the N-1 ids before, in a continuation)
    tok_k(t)  = history[t - k] if it lies in t's segment, else eos    segments end at (and include) an eos
    hash_n(t) = xor_{k=0}^{n-1} tok_k(t) m_k                           (int64: every product < 2^63)
    id_j(t)   = hash_n(t) mod p_j + o_j                                                     [T, (N-1) heads_per_ngram]

    m_k  = 2 (splitmix64(seed + 10007 l + gamma (k+1)) mod floor(floor((2^63-1) / V) / 2)) + 1   l: the PLE layer's
                                                                                            index, V: the vocab
    p_j  = the (l (N-1) hpn + j + 1)-th prime above base - 1;  o_j = p_0 + .. + p_{j-1}     (``ngram_tables``)

The layer, on the S streams x [T, S*H] (weights: table E [rows, e/heads], key [S*H, e], value [H, e], three
zero-centred grouped norms [S*H], conv [S*H, K] depthwise with dilation N):

    e_t    = concat_j E[id_j(t)]                                                                  [T, e]
    key    = norm_key(key e),  query = norm_query(x),  value = value e           [T, S, H], [T, S, H], [T, H]
    a_s    = key_s . query_s / sqrt(H);   gate_s = sign(a_s) sqrt(max(|a_s|, 1e-6))                [T, S]
    gv_s   = sigmoid(gate_s) value                                               per-stream gate   [T, S*H]
    y[t,c] = sum_{j<K} conv[c, j] z[t - (K-1-j) N, c],  z = norm_conv(gv) (zeros before the start)  dilated
    x'     = x + gv + silu(y)

Storage points (``st``, as ``kernels.ops.ple`` stores them): the embedding rows (weights), key e, the three norms,
value e, gv, y, silu(y), gv + silu(y), x'. The gate a -> sigmoid chain is float32 on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bloomery_gates import ple_hash

from ..rounding import linear, st
from ..xp import common
from .gated_hc import grouped_norm
from .mlp import silu
from .moe import sigmoid


@dataclass
class NgramTables:
    """multipliers [N] int64, sizes and offsets [(N-1) heads_per_ngram] int64 (GGUF stores all three)."""

    multipliers: np.ndarray
    sizes: np.ndarray
    offsets: np.ndarray


@dataclass
class PleWeights:
    """table [rows, e / heads], key [S*H, e], value [H, e], norm_key / norm_query / norm_conv [S*H], conv [S*H, K]."""

    table: np.ndarray
    key: np.ndarray
    value: np.ndarray
    norm_key: np.ndarray
    norm_query: np.ndarray
    norm_conv: np.ndarray
    conv: np.ndarray


def ngram_tables(vocab: int, ngram: int, heads_per_ngram: int, base: int, layer_index: int, seed: int) -> NgramTables:
    """The multipliers, prime head sizes and offsets of the module docstring (l = layer_index), as int64 arrays
    (the integers of ``bloomery_gates.ple_hash.ngram_tables``, which the engine wraps too)."""
    return NgramTables(*(np.array(v, dtype=np.int64)
                         for v in ple_hash.ngram_tables(vocab, ngram, heads_per_ngram, base, layer_index, seed)))


def shifted(hist: np.ndarray, eos: int, n: int) -> list[np.ndarray]:
    """[tok_0, .., tok_{n-1}] over a history hist [L] (module docstring): tok_k(t) = hist[t - k] when t - k >= 0 and
    none of hist[t-k .. t-1] is an eos (the segment test), else eos."""
    xp, hist = common(hist)
    fill = xp.full(hist.shape, eos, dtype=hist.dtype)
    out, ok = [hist], xp.ones(hist.shape, dtype=bool)
    for k in range(1, n):
        back = xp.concatenate([fill[:k], hist[:-k]])               # hist[t - k], eos before the start
        ok = ok & xp.concatenate([xp.zeros(k, dtype=bool), xp.ones(hist.shape[0] - k, dtype=bool)]) & (back != eos)
        out.append(xp.where(ok, back, eos))
    return out


def ngram_ids(ids: np.ndarray, context: np.ndarray, tables: NgramTables, eos: int, heads_per_ngram: int) -> np.ndarray:
    """ids [T], context [N-1] (the ids before; eos at a sequence start) -> hashed ids [T, (N-1) hpn] int64."""
    xp, ids, context, mult, sizes, offsets = common(ids, context, tables.multipliers, tables.sizes, tables.offsets)
    n = mult.shape[0]
    hist = xp.concatenate([context, ids]).astype(np.int64)
    toks = [tok * mult[k] for k, tok in enumerate(shifted(hist, eos, n))]
    blocks = []
    for g in range(2, n + 1):
        h = toks[0]
        for k in range(1, g):
            h = h ^ toks[k]
        j = slice((g - 2) * heads_per_ngram, (g - 1) * heads_per_ngram)
        blocks.append(h[:, None] % sizes[j][None, :] + offsets[j][None, :])
    return xp.concatenate(blocks, axis=1)[n - 1:]


def dilated_conv(z: np.ndarray, w: np.ndarray, dilation: int, tail: np.ndarray | None = None) -> np.ndarray:
    """y[t, c] = sum_j w[c, j] zz[t + j d, c], zz = [tail ; z] (tail: the (K-1) d rows before, zeros at a start)."""
    xp, z, w, tail = common(z, w, tail)
    t, k = z.shape[0], w.shape[-1]
    if tail is None:
        tail = xp.zeros(((k - 1) * dilation, z.shape[1]))
    zz = xp.concatenate([tail, z], axis=0)
    return st(sum(w[:, j] * zz[j * dilation:j * dilation + t] for j in range(k)))


def ple_layer(x: np.ndarray, hashed: np.ndarray, w: PleWeights, streams: int, dilation: int, eps: float,
              tail: np.ndarray | None = None) -> np.ndarray:
    """x [T, S*H] -> x + gv + silu(conv(norm_conv(gv))) [T, S*H] (module docstring); hashed [T, heads]."""
    xp, x, hashed = common(x, hashed)
    t, sh = x.shape
    h = sh // streams
    e = w.table[hashed].reshape(t, -1)
    key = grouped_norm(linear(e, w.key), w.norm_key, h, eps).reshape(t, streams, h)
    query = grouped_norm(x, w.norm_query, h, eps).reshape(t, streams, h)
    value = linear(e, w.value)
    a = (key * query).sum(axis=-1) / np.sqrt(h)
    gate = xp.sign(a) * xp.sqrt(xp.maximum(xp.abs(a), 1e-6))
    gv = st(sigmoid(gate)[:, :, None] * value[:, None, :]).reshape(t, sh)
    y = dilated_conv(grouped_norm(gv, w.norm_conv, h, eps), w.conv, dilation, tail)
    return st(x + st(gv + st(silu(y))))
