"""The selector's Triton top-K (``kernels.triton.selector.topk_candidates``) against the torch rule
(``kernels.ops.selector.topk_candidates``: value descending, equal values by id ascending, across the K-th place and
across the kernel's blocks of BV ids; -0.0 equal to +0.0): equal results, bit for bit, on random logits and on planted
ties; FAIL-first: a merge that reads only the first block's candidates is caught. On CUDA, or on CPU with
TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.ops import selector as ksel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ktriton.available(DEVICE), reason=(
    f"the Triton kernels need CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEVICE)}"))


def _tsel():
    from bloomery_gates.kernels.triton import selector
    return selector


def _ties(v: int) -> torch.Tensor:
    """[4, v]: row 0 all equal; row 1 the max value at ids spread over every block; row 2 -0.0 / +0.0 ties above a
    negative sea; row 3 small integers (many ties at the K-th place)."""
    gen = torch.Generator().manual_seed(7)
    l = torch.full((4, v), -5.0)
    l[0] = 1.5
    l[1] = torch.randn(v, generator=gen)
    l[1, torch.arange(3, v, 997)] = 9.0
    l[2, torch.arange(1, v, 613)] = -0.0
    l[2, torch.arange(5, v, 1409)] = 0.0
    l[3] = torch.randint(-3, 3, (v,), generator=gen).float()
    return l


@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_topk_equals_the_torch_rule(k, dtype):
    tsel = _tsel()
    v = 2 * tsel.BV + 1234                          # three blocks, the last partial
    gen = torch.Generator().manual_seed(k)
    for l in (torch.randn(2, 7, v, generator=gen).to(dtype), _ties(v).to(dtype)):
        u, c = tsel.topk_candidates(l.to(DEVICE), k)
        wu, wc = ksel.topk_candidates(l, k)
        assert torch.equal(c.cpu(), wc) and torch.equal(u.cpu(), wu) and u.dtype == l.dtype


def test_triton_topk_bad_k():
    with pytest.raises(ValueError):
        _tsel().topk_candidates(torch.zeros(2, 3, device=DEVICE), 4)


def test_fail_first_merge_of_the_first_block_only_is_caught():
    """Plant: stage 2 sees the first block's K keys only (the later blocks' keys overwritten as taken): the rows whose
    maxima sit in later blocks differ from the rule."""
    tsel = _tsel()
    v, k = 2 * tsel.BV + 1234, 8                       # row 1's eight 9.0s: ids 3 .. 6972, past the first block
    l = _ties(v).to(DEVICE)
    nb = -(-v // tsel.BV)
    keys = torch.empty(4 * nb * k, dtype=torch.int64, device=DEVICE)
    u = torch.empty(4, k, device=DEVICE)
    c = torch.empty(4, k, dtype=torch.int64, device=DEVICE)
    tsel._topk_block_kernel[(4, nb)](l, v, nb, keys, K=k, KP=k, BV=tsel.BV)
    keys.view(4, nb, k)[:, 1:] = -(2**63)                                # the plant
    tsel._topk_merge_kernel[(4,)](keys, l, v, nb, u, c, K=k, BM=16)
    _, wc = ksel.topk_candidates(l.cpu(), k)
    assert not torch.equal(c.cpu(), wc)
