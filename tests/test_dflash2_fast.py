"""The graphed DFlash2 draft (kernels/drafts/dflash2_fast.py, ``FastDFlash2Draft``) on CPU against the eager
``DFlash2Draft`` bound to the same ``FastQwen38Target``: every proposal's walked ids equal and its logits inside the
derived f32 band along a drafted run, the context store inside the derived layer band, the run lossless; no host
read inside the propose or the extension pass; FAIL-first plants."""

from __future__ import annotations

import pytest
import torch
from test_mtp_fast import Both
from test_qwen38 import IDS
from test_qwen38_fast import HostRead, no_host_reads

from bloomery_cli import bands
from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_dflash2, random_qwen38
from bloomery_cli.speculative import generate
from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.drafts.dflash2 import DFlash2Draft
from bloomery_gates.kernels.drafts.dflash2_fast import FastDFlash2Draft
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

CPU = torch.device("cpu")


ATTN_GAIN = 100.0      # the draft's o_proj scaled up: its attention must move the logits past the band when wrong


def _setup(block=4, attn_gain=1.0):
    s = HYBRID_SHAPES["qwen38-tiny"]
    tspec, _ = random_qwen38(s, CPU, torch.float32)
    dspec = random_dflash2(s, tspec, block, CPU, torch.float32)
    for k in [k for k in dspec.tensors if k.endswith("self_attn.o_proj.weight")]:
        dspec.tensors[k] = dspec.tensors[k] * attn_gain
    eng = FastQwen38Target(tspec, CPU, torch.float32, 96, block, max_width=block, impl="torch")
    return tspec, dspec, eng


def _run(plant=None):
    """A drafted run with the eager and the fast draft side by side. The random draft's attention output is small
    beside its residual stream (a wrong key set moved the logits by 1e-5 against a band of 3e-4): its o_proj is
    scaled by ATTN_GAIN so that the attention plants below leave the band (3-6x it) while the fast pass stays at
    1e-7 of the eager one."""
    tspec, dspec, eng = _setup(attn_gain=ATTN_GAIN)
    fast = FastDFlash2Draft(dspec, eng, 96, impl="torch")
    if plant:
        plant(fast)
    eager = DFlash2Draft(dspec, eng, 96, impl="torch")
    both = Both(eager, fast, bands.logits_band("f32", dspec.layer, dspec.num_layers, 64).value)
    plain = generate(FastQwen38Target(tspec, CPU, torch.float32, 96, 4, max_width=4, impl="torch"), None,
                     IDS[:10], 32).ids
    run = generate(eng, both, IDS[:10], 32)
    return both, run, plain, eager, fast


def _store_worst(fast, eager) -> float:
    n = eager.ctx_len
    return max(bands.worst_rel(f[:, :, :, :n].double().numpy(), e[:, :, :, :n].double().numpy())
               for f, e in ((fast.k_ctx, eager.k_ctx), (fast.v_ctx, eager.v_ctx)))


def test_fast_dflash2_matches_eager_along_a_drafted_run():
    """The fast pass runs the engines' layout (stacked q/k/v and gate/up, ``ops.proj`` / ``ops.qk_rope_store`` /
    ``ops.attention`` on the cache): not the eager draft's op sequence, so its logits sit inside the derived f32 band
    of the eager ones (not bit-equal) and every walked id is equal; the context store inside the derived f32 band of
    one layer over the context (``bands.layer_band``)."""
    both, run, plain, eager, fast = _run()
    assert both.ids_equal and both.worst < both.band, (both.worst, both.band)
    assert run.ids == plain and run.tally.windows > 3
    assert eager.ctx_len == fast.ctx_len
    band = bands.layer_band("f32", fast.shape, 1, eager.ctx_len).value
    assert _store_worst(fast, eager) < band
    for f, e in zip(fast.layers, eager.layers, strict=True):          # the unstacked names: views of the stacks
        assert all(torch.equal(getattr(f, n), getattr(e, n)) for n in ("wq", "wk", "wv", "wg", "wu", "wo", "wd"))


class _Ops:
    """The draft's decode ops with one of them replaced (a plant)."""

    def __init__(self, ops, **over):
        self.ops, self.over = ops, over

    def __getattr__(self, name):
        return self.over.get(name, getattr(self.ops, name))


def _attention_plant(shift: int = 0, causal: bool = False):
    """The propose's attention (the block's rows: nq > 0) run with its first position moved by ``shift`` / causal."""
    planted = causal

    def plant(fast):
        real = fast.ops.attention

        def attention(qkv, nq, nkv, d, kc, vc, p0, causal=True, gate=None):
            if nq and qkv.shape[0] == fast.b:
                return real(qkv, nq, nkv, d, kc, vc, p0 + shift, planted, gate)
            return real(qkv, nq, nkv, d, kc, vc, p0, causal, gate)
        fast.ops = _Ops(fast.ops, attention=attention)
    return plant


def test_fail_first_context_mask_off_by_one():
    """Plant: the block's keys end one slot early (keys <= s + B - 2: its last row unseen): the proposals' logits
    leave the band."""
    both, _, _, _, _ = _run(_attention_plant(shift=-1))
    assert both.worst > both.band


def test_fail_first_block_attends_causally():
    """Plant: the block rows attend causally (DFlash's rule is the whole block): the logits leave the band."""
    both, _, _, _, _ = _run(_attention_plant(causal=True))
    assert both.worst > both.band


