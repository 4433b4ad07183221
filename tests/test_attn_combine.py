"""The flash-decoding attention's fused combine (``kernels.triton.decode``): up to ``COMBINE_ROWS`` folded rows the
split kernel's last program of each kv head combines the splits itself (an arrival counter), one launch instead of
two. Its output equals the two-launch path's bit for bit (same order, same expressions: ``_combine_rows``), with
and without qwen38's sigmoid gate and the ``first`` bound, call after call (the counters reset), and a missing reset
is seen. Runs on CUDA, or on CPU with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.graphs import attention as torch_attention

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEV), reason=(
    f"the Triton decode kernels need CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEV)}"))

NQ, NKV, D, CAP = 8, 2, 32, 160


def _case(r: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(r, (NQ + 2 * NKV) * D, generator=gen).to(DEV, torch.bfloat16)
    kc = torch.randn(NKV, CAP, D, generator=gen).to(DEV, torch.bfloat16)
    vc = torch.randn(NKV, CAP, D, generator=gen).to(DEV, torch.bfloat16)
    gate = torch.randn(r, NQ, 2 * D, generator=gen).to(DEV, torch.bfloat16)[..., D:]
    return qkv, kc, vc, gate


@pytest.mark.parametrize("r", [1, 3, 4])
@pytest.mark.parametrize("gated", [False, True])
def test_fused_combine_equals_the_two_launches(monkeypatch, r, gated):
    from bloomery_gates.kernels.triton import decode
    qkv, kc, vc, gate = _case(r, seed=r)
    p0 = torch.tensor([70], device=DEV)
    g = gate if gated else None
    assert r * NQ // NKV <= decode.COMBINE_ROWS
    fused = [decode.TritonOps.attention(qkv, NQ, NKV, D, kc, vc, p0, gate=g, first=f) for f in (0, 5, 0)]
    monkeypatch.setattr(decode, "COMBINE_ROWS", 0)
    two = [decode.TritonOps.attention(qkv, NQ, NKV, D, kc, vc, p0, gate=g, first=f) for f in (0, 5, 0)]
    for a, b in zip(fused, two, strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(fused[0], torch_attention(qkv, NQ, NKV, D, kc, vc, p0, gate=g), atol=2e-2, rtol=2e-2)
    assert not torch.equal(fused[0], fused[1])          # the first bound reaches the fused path


def test_fail_first_a_counter_left_unreset_is_seen(monkeypatch):
    """Planted: the last split's reset of its counter dropped (the reset stores what the counter already holds).
    The next call's last split then never sees NS - 1 arrivals: its rows are not combined."""
    from bloomery_gates.kernels.triton import decode
    qkv, kc, vc, _ = _case(1, seed=7)
    p0 = torch.tensor([100], device=DEV)
    want = decode.TritonOps.attention(qkv, NQ, NKV, D, kc, vc, p0)
    cnt = decode._COUNTERS[str(torch.device(DEV))]
    real = decode._attn_split_kernel

    class Unreset:
        def __getitem__(self, grid):
            def launch(*a, **k):
                cnt[:NKV] += grid[1]    # the state a call without the reset leaves: n_split arrivals counted
                real[grid](*a, **k)
            return launch
    monkeypatch.setattr(decode, "_attn_split_kernel", Unreset())
    got = decode.TritonOps.attention(qkv, NQ, NKV, D, kc, vc, p0)
    monkeypatch.setattr(decode, "_attn_split_kernel", real)
    cnt.zero_()
    assert not torch.equal(got, want)
