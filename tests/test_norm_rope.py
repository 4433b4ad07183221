"""``TritonOps.norm_rope`` (per-head RMSNorm + partial RoPE + the store, one launch) against the torch version
``kernels.graphs.norm_rope``: a strided view of the gated q heads and the k heads stored into the cache at device
positions, partial (rot < d) and full rotary, f32 and bf16; and the comparison seeing a dropped gain. Runs on CUDA,
or on CPU with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.graphs import norm_rope
from bloomery_gates.kernels.ops.rope import rope_tables

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEV), reason=(
    f"the Triton norm + rope needs CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEV)}"))
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _case(r: int, heads: int, d: int, rot: int, dtype: torch.dtype, cap: int = 40):
    gen = torch.Generator().manual_seed(r * 7 + rot)
    qg = torch.randn(r, heads, 2 * d, generator=gen).to(DEV, dtype)        # [query | gate] per head, as qwen38's
    w = (torch.rand(d, generator=gen) + 0.5).to(DEV)
    pos = torch.tensor([5 + 2 * i for i in range(r)], device=DEV)
    cos, sin = rope_tables(rot, 1e4, cap, DEV)
    return qg[..., :d], w, cos[pos][:, None], sin[pos][:, None], pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rot", [8, 32])
def test_norm_rope_matches_torch(dtype, rot):
    from bloomery_gates.kernels.triton.decode import TritonOps

    for r in (1, 3):
        x, w, cos, sin, pos = _case(r, 4, 32, rot, dtype)
        torch.testing.assert_close(TritonOps.norm_rope(x, w, 1e-6, cos, sin), norm_rope(x, w, 1e-6, cos, sin),
                                   **TOL[dtype])
        kc_t, kc_r = (torch.zeros(4, 40, 32, device=DEV, dtype=dtype) for _ in range(2))
        assert TritonOps.norm_rope(x, w, 1e-6, cos, sin, kc=kc_t, pos=pos) is None
        norm_rope(x, w, 1e-6, cos, sin, kc=kc_r, pos=pos)
        torch.testing.assert_close(kc_t, kc_r, **TOL[dtype])
        assert kc_t[:, 0].abs().sum() == 0                                    # only the rows' positions written
        v = torch.randn(r, 4, 64, device=DEV).to(dtype)[..., 32:]            # a strided view, as qwen38's
        vc_t, vc_r = (torch.zeros(4, 40, 32, device=DEV, dtype=dtype) for _ in range(2))
        TritonOps.norm_rope(x, w, 1e-6, cos, sin, kc=kc_t, pos=pos, v=v, vc=vc_t)
        norm_rope(x, w, 1e-6, cos, sin, kc=kc_r, pos=pos, v=v, vc=vc_r)
        assert torch.equal(vc_t, vc_r) and torch.equal(vc_t[:, pos].transpose(0, 1), v)    # V heads copied as they are
        torch.testing.assert_close(kc_t, kc_r, **TOL[dtype])


def test_the_comparison_sees_a_dropped_gain():
    from bloomery_gates.kernels.triton.decode import TritonOps

    x, w, cos, sin, _ = _case(2, 4, 32, 8, torch.bfloat16)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(TritonOps.norm_rope(x, torch.ones_like(w), 1e-6, cos, sin),
                                   norm_rope(x, w, 1e-6, cos, sin), **TOL[torch.bfloat16])
