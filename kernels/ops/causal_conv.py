"""Short causal depthwise convolution on the device (the Gated DeltaNet's conv1d).

The caller passes the rows together with the K-1 inputs before them (the tail; zeros at the start):

    buf = [tail ; x]                       [N, K-1+R, C]
    y[n, r, c] = sum_{j=0}^{K-1} w[c, j] * buf[n, r + j, c]        w [C, K] (HF conv1d.weight [C, 1, K])

The taps are summed in float32 in a fixed order j = 0..K-1 and the result is rounded once to buf's dtype,
so row r's value depends only on buf[r : r+K], never on how many rows share the call. The tail after row
r (what a later pass must start from if rows r+1.. are taken back) is buf[r+1 : r+K]. Differentiable.
"""

from __future__ import annotations

import torch


def causal_conv(buf: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """buf [..., K-1+R, C], w [C, K] -> y [..., R, C] (buf's dtype)."""
    k = w.shape[-1]
    r = buf.shape[-2] - (k - 1)
    if r < 1 or buf.shape[-1] != w.shape[0]:
        raise ValueError(f"buf {tuple(buf.shape)} / weight {tuple(w.shape)}: expected [..., K-1+R, C] and [C, K]")
    b32, w32 = buf.float(), w.float()
    acc = w32[:, 0] * b32[..., 0:r, :]
    for j in range(1, k):
        acc = acc + w32[:, j] * b32[..., j:j + r, :]
    return acc.to(buf.dtype)


def with_tail(x: torch.Tensor, k: int, tail: torch.Tensor | None = None) -> torch.Tensor:
    """[tail ; x] over the row axis: x [..., R, C], tail [..., K-1, C] or None (zeros) -> [..., K-1+R, C]."""
    if tail is None:
        tail = x.new_zeros(*x.shape[:-2], k - 1, x.shape[-1])
    return torch.cat([tail.to(x.dtype), x], dim=-2)