def test_fail_first_block_kv_stored_one_slot_late():
    """Plant: the extension stores the context K/V one position late (p0 + 1): the store leaves the band."""
    def plant(fast):
        real = fast.ops.qk_rope_store
        fast.ops = _Ops(fast.ops, qk_rope_store=lambda qkv, nq, *a: real(qkv, nq, *a[:7], a[7] + (nq == 0), *a[8:]))

    _, _, _, eager, fast = _run(plant)
    assert _store_worst(fast, eager) > bands.layer_band("f32", fast.shape, 1, eager.ctx_len).value


def test_passes_read_nothing_back():
    _, dspec, eng = _setup()
    fast = FastDFlash2Draft(dspec, eng, 96, impl="torch")
    first = eng.prefill(IDS[:10])
    fast.prompt(first.taps)
    v = eng.verify([first.argmax[-1], 1, 2, 3])
    fast.inp.put([fast.ctx_len, 5])
    fast.ext.put([fast.ctx_len])
    with no_host_reads():
        fast.propose_graph.run(0)
        fast.extend_graphs.run(2)
    assert v.taps.data_ptr() == eng.taps_buf.data_ptr()


def test_fail_first_host_read_in_the_walk_is_caught(monkeypatch):
    """Plant: the selector's walk reads the anchor back (``int(anchor)``): the guard raises."""
    from bloomery_gates.kernels.drafts import dflash2_fast

    _, dspec, eng = _setup()
    fast = FastDFlash2Draft(dspec, eng, 96, impl="torch")
    fast.prompt(eng.prefill(IDS[:10]).taps)
    real = dflash2_fast.select
    monkeypatch.setattr(dflash2_fast, "select", lambda l, g, anchor, *a: real(l, g, torch.tensor(int(anchor)), *a))
    fast.inp.put([fast.ctx_len, 5])
    with no_host_reads(), pytest.raises(HostRead):
        fast.propose_graph.run(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mult,cap", [(1.0, None), (0.5, None), (1.0, 3.0), (0.7, 2.5)])
def test_head_logits_into_out_equals_the_returned_logits(mult, cap, dtype):
    """The fast draft's head writes into its static logits buffer (``head_logits(..., out=)``): the same values, bit
    for bit, as the eager draft's returned logits; FAIL-first: a buffer that skips the multiplier differs."""
    from bloomery_gates.kernels.ops.selector import head_logits

    gen = torch.Generator().manual_seed(3)
    rows, head = (torch.randn(5, 32, generator=gen) * 2).to(dtype), torch.randn(50, 32, generator=gen).to(dtype)
    want = head_logits(rows, head, mult, cap)
    out = torch.full((5, 50), float("nan"))
    assert head_logits(rows, head, mult, cap, out=out) is out and torch.equal(out, want)
    if mult != 1.0:
        assert not torch.equal(head_logits(rows, head, 1.0, cap, out=out), want)


class _Graphed(Both):
    """The fast draft's proposals from its graph replay (``propose`` without detail: what the bench and the device
    loop run), each compared with the eager draft's: walked ids equal, logits (``logits_buf`` after the replay)
    inside the band."""

    def propose(self, anchor):
        a, ids = self.eager.propose(anchor, detail=True), self.fast.propose(anchor).ids
        self.ids_equal &= a.ids == ids
        self.worst = max(self.worst, bands.worst_rel(self.fast.logits_buf.double().cpu().numpy(),
                                                     a.logits.double().cpu().numpy()))
        return a


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and ktriton.available("cuda")),
                    reason="the Triton decode ops and CUDA graphs need CUDA and triton")
def test_triton_graphed_fast_dflash2_matches_eager_on_cuda():
    """impl="triton" with CUDA graphs (gemv ``proj``, the qk-rope store, the split attention, the conv and selector
    kernels, one replay a propose and a graph per extension width) against the eager torch draft on the same
    engine, f32: every proposal's ids equal, logits inside the derived band, the run lossless."""
    dev = torch.device("cuda")
    s = HYBRID_SHAPES["qwen38-tiny"]
    tspec, _ = random_qwen38(s, dev, torch.float32)
    dspec = random_dflash2(s, tspec, 4, dev, torch.float32)
    for k in [k for k in dspec.tensors if k.endswith("self_attn.o_proj.weight")]:
        dspec.tensors[k] = dspec.tensors[k] * ATTN_GAIN
    eng = FastQwen38Target(tspec, dev, torch.float32, 96, 4, max_width=4, impl="triton")
    fast = FastDFlash2Draft(dspec, eng, 96, impl="triton")
    assert fast.ops.name == "triton" and fast.propose_graph.enabled
    both = _Graphed(DFlash2Draft(dspec, eng, 96, impl="torch"), fast,
                    bands.logits_band("f32", dspec.layer, dspec.num_layers, 64).value)
    run = generate(eng, both, IDS[:10], 32)
    plain = generate(FastQwen38Target(tspec, dev, torch.float32, 96, 4, max_width=4, impl="triton"), None,
                     IDS[:10], 32).ids
    assert both.ids_equal and both.worst < both.band, (both.worst, both.band)
    assert run.ids == plain and run.tally.windows > 3 and fast.propose_graph.graphs
