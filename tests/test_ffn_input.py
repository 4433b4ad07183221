"""``TritonOps.ffn_input``: the attention's output projection with the next RMSNorm's parts in its epilogue (h2 g and
each tile's sums of h2^2), cuBLAS gate/up on h2 g, and the SiLU kernel scaling gate and up by rstd: no rms launch
between the two projections. Against ``kernels.graphs.ffn_input`` (the norm, then gate/up) in f32 and bf16; h2 the
plain projection's bit for bit; a row's numbers independent of its pass's width; the fused path taken only where
gate/up is on cuBLAS; the comparison seeing a dropped gain or rstd; the 8B engine's pass through it. Runs on CUDA,
or on CPU with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import graphs
from bloomery_gates.kernels import triton as ktriton

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEV), reason=(
    f"the Triton decode kernels need CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEV)}"))

H, A, I, RP = 64, 96, 80, 16          # hidden, attention width, intermediate; rows padded to 16
CFG = (16, 128, 4, 2)
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


@pytest.fixture
def tiles(monkeypatch):
    """o_proj [H, A] on the projection kernel, gate/up [2I, H] on cuBLAS (as the 8B's [24576, 4096] is)."""
    from bloomery_gates.kernels.triton import gemv
    monkeypatch.setattr(gemv, "MEASURED", {(H, A): CFG, (2 * I, H): None})
    monkeypatch.setattr(gemv, "_measured", lambda: {})


def _case(r: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(r, A, generator=gen).to(DEV, dtype)
    wo = (torch.randn(H, A, generator=gen) / A ** 0.5).to(DEV, dtype)
    h = torch.randn(r, H, generator=gen).to(DEV, dtype)
    g = (torch.rand(H, generator=gen) + 0.5).to(DEV)
    wgu = (torch.randn(2 * I, H, generator=gen) / H ** 0.5).to(DEV, dtype)
    return o, wo, h, g, wgu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [1, 5, 16])
def test_ffn_input_matches_torch_without_an_rms_launch(tiles, monkeypatch, dtype, r):
    from bloomery_gates.kernels.triton.decode import TritonOps
    o, wo, h, g, wgu = _case(r, dtype)
    want_h2, want_a = graphs.ffn_input(o, wo, h, g, wgu, 1e-6)

    def no_rms(*a, **k):
        raise AssertionError("the fused path launched an rms kernel")
    monkeypatch.setattr(TritonOps, "rms", staticmethod(no_rms))
    h2, a = TritonOps.ffn_input(o, wo, h, g, wgu, 1e-6, RP)
    assert torch.equal(h2, TritonOps.proj(o, wo, None, 1e-6, res=h, rp=RP))    # the same kernel, one more store
    torch.testing.assert_close(h2, want_h2, **TOL[dtype])
    torch.testing.assert_close(a, want_a, **TOL[dtype])


def test_a_row_does_not_depend_on_the_width_of_its_pass(tiles):
    """The parts this change owns (the epilogue's h2 g and sums, the SiLU's rstd) are per row, bit for bit; gate/up
    between them is cuBLAS's, whose kernel may differ with the row count, as it did before the norm was deferred."""
    from bloomery_gates.kernels.triton import gemv
    from bloomery_gates.kernels.triton.decode import TritonOps
    o, wo, h, g, wgu = _case(6, torch.bfloat16, seed=1)

    def parts(rows):
        h2, hg = torch.empty(rows.stop - rows.start, H, device=DEV, dtype=h.dtype), torch.empty(
            rows.stop - rows.start, H, device=DEV, dtype=h.dtype)
        ss = torch.zeros(H // CFG[0], RP, device=DEV, dtype=torch.float32)
        gemv.proj(o[rows], wo, None, 1e-6, h[rows], h2, RP, CFG, gout=(g, hg, ss))
        return h2, hg, ss
    h2, hg, ss = parts(slice(0, 6))
    gu = torch.randn(6, 2 * I, generator=torch.Generator().manual_seed(3)).to(DEV, torch.bfloat16)
    full = TritonOps.silu_mul(gu, ss, H, 1e-6)
    for j in range(6):
        h2j, hgj, ssj = parts(slice(j, j + 1))
        assert torch.equal(h2j[0], h2[j]) and torch.equal(hgj[0], hg[j]) and torch.equal(ssj[:, 0], ss[:, j])
        assert torch.equal(TritonOps.silu_mul(gu[j:j + 1], ssj, H, 1e-6)[0], full[j])


def test_gate_up_in_the_projection_kernel_keeps_its_folded_norm(monkeypatch):
    """Where gate/up has tiles (a small model's), the norm is folded there instead: the unfused composition."""
    from bloomery_gates.kernels.triton import gemv
    from bloomery_gates.kernels.triton.decode import TritonOps
    monkeypatch.setattr(gemv, "MEASURED", {(H, A): CFG, (2 * I, H): CFG})
    monkeypatch.setattr(gemv, "_measured", lambda: {})
    o, wo, h, g, wgu = _case(3, torch.float32)
    h2, a = TritonOps.ffn_input(o, wo, h, g, wgu, 1e-6, RP)
    assert torch.equal(a, TritonOps.silu_mul(TritonOps.proj(h2, wgu, g, 1e-6, rp=RP)))


def test_f16_keeps_the_norm_before_gate_up(tiles, monkeypatch):
    """In f16 the norm is not deferred (gate/up before the rstd scaling could leave f16's range): the rms launch."""
    from bloomery_gates.kernels.triton.decode import TritonOps
    o, wo, h, g, wgu = (t.half() if t.is_floating_point() and t.dtype != torch.float32 else t
                        for t in _case(2, torch.bfloat16))
    calls = []
    real = TritonOps.rms
    monkeypatch.setattr(TritonOps, "rms", staticmethod(lambda *a: calls.append(1) or real(*a)))
    TritonOps.ffn_input(o, wo, h, g, wgu, 1e-6, RP)
    assert calls == [1]


def test_the_comparison_sees_a_dropped_gain_or_rstd(tiles):
    """The epilogue's gain and the SiLU kernel's rstd each matter at the tolerance the tests use."""
    from bloomery_gates.kernels.triton import gemv
    from bloomery_gates.kernels.triton.decode import TritonOps
    o, wo, h, g, wgu = _case(4, torch.bfloat16, seed=2)
    _, want = graphs.ffn_input(o, wo, h, g, wgu, 1e-6)
    h2, hg = torch.empty_like(h), torch.empty_like(h)
    ss = torch.empty(H // CFG[0], RP, device=DEV, dtype=torch.float32)
    for gain, rstd in ((torch.ones_like(g), True), (g, False)):
        gemv.proj(o, wo, None, 1e-6, h, h2, RP, CFG, gout=(gain, hg, ss))
        gu = torch.mm(hg, wgu.t())
        a = TritonOps.silu_mul(gu, ss, H, 1e-6) if rstd else TritonOps.silu_mul(gu)
        assert not torch.allclose(a, want, **TOL[torch.bfloat16])
    gemv.proj(o, wo, None, 1e-6, h, h2, RP, CFG, gout=(g, hg, ss))             # both kept: within it
    torch.testing.assert_close(TritonOps.silu_mul(torch.mm(hg, wgu.t()), ss, H, 1e-6), want, **TOL[torch.bfloat16])


def test_the_8b_engine_pass_through_the_fused_ffn_input(monkeypatch):
    """FastQwen3Target on the Triton ops with gate/up on cuBLAS (the 8B's layout) equals its torch-ops pass within
    f32 tolerance, with no rms launch."""
    from bloomery_cli.bench.shapes import SHAPES, random_pair
    from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target
    from bloomery_gates.kernels.triton import gemv
    from bloomery_gates.kernels.triton.decode import TritonOps
    s = SHAPES["tiny"]
    monkeypatch.setattr(gemv, "MEASURED", {(2 * s.intermediate, s.hidden): None})
    monkeypatch.setattr(gemv, "_measured", lambda: {})
    calls = []
    monkeypatch.setattr(TritonOps, "rms", staticmethod(lambda *a, **k: calls.append(a[1].numel()) or graphs.rms(*a)))
    t, _ = random_pair(s, torch.device(DEV), torch.float32)
    ids = [5, 9, 2, 7]
    out = {}
    for impl in ("triton", "torch"):
        eng = FastQwen3Target(t, DEV, torch.float32, 64, max_width=4, impl=impl, graphs=False)
        eng.prefill([1, 2, 3])
        out[impl] = eng.verify(ids, logits=True).logits.clone()
    assert not calls                    # no rms launch: the layers' norms deferred or folded, the head's folded
    torch.testing.assert_close(out["triton"], out["torch"], atol=1e-4, rtol=1e-4)
