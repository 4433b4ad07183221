"""``kernels.triton.gemv.proj`` (RMSNorm prologue + few-row matrix product + residual, one kernel) against the
torch version ``kernels.graphs.proj``: f32 and bf16, every (norm, residual) combination, widths 1..16, shapes that do
and do not divide the tiles; a row's numbers independent of the pass's width (bit for bit); a prompt's rows handed
to cuBLAS; and the comparison seeing a dropped residual or gain. Runs on CUDA, or on CPU with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.graphs import proj as torch_proj
from bloomery_gates.kernels.graphs import rows_pad

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEV), reason=(
    f"the Triton projection needs CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEV)}"))

CFG = (16, 128, 4, 2)                 # tiles that fit every test shape (the rule sends wide weights to cuBLAS)
SPLIT = (16, 128, 4, 2, 3)            # the same, K summed in 3 splits (uneven ones too: 520 and 1024 are not 3 x 128 m)
TMA = (16, 128, 4, 2, 1, 1)           # the same, the weight's tiles copied by the tensor memory accelerator
TMA_SPLIT = (16, 128, 4, 2, 3, 1)     # both
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _case(n: int, k: int, r: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(r, k, generator=gen).to(DEV, dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEV, dtype)
    g = (torch.rand(k, generator=gen) + 0.5).to(DEV)
    res = torch.randn(r, n, generator=gen).to(DEV, dtype)
    return x, w, g, res


@pytest.mark.parametrize("cfg", [CFG, SPLIT, TMA, TMA_SPLIT], ids=["one-sum", "split-k", "tma", "tma-split-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(48, 64), (64, 1024), (40, 520)])
def test_proj_matches_torch(dtype, n, k, cfg):
    from bloomery_gates.kernels.triton.gemv import proj

    for r in (1, 5, 16):
        x, w, g, res = _case(n, k, r, dtype, seed=r)
        for gain in (None, g):
            for rs in (None, res):
                torch.testing.assert_close(proj(x, w, gain, 1e-6, rs, rp=16, cfg=cfg),
                                           torch_proj(x, w, gain, 1e-6, rs), **TOL[dtype])


@pytest.mark.parametrize("cfg", [CFG, SPLIT, TMA, TMA_SPLIT], ids=["one-sum", "split-k", "tma", "tma-split-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_width_of_its_pass(dtype, cfg):
    """Bit for bit, and run to run (split-K: the splits are added in one order whichever arrives last)."""
    from bloomery_gates.kernels.triton.gemv import proj

    x, w, g, res = _case(72, 1024, 16, dtype)
    wide = proj(x, w, g, 1e-6, res, rp=16, cfg=cfg)
    for r in (1, 3, 8):
        assert torch.equal(proj(x[:r], w, g, 1e-6, res[:r], rp=16, cfg=cfg), wide[:r])
    for _ in range(3):
        assert torch.equal(proj(x, w, g, 1e-6, res, rp=16, cfg=cfg), wide)


def test_fail_first_split_k_without_the_counter_reset_is_seen(monkeypatch):
    """Plant: the tiles' arrival counters not reset by the call before (left at S, as a skipped reset leaves them):
    no split sees itself last, nothing is written; the comparison sees it (out starts at zero)."""
    from bloomery_gates.kernels.triton import gemv

    monkeypatch.setattr(gemv, "_WORK", {})             # the planted counters stay in this test's scratch
    x, w, g, res = _case(48, 1024, 4, torch.float32)
    want = torch_proj(x, w, g, 1e-6, res)
    out = torch.zeros_like(want)
    torch.testing.assert_close(gemv.proj(x, w, g, 1e-6, res, out=out, rp=16, cfg=SPLIT), want, **TOL[torch.float32])
    real = gemv._workspace

    def not_reset(*args):
        ws, cnt = real(*args)
        return ws, cnt.fill_(SPLIT[4])
    monkeypatch.setattr(gemv, "_workspace", not_reset)
    out.zero_()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(gemv.proj(x, w, g, 1e-6, res, out=out, rp=16, cfg=SPLIT), want,
                                   **TOL[torch.float32])


def test_out_buffer_with_row_stride_and_prompt_fallback():
    from bloomery_gates.kernels.triton.gemv import proj

    x, w, g, _ = _case(48, 64, 4, torch.float32)
    buf = torch.zeros(6, 80, device=DEV)
    proj(x, w, g, 1e-6, out=buf[2:, :48], rp=16, cfg=CFG)
    torch.testing.assert_close(buf[2:, :48], torch_proj(x, w, g, 1e-6), **TOL[torch.float32])
    assert buf[:2].abs().sum() == 0 and buf[:, 48:].abs().sum() == 0
    xp, wp, gp, rp_ = _case(48, 64, 40, torch.float32)                    # 40 rows: a prompt, cuBLAS
    from bloomery_gates.kernels.triton.decode import TritonOps  # cuBLAS after the Triton rms kernel
    assert torch.equal(TritonOps.proj(xp, wp, gp, 1e-6, rp_),
                       torch_proj(TritonOps.rms(xp, gp, 1e-6), wp, None, 1e-6, rp_))
    with pytest.raises(ValueError, match="not a decode projection"):      # the kernel itself refuses a prompt
        proj(xp, wp, gp, 1e-6, rp_)
    x4, w4, g4, _ = _case(48, 64, 4, torch.float32)                       # a decode width: the kernel's rows
    torch.testing.assert_close(TritonOps.proj(x4, w4, g4, 1e-6, rp=16), proj(x4, w4, g4, 1e-6, rp=16), rtol=0, atol=0)
    assert rows_pad(1) == 16 and rows_pad(16) == 16 and rows_pad(17) == 32


def test_tma_tiles_on_rows_it_cannot_copy_fall_back_to_pointer_loads():
    """TMA needs 16-byte aligned rows: a weight whose rows are not (a view with a 2-byte row stride remainder) takes
    the pointer loads, with the same result as the torch version."""
    from bloomery_gates.kernels.triton.gemv import proj

    x, w, g, res = _case(48, 64, 5, torch.bfloat16)
    wide = torch.zeros(48, 65, device=DEV, dtype=torch.bfloat16)
    wide[:, 1:] = w
    odd = wide[:, 1:]                                                    # row stride 130 bytes, base 2 bytes in
    assert (odd.stride(0) * odd.element_size()) % 16 and odd.data_ptr() % 16
    torch.testing.assert_close(proj(x, odd, g, 1e-6, res, rp=16, cfg=TMA), torch_proj(x, w, g, 1e-6, res),
                               **TOL[torch.bfloat16])


def test_the_comparison_sees_a_dropped_residual_or_gain():
    from bloomery_gates.kernels.triton.gemv import proj

    x, w, g, res = _case(48, 64, 2, torch.bfloat16)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(proj(x, w, g, 1e-6, None, rp=16, cfg=CFG), torch_proj(x, w, g, 1e-6, res),
                                   **TOL[torch.bfloat16])
    with pytest.raises(AssertionError):
        torch.testing.assert_close(proj(x, w, None, 1e-6, res, rp=16, cfg=CFG), torch_proj(x, w, g, 1e-6, res),
                                   **TOL[torch.bfloat16])


def test_the_rule_keeps_wide_weights_on_cublas():
    from bloomery_gates.kernels.triton.gemv import config

    assert config(4096, 12288) is not None and config(5120, 6144) is not None
    assert config(24576, 4096) is None and config(248320, 5120) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_its_place_in_the_pass(dtype):
    """The drafted run's row j must equal the plain run's row 0 (a verify's rows are a plain step's rows moved):
    proj of the rows permuted is proj of the rows, permuted, bit for bit."""
    from bloomery_gates.kernels.triton.gemv import proj

    x, w, g, res = _case(72, 1024, 16, dtype)
    perm = torch.tensor([3, 0, 7, 1, 15, 2, 9, 4, 5, 6, 8, 10, 11, 12, 13, 14], device=DEV)
    want = proj(x, w, g, 1e-6, res, rp=16, cfg=CFG)[perm]
    assert torch.equal(proj(x[perm], w, g, 1e-6, res[perm], rp=16, cfg=CFG), want)
    one = proj(x[5:6], w, g, 1e-6, res[5:6], rp=16, cfg=CFG)            # the plain step: that row alone, at place 0
    assert torch.equal(one[0], proj(x, w, g, 1e-6, res, rp=16, cfg=CFG)[5])
