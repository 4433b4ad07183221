"""An object in a reference cycle is freed by Python's cyclic collector, at whatever allocation triggers it; freed
during a graph capture, its CUDA graphs, pinned staging buffers and events make CUDA calls a capture forbids, and
that capture fails ("operation failed due to a previous error during capture": tests/test_accept.py's restore test,
once under host load, and .ci/diag_restore.py at its 7th repetition, results/h200/restore-gc; every engine was such
a cycle, its GraphSets holding its bound methods). Two guards: ``GraphSet.capture`` keeps the collector off during
its warm-up and capture, and the engines hold their passes weakly (``graphs.held``), so that a dropped engine is
freed at once. On the CPU, with stand-ins for the CUDA graph objects: the collector off inside, restored after, also
after an error; the fast engines, and the device loops with their engines and drafts (DFlash, DFlash2, MTP), freed
at once (a strong hold planted back fails it). On CUDA: a dead cycle (an engine made to refer to itself) left
uncollected until another engine's capture, with the collector's thresholds at 1 inside the capture: no error with
the guard, a failed capture with it planted away."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from bloomery_gates.kernels import graphs


class _Fake:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a):
        pass

    def replay(self):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", _Fake)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Fake())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Fake)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)


def test_the_collector_is_off_during_warm_up_and_capture(fake_cuda):
    seen = []
    gs = graphs.GraphSet(lambda k: seen.append(gc.isenabled()), "cuda", warmup=2)
    assert gs.enabled and gc.isenabled()
    gs.run(1)
    assert seen == [False, False, False] and gc.isenabled()


def test_the_collector_comes_back_after_an_error(fake_cuda):
    def boom(k):
        raise RuntimeError("capture failed")
    with pytest.raises(RuntimeError, match="capture failed"):
        graphs.GraphSet(boom, "cuda").capture(1)
    assert gc.isenabled() and not graphs.graphing()


def test_a_disabled_collector_stays_disabled(fake_cuda):
    gc.disable()
    try:
        graphs.GraphSet(lambda k: None, "cuda").capture(1)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph captures need a CUDA device")
@pytest.mark.parametrize("plant", [False, True])
def test_a_dead_engine_collected_during_a_capture(plant, monkeypatch):
    """The previous engine left as a dead cycle (no automatic collection outside the captures: thresholds out of
    reach), and the collector's thresholds at 1 inside each capture (not its warm-up): with the guard the capture runs
    without a collection; planted away, the dead engine is freed mid-capture."""
    from test_accept import _prompt, _qwen38, _with_impl
    if plant:                                          # the guard planted away: the collector stays on
        monkeypatch.setattr(graphs.gc, "disable", lambda: None)
    make, spec, _ = _qwen38(torch.device("cuda"), torch.float32)
    prompt, rows = _prompt(spec), [3, 7, 11, 2]
    thresholds = gc.get_threshold()

    def eager_collector(fn):
        def run(key):
            if torch.cuda.is_current_stream_capturing():    # the capture itself, not its warm-up passes
                gc.set_threshold(1, 1, 1)
            try:
                fn(key)
            finally:
                gc.set_threshold(1 << 30, 1 << 30, 1 << 30)
        return run
    failed = None
    try:
        gc.set_threshold(1 << 30, 1 << 30, 1 << 30)
        for _ in range(4):
            e = _with_impl(make, "triton")             # the engine before it is now a dead cycle, not yet collected
            e.cycle = e                                # (engines hold their passes weakly: the cycle is made here)
            e.graphs.fn = eager_collector(e.graphs.fn)
            e.commit_graphs.fn = eager_collector(e.commit_graphs.fn)
            e.prefill(prompt)
            e.verify(rows)
            e.commit(2)
    except (RuntimeError, torch.AcceleratorError) as err:
        failed = err
    finally:
        gc.set_threshold(*thresholds)
        torch.cuda.synchronize()
    if plant:
        assert failed is not None, "no capture failed with the collector on: the test does not reach the defect"
    else:
        assert failed is None, f"a capture failed with the collector off: {failed}"


def _freed_at_once(make) -> bool:
    """Whether the objects ``make()`` returns (after ``make`` used them: an engine, or a device loop with its engine
    and its draft) are all freed when their last references go, with the cyclic collector off: no reference cycle
    holds any of them."""
    import weakref
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        refs = [weakref.ref(o) for o in make()]
        return all(r() is None for r in refs)
    finally:
        if collecting:
            gc.enable()


def _engines():
    from test_accept import BF16, N, R, _prompt, _qwen3, _qwen38

    from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_dflash2, random_qwen38
    from bloomery_gates.kernels.accept import DeviceAccept
    from bloomery_gates.kernels.accept_drafts import DFlash2Dev, DFlashDev, MTPDev
    from bloomery_gates.kernels.drafts.dflash import FastDFlashDraft
    from bloomery_gates.kernels.drafts.dflash2_fast import FastDFlash2Draft
    from bloomery_gates.kernels.drafts.mtp_fast import FastMTPDraft
    from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

    def plain(engines):                                 # a pass, then the chained plain decode
        make, spec, _ = engines()
        e = make()
        e.prefill(_prompt(spec))
        e.decode_plain(e.verify([3]).argmax[0], 4, 2)
        return (e,)

    def dflash_loop():
        make, tspec, dspec = _qwen3()
        d = make()
        draft = FastDFlashDraft(dspec, d, 200)
        acc = DeviceAccept(d, DFlashDev(draft))
        acc.generate(_prompt(tspec), N, dspec.block_size)
        return acc, d, draft

    def mtp_loop():
        spec, mspec = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], torch.device("cpu"), BF16)
        d = FastQwen38Target(spec, "cpu", BF16, 200, max_width=8, impl="torch", attention="torch")
        draft = FastMTPDraft(mspec, d, 200, width=R - 1)
        acc = DeviceAccept(d, MTPDev(draft))
        acc.generate(_prompt(spec), N, R)
        return acc, d, draft
    def dflash2_loop():
        s = HYBRID_SHAPES["qwen38-tiny"]
        spec, _ = random_qwen38(s, torch.device("cpu"), BF16)
        d = FastQwen38Target(spec, "cpu", BF16, 200, max_width=4, impl="torch", attention="torch")
        draft = FastDFlash2Draft(random_dflash2(s, spec, 4, torch.device("cpu"), BF16), d, 200, impl="torch")
        acc = DeviceAccept(d, DFlash2Dev(draft))
        acc.generate(_prompt(spec), N, 4)
        return acc, d, draft
    return {"qwen3": lambda: plain(_qwen3), "qwen38": lambda: plain(_qwen38), "dflash-loop": dflash_loop,
            "mtp-loop": mtp_loop, "dflash2-loop": dflash2_loop}


@pytest.mark.parametrize("name", ["qwen3", "qwen38", "dflash-loop", "mtp-loop", "dflash2-loop"])
def test_an_engine_is_freed_when_its_last_reference_goes(name):
    """The fast engines, their drafts and the device loop hold their passes through ``graphs.held`` (bound methods
    weakly): dropped, they are freed at once (their device memory with them), not at a later collection."""
    assert _freed_at_once(_engines()[name])


def test_the_check_sees_a_cycle(monkeypatch):
    """Planted: GraphSet holding its pass strongly again (the cycle an engine had)."""
    monkeypatch.setattr(graphs, "held", lambda fn: lambda: fn)
    assert not _freed_at_once(_engines()["qwen3"])
