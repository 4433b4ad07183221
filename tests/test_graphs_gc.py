"""``GraphSet.capture`` keeps Python's cyclic garbage collector off during its warm-up and capture. An engine holds
its graphs through bound methods (a reference cycle), so a dropped engine is freed by the collector, at whatever
allocation triggers it; freed during another engine's capture, its CUDA graphs, pinned staging buffers and events
make CUDA calls a capture forbids, and that capture fails ("operation failed due to a previous error during
capture": tests/test_accept.py's restore test, once under host load, and .ci/diag_restore.py at its 7th repetition,
results/h200/restore-gc). On the CPU, with stand-ins for the CUDA graph objects: the collector off inside, restored
after, also after an error. On CUDA: a dead engine left uncollected until another engine's capture, with the collector's
thresholds at 1 inside the capture: no error with the guard, a failed capture with it planted away."""

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
