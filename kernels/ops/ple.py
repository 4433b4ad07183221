"""qwen4exp's PLE (per-layer hashed n-gram memory) on the device (torch, CPU or CUDA); the math, the tables and the
storage points are in ``reference.ops.ple`` (name for name; docs/FAMILIES_MOE.md section 4.5 "PLE").

The hashed ids are int64 (every product id * m_k < 2^63 by the multipliers' bound, so no wrap); the tables
(multipliers, prime sizes, offsets) come from the checkpoint (GGUF ``ple.*``) or ``ngram_tables`` (HF's inputs).
The per-stream gate chain is float32; every stored output is rounded once to x's dtype. The dilated conv sums its K
taps in float32 in a fixed order, so a row's value depends only on its own inputs (its tail: the (K-1) N rows before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates import ple_hash

from .gated_hc import grouped_norm

T = torch.Tensor


@dataclass
class PleWeights:
    """table [rows, e / heads], key [S*H, e], value [H, e], norm_key / norm_query / norm_conv [S*H], conv [S*H, K]."""

    table: T
    key: T
    value: T
    norm_key: T
    norm_query: T
    norm_conv: T
    conv: T


def shifted(hist: T, eos: int, n: int) -> list[T]:
    """[tok_0, .., tok_{n-1}]: tok_k(t) = hist[t - k] if t >= k and no eos in hist[t-k .. t-1], else eos."""
    out, ok = [hist], torch.ones_like(hist, dtype=torch.bool)
    for k in range(1, n):
        back = torch.cat([hist.new_full((k,), eos), hist[:-k]])
        ok = ok & (torch.arange(len(hist), device=hist.device) >= k) & (back != eos)
        out.append(torch.where(ok, back, eos))
    return out


def ngram_ids(ids: T, context: T, multipliers: T, sizes: T, offsets: T, eos: int, heads_per_ngram: int) -> T:
    """ids [T], context [N-1] -> hashed ids [T, (N-1) hpn] int64 (``reference.ops.ple.ngram_ids``)."""
    n = multipliers.shape[0]
    hist = torch.cat([context, ids]).long()
    toks = [tok * multipliers[k] for k, tok in enumerate(shifted(hist, eos, n))]
    blocks = []
    for g in range(2, n + 1):
        h = toks[0]
        for k in range(1, g):
            h = torch.bitwise_xor(h, toks[k])
        j = slice((g - 2) * heads_per_ngram, (g - 1) * heads_per_ngram)
        blocks.append(torch.remainder(h[:, None], sizes[j][None, :]) + offsets[j][None, :])
    return torch.cat(blocks, dim=1)[n - 1:]


def dilated_conv(z: T, w: T, dilation: int, tail: T | None = None) -> T:
    """z [T, C], w [C, K], tail [(K-1) d, C] or None (zeros) -> y [T, C] in z's dtype (float32 taps, fixed order)."""
    k, t = w.shape[-1], z.shape[0]
    if tail is None:
        tail = z.new_zeros((k - 1) * dilation, z.shape[1])
    zz, w32 = torch.cat([tail.to(z.dtype), z]).float(), w.float()
    acc = w32[:, 0] * zz[0:t]
    for j in range(1, k):
        acc = acc + w32[:, j] * zz[j * dilation:j * dilation + t]
    return acc.to(z.dtype)


def ple_layer(x: T, hashed: T, w: PleWeights, streams: int, dilation: int, eps: float, tail: T | None = None) -> T:
    """x [T, S*H], hashed [T, heads] -> x + gv + silu(conv(norm_conv(gv))) in x's dtype."""
    t, sh = x.shape
    h = sh // streams
    e = w.table[hashed].reshape(t, -1)
    key = grouped_norm(F.linear(e, w.key), w.norm_key, h, eps).view(t, streams, h).float()
    query = grouped_norm(x, w.norm_query, h, eps).view(t, streams, h).float()
    value = F.linear(e, w.value)
    a = (key * query).sum(-1) / h ** 0.5
    gate = a.sign() * a.abs().clamp_min(1e-6).sqrt()
    gv = (torch.sigmoid(gate)[:, :, None] * value.float()[:, None, :]).to(x.dtype).reshape(t, sh)
    y = dilated_conv(grouped_norm(gv, w.norm_conv, h, eps), w.conv, dilation, tail)
    return (x.float() + (gv.float() + F.silu(y)).to(x.dtype).float()).to(x.dtype)


def ngram_tables(vocab: int, ngram: int, heads_per_ngram: int, base: int, layer_index: int, seed: int,
                 device: torch.device | str = "cpu") -> tuple[T, T, T]:
    """(multipliers [N], prime sizes [(N-1) hpn], offsets [(N-1) hpn]) int64 on ``device`` from HF's hashing inputs
    (``bloomery_gates.ple_hash``), for an HF checkpoint, whose file does not carry them."""
    return tuple(torch.tensor(v, dtype=torch.int64, device=device)
                 for v in ple_hash.ngram_tables(vocab, ngram, heads_per_ngram, base, layer_index, seed))
