"""The graphed MTP draft (kernels/drafts/mtp_fast.py, ``FastMTPDraft``) on CPU against the eager ``MTPDraft`` bound
to the same ``FastQwen38Target``: every proposal's ids equal and its logits inside the derived f32 band of one layer
and the head, along a drafted run; the run lossless; no host read inside the propose pass; FAIL-first plants."""

from __future__ import annotations

import pytest
import torch
from test_qwen38 import IDS
from test_qwen38_fast import HostRead, no_host_reads

from bloomery_cli import bands
from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_qwen38
from bloomery_cli.speculative import generate
from bloomery_gates.kernels.drafts.mtp import MTPDraft
from bloomery_gates.kernels.drafts.mtp_fast import FastMTPDraft
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

CPU = torch.device("cpu")


def _pair(plant=None, width=3):
    tspec, mspec = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], CPU, torch.float32)
    eng = FastQwen38Target(tspec, CPU, torch.float32, 96, 4, max_width=4, impl="torch")
    fast = FastMTPDraft(mspec, eng, 96, width=width)
    if plant:
        plant(fast)
    return tspec, mspec, eng, MTPDraft(mspec, eng, 96, width=width), fast


class Both:
    """Drives the eager and the fast draft side by side through one run; each proposal compared."""

    def __init__(self, eager, fast, band):
        self.eager, self.fast, self.band, self.worst, self.ids_equal = eager, fast, band, 0.0, True

    def prompt(self, taps):
        self.eager.prompt(taps)
        self.fast.prompt(taps)

    def propose(self, anchor):
        a, b = self.eager.propose(anchor, detail=True), self.fast.propose(anchor, detail=True)
        self.ids_equal &= a.ids == b.ids
        self.worst = max(self.worst, bands.worst_rel(b.logits.double().numpy(), a.logits.double().numpy()))
        return a

    def accept(self, kept, taps):
        self.eager.accept(kept, taps)
        self.fast.accept(kept, taps)


def _run(plant=None):
    tspec, mspec, eng, eager, fast = _pair(plant)
    both = Both(eager, fast, bands.logits_band("f32", mspec.layer, 1, 64).value)
    plain = generate(FastQwen38Target(tspec, CPU, torch.float32, 96, 4, max_width=4, impl="torch"), None,
                     IDS[:10], 32).ids
    run = generate(eng, both, IDS[:10], 32)
    return both, run, plain


def test_fast_mtp_equals_eager_mtp_along_a_drafted_run():
    both, run, plain = _run()
    assert both.ids_equal and both.worst < both.band, (both.worst, both.band)
    assert run.ids == plain and run.tally.windows > 3


def test_fail_first_chained_row_at_the_wrong_slot():
    """Plant: the chained rows are written one slot early (over the row before): the draft leaves the band."""
    def plant(fast):
        def chain(e, h, slot0, rec=None):
            ops, eps, n = fast.ops, fast.eps, e.shape[0]
            y = fast._rows(e, h, slot0)[-1:].contiguous()
            g = ops.rms(y, fast.norm, eps)
            for i in range(fast.width):
                if i:
                    x = torch.index_select(fast.embed, 0, fast.ids_buf[i - 1:i])
                    y = fast._rows(x, g, slot0 + n + i - 2)                                 # planted: - 2, not - 1
                    g = ops.rms(y, fast.norm, eps)
                if rec is not None:
                    rec.append(y.clone())
                torch.mm(g, fast.head.t(), out=fast.logits_buf[i:i + 1])
                torch.argmax(fast.logits_buf[i:i + 1], dim=-1, out=fast.ids_buf[i:i + 1])
        fast._chain = chain

    both, _, _ = _run(plant)
    assert both.worst > both.band


def test_fail_first_prompt_rows_not_written():
    """Plant: ``prompt`` queues the prompt's rows and moves past them without the prefill pass that writes their
    K/V (slots 1..P-1 stay zero): the first proposals attend empty keys and leave the band."""
    def plant(fast):
        def prompt(taps):
            fast.start(taps[0][1:], fast.ops.rms(taps[-1], fast.final_gain, fast.eps))
            fast.next_slot += fast.pend_e.shape[0]                          # planted: no _rows pass
            fast.pend_e, fast.pend_h = fast.pend_e[:0], fast.pend_h[:0]
        fast.prompt = prompt

    both, _, _ = _run(plant)
    assert both.worst > both.band


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash-decoding attention runs on CUDA (Triton)")
def test_mtp_flash_attention_equals_the_masked_matmul_on_cuda():
    """On CUDA the MTP layer attends through ``ops.attention`` from key 1 (slot 0 holds no row); the same draft
    with the target's attention set to the masked matmul proposes the same ids, its logits inside the bf16 band."""
    tspec, mspec = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], torch.device("cuda"), torch.bfloat16)
    out = {}
    for attention in ("triton", "torch"):
        eng = FastQwen38Target(tspec, "cuda", torch.bfloat16, 96, 4, max_width=4, attention=attention)
        fast = FastMTPDraft(mspec, eng, 96, width=3)
        assert fast.flash == (attention == "triton")
        first = eng.prefill(IDS[:10])
        fast.prompt(first.taps)
        out[attention] = fast.propose(first.argmax[-1], detail=True)
    band = bands.logits_band("bf16", mspec.layer, 1, 64).value
    assert out["triton"].ids == out["torch"].ids
    assert bands.worst_rel(out["triton"].logits.double().cpu().numpy(),
                           out["torch"].logits.double().cpu().numpy()) < band


def test_propose_pass_reads_nothing_back():
    _, _, eng, _, fast = _pair()
    fast.prompt(eng.prefill(IDS[:10]).taps)
    fast.propose(5)                                              # the prompt's rows: the eager path
    with no_host_reads():
        fast.graphs.run(2)


def test_fail_first_a_host_argmax_is_caught():
    """Plant: the chained id read back on the host (``int(argmax)``, what the eager draft does): the guard raises."""
    _, _, eng, _, fast = _pair()
    fast.prompt(eng.prefill(IDS[:10]).taps)
    fast.propose(5)
    real = torch.index_select
    with no_host_reads(), pytest.raises(HostRead):
        torch.index_select = lambda t, d, i: real(t, d, torch.tensor([int(i)]))
        try:
            fast.graphs.run(2)
        finally:
            torch.index_select = real
