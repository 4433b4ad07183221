"""``TritonOps.attn_input``: a layer's down projection with the next RMSNorm's parts in its epilogue (h' g and each
tile's sums of h'^2), and the next layer's q/k/v reading h' g and scaling by rstd from those sums in its epilogue (the
norm deferred: no sum of squares or gain in q/k/v's K loop). Against ``kernels.graphs.attn_input`` (the norm folded,
or torch) in f32 and bf16; h' the plain projection's bit for bit; a row's numbers independent of its pass's width;
the composition where a projection has no tiles; the comparison seeing a dropped gain or rstd. Runs on CUDA, or on
CPU with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import graphs
from bloomery_gates.kernels import triton as ktriton

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEV), reason=(
    f"the Triton decode kernels need CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEV)}"))

H, I, Q, RP = 64, 160, 96, 16         # hidden, intermediate, q/k/v width; rows padded to 16
CFG = (16, 128, 4, 2)
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


@pytest.fixture
def tiles(monkeypatch):
    """down [H, I] and q/k/v [Q, H] on the projection kernel (as the 8B's [4096, 12288] and [6144, 4096] are)."""
    from bloomery_gates.kernels.triton import gemv
    monkeypatch.setattr(gemv, "MEASURED", {(H, I): CFG, (Q, H): CFG})
    monkeypatch.setattr(gemv, "_measured", lambda: {})


def _case(r: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(r, I, generator=gen).to(DEV, dtype)
    wd = (torch.randn(H, I, generator=gen) / I ** 0.5).to(DEV, dtype)
    h = torch.randn(r, H, generator=gen).to(DEV, dtype)
    g = (torch.rand(H, generator=gen) + 0.5).to(DEV)
    wqkv = (torch.randn(Q, H, generator=gen) / H ** 0.5).to(DEV, dtype)
    return a, wd, h, g, wqkv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [1, 5, 16])
def test_attn_input_matches_the_folded_norm_and_torch(tiles, dtype, r):
    from bloomery_gates.kernels.triton.decode import TritonOps
    a, wd, h, g, wqkv = _case(r, dtype)
    want_h2, want_qkv = graphs.attn_input(a, wd, h, g, wqkv, 1e-6)
    fold_h2, fold_qkv = graphs.attn_input_of(TritonOps, a, wd, h, g, wqkv, 1e-6, RP)
    out = torch.empty_like(h)
    h2, qkv = TritonOps.attn_input(a, wd, h, g, wqkv, 1e-6, RP, out)
    assert h2.data_ptr() == out.data_ptr()
    assert torch.equal(h2, fold_h2)                 # the same kernel, two more stores
    torch.testing.assert_close(h2, want_h2, **TOL[dtype])
    torch.testing.assert_close(qkv, want_qkv, **TOL[dtype])
    torch.testing.assert_close(qkv, fold_qkv, **TOL[dtype])


def test_a_row_does_not_depend_on_the_width_of_its_pass(tiles):
    from bloomery_gates.kernels.triton.decode import TritonOps
    a, wd, h, g, wqkv = _case(6, torch.bfloat16, seed=1)
    h2, qkv = TritonOps.attn_input(a, wd, h, g, wqkv, 1e-6, RP)
    for j in range(6):
        h2j, qkvj = TritonOps.attn_input(a[j:j + 1], wd, h[j:j + 1], g, wqkv, 1e-6, RP)
        assert torch.equal(h2j[0], h2[j]) and torch.equal(qkvj[0], qkv[j])


def test_without_tiles_for_both_it_is_the_composition(monkeypatch):
    """Where q/k/v has no tiles (cuBLAS: a prompt, or a shape left to it) the norm stays before it."""
    from bloomery_gates.kernels.triton import gemv
    from bloomery_gates.kernels.triton.decode import TritonOps
    monkeypatch.setattr(gemv, "MEASURED", {(H, I): CFG, (Q, H): None})
    monkeypatch.setattr(gemv, "_measured", lambda: {})
    a, wd, h, g, wqkv = _case(3, torch.float32)
    h2, qkv = TritonOps.attn_input(a, wd, h, g, wqkv, 1e-6, RP)
    assert torch.equal(qkv, TritonOps.proj(h2, wqkv, g, 1e-6, rp=RP))


def test_the_comparison_sees_a_dropped_gain_or_rstd(tiles):
    """The epilogue's gain and q/k/v's rstd each matter at the tolerance the tests use (bf16)."""
    from bloomery_gates.kernels.triton import gemv
    a, wd, h, g, wqkv = _case(4, torch.bfloat16, seed=2)
    _, want = graphs.attn_input(a, wd, h, g, wqkv, 1e-6)
    h2, hg = torch.empty_like(h), torch.empty_like(h)
    ss = torch.empty(H // CFG[0], RP, device=DEV, dtype=torch.float32)
    for gain, rstd in ((torch.ones_like(g), True), (g, False), (g, True)):
        gemv.proj(a, wd, None, 1e-6, h, h2, RP, CFG, gout=(gain, hg, ss))
        qkv = gemv.proj(hg, wqkv, None, 1e-6, rp=RP, cfg=CFG, ssin=ss if rstd else None)
        if gain is g and rstd:                      # both kept: within it
            torch.testing.assert_close(qkv, want, **TOL[torch.bfloat16])
        else:
            assert not torch.allclose(qkv, want, **TOL[torch.bfloat16])


def test_ssin_takes_the_place_of_the_gain():
    from bloomery_gates.kernels.triton import gemv
    a, wd, h, g, wqkv = _case(2, torch.float32)
    with pytest.raises(ValueError, match="ssin takes the place of g32"):
        gemv.proj(h, wqkv, g, 1e-6, rp=RP, cfg=CFG, ssin=torch.zeros(4, RP, device=DEV))
