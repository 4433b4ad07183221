"""The graphed DFlash2 draft (kernels/drafts/dflash2_fast.py, ``FastDFlash2Draft``) on CPU against the eager
``DFlash2Draft`` bound to the same ``FastQwen38Target``: every proposal's walked ids equal and its logits inside the
derived f32 band along a drafted run, the context store equal, the run lossless; no host read inside the propose or
the extension pass; FAIL-first plants."""

from __future__ import annotations

import pytest
import torch
from test_mtp_fast import Both
from test_qwen38 import IDS
from test_qwen38_fast import HostRead, no_host_reads

from bloomery_cli import bands
from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_dflash2, random_qwen38
from bloomery_cli.speculative import generate
from bloomery_gates.kernels.drafts.dflash2 import DFlash2Draft
from bloomery_gates.kernels.drafts.dflash2_fast import FastDFlash2Draft
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

CPU = torch.device("cpu")


def _setup(block=4):
    s = HYBRID_SHAPES["qwen38-tiny"]
    tspec, _ = random_qwen38(s, CPU, torch.float32)
    dspec = random_dflash2(s, tspec, block, CPU, torch.float32)
    eng = FastQwen38Target(tspec, CPU, torch.float32, 96, block, max_width=block, impl="torch")
    return tspec, dspec, eng


def _run(plant=None):
    tspec, dspec, eng = _setup()
    fast = FastDFlash2Draft(dspec, eng, 96, impl="torch")
    if plant:
        plant(fast)
    eager = DFlash2Draft(dspec, eng, 96, impl="torch")
    both = Both(eager, fast, bands.logits_band("f32", dspec.layer, dspec.num_layers, 64).value)
    plain = generate(FastQwen38Target(tspec, CPU, torch.float32, 96, 4, max_width=4, impl="torch"), None,
                     IDS[:10], 32).ids
    run = generate(eng, both, IDS[:10], 32)
    return both, run, plain, eager, fast


def test_fast_dflash2_equals_eager_along_a_drafted_run():
    """Bit for bit on the CPU torch path (the same functions on the same operands; only the positions come from the
    device), so equality is asserted, not the band (which it also meets)."""
    both, run, plain, eager, fast = _run()
    assert both.ids_equal and both.worst == 0.0 < both.band
    assert run.ids == plain and run.tally.windows > 3
    assert eager.ctx_len == fast.ctx_len
    n = eager.ctx_len
    assert torch.equal(fast.k_ctx[:, :, :, :n], eager.k_ctx[:, :, :, :n])
    assert torch.equal(fast.v_ctx[:, :, :, :n], eager.v_ctx[:, :, :, :n])


def test_fail_first_context_mask_off_by_one():
    """Plant: the block also sees the context slot at its anchor's position s (key <= s: a row no extension wrote
    yet): the proposals' logits differ."""
    def plant(fast):
        fast.key_pos = fast.key_pos - 1

    both, _, _, _, _ = _run(plant)
    assert both.worst > 0.0


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
