"""Device-side accept and rollback (``kernels.accept``): the drafted loop with the acceptance decision, the emitted
ids, the next anchor and the commit on the device gives ``speculative.generate``'s ids, windows, KV rows and (the
hybrid) recurrent states bit for bit, and the plain loop's ids; planted defects (kept off by one, the state or the
conv tail restored to the wrong row, the anchor from the wrong row) make the comparison fail. bf16 on the CPU; the
same comparison with CUDA graphs when a CUDA device is present."""

from __future__ import annotations

import pytest
import torch

from bloomery_cli.bench.common import ReplayDraft
from bloomery_cli.bench.shapes import SHAPES, random_pair
from bloomery_cli.speculative import generate
from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.accept import DeviceAccept
from bloomery_gates.kernels.accept_drafts import DFlashDev, MTPDev, SyntheticDraft
from bloomery_gates.kernels.drafts.dflash import FastDFlashDraft, Proposal
from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

CPU = torch.device("cpu")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_only = pytest.mark.skipif(not ktriton.available(DEVICE), reason="the Triton kernels need CUDA and triton "
                                 "(or TRITON_INTERPRET=1)")
BF16 = torch.bfloat16
R, N = 4, 40


class Stub:
    """A draft with no cost: ReplayDraft's inner, proposing R-1 ids (ReplayDraft replaces them)."""

    def prompt(self, taps):
        pass

    def propose(self, anchor):
        return Proposal([0] * (R - 1))

    def accept(self, kept, taps):
        pass


def _qwen3(dev=CPU, dtype=BF16):
    tspec, dspec = random_pair(SHAPES["tiny"], CPU, dtype)
    return lambda: FastQwen3Target(tspec, dev, dtype, 200, max_width=8), tspec, dspec


def _qwen38(dev=CPU, dtype=BF16):
    from test_qwen38 import FULL, LIN, make_qwen38

    spec = make_qwen38(types=(LIN, FULL, LIN, LIN, FULL), nk=2, nv=4, dk=8)
    spec = spec.__class__(**{**spec.__dict__, "tensors": {k: v.to(dtype) for k, v in spec.tensors.items()}})
    impl = "torch" if dev.type == "cpu" else "auto"
    return lambda: FastQwen38Target(spec, dev, dtype, 200, max_width=8, impl=impl, attention="torch"), spec, None


ENGINES = {"qwen3": _qwen3, "qwen38": _qwen38}


def _prompt(spec):
    return [i % spec.vocab_size for i in range(5, 25)]


def _reference(make, spec):
    t = make()
    t.rows = R
    run = generate(t, None, _prompt(spec), N + R)
    return run.ids


def _host(make, spec, ref, a, seed=3):
    t = make()
    run = generate(t, ReplayDraft(Stub(), ref, a, spec.vocab_size, seed), _prompt(spec), N)
    return run, t


def _device(make, spec, ref, a, seed=3, graphs=False, fused=None):
    t = make()
    d = SyntheticDraft(t.device, spec.vocab_size, R - 1, N + 2 * R)
    d.load(ref, a, seed)
    first = t.prefill(_prompt(spec)).argmax[-1]
    return DeviceAccept(t, d, graphs=graphs, fused=fused).run(first, N, R), t


def mismatches(hrun, h, drun, d) -> list[str]:
    """What differs between the host loop (run, engine) and the device loop; [] when all agree bit for bit."""
    bad = []
    if drun.ids != hrun.ids or drun.emitted != hrun.emitted:
        bad.append("ids")
    if drun.windows != hrun.windows:
        bad.append("windows")
    if d.length != h.length:
        bad.append("length")
        return bad
    layers = getattr(h, "attn_layers", range(h.spec.num_layers))
    if not all(torch.equal(x, y) for l in layers for x, y in zip(d.kv_rows(l), h.kv_rows(l), strict=True)):
        bad.append("kv")
    if hasattr(h, "state"):
        if not torch.equal(d.state, h.state):
            bad.append("state")
        if not torch.equal(d.conv_tail, h.conv_tail):
            bad.append("conv_tail")
    last = hrun.emitted[-1]
    if not torch.equal(d.verify([last]).taps.cpu(), h.verify([last]).taps.cpu()):
        bad.append("next pass")
    return bad


@pytest.fixture(scope="module", params=list(ENGINES))
def setup(request):
    make, spec, _ = ENGINES[request.param]()
    return request.param, make, spec, _reference(make, spec)


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.skipif(
    not ktriton.interpreting(), reason="these engines run on the CPU: the fused bookkeeping there needs "
    "TRITON_INTERPRET=1 (on CUDA test_device_accept_graphs_on_cuda runs it, the default)"))])
@pytest.mark.parametrize("a", [0.3, 0.8, 1.0])
def test_device_accept_equals_generate_and_plain(setup, a, fused):
    """fused: the window's bookkeeping in ``triton.window``'s two launches (CUDA's default)."""
    _, make, spec, ref = setup
    hrun, h = _host(make, spec, ref, a)
    drun, d = _device(make, spec, ref, a, fused=fused)
    assert mismatches(hrun, h, drun, d) == []
    assert 1 < sum(k for _, k in drun.windows) / len(drun.windows) <= R          # the draft was right sometimes
    plain = generate(make(), None, _prompt(spec), N).ids                         # one row a pass, unpadded
    assert drun.ids == plain


def _dflash_case(dev=CPU, dtype=BF16, graphs=False):
    make, tspec, dspec = _qwen3(dev, dtype)
    t = make()
    hrun = generate(t, FastDFlashDraft(dspec, t, 200), _prompt(tspec), N, dspec.block_size)
    d = make()
    draft = DFlashDev(FastDFlashDraft(dspec, d, 200))
    drun = DeviceAccept(d, draft, graphs=graphs).generate(_prompt(tspec), N, dspec.block_size)
    assert draft.d.ctx_len == d.length
    return hrun, t, drun, d


def _mtp_case(dev=CPU, dtype=BF16, graphs=False):
    from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_qwen38
    from bloomery_gates.kernels.drafts.mtp_fast import FastMTPDraft

    spec, mspec = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], CPU, dtype)
    impl = "torch" if dev.type == "cpu" else "auto"

    def make():
        return FastQwen38Target(spec, dev, dtype, 200, max_width=8, impl=impl, attention="torch")
    t = make()
    hrun = generate(t, FastMTPDraft(mspec, t, 200, width=R - 1, graphs=graphs), _prompt(spec), N)
    d = make()
    drun = DeviceAccept(d, MTPDev(FastMTPDraft(mspec, d, 200, width=R - 1, graphs=graphs)), graphs=graphs).generate(
        _prompt(spec), N, R)
    return hrun, t, drun, d


def test_device_accept_with_the_real_dflash_draft():
    """qwen3 + FastDFlashDraft, its proposals made on the device: generate's windows and ids."""
    assert mismatches(*_dflash_case()) == []


def _mtp_wrong_row(self, p0, r, kept):                    # planted: the chain starts from row kept, not kept-1
    return _REAL_MTP(self, p0, r, (kept + 1).clamp(max=r))


_REAL_MTP = MTPDev.accept_dev


@pytest.mark.parametrize("plant", [False, True])
def test_device_accept_with_the_real_mtp_draft(plant, monkeypatch):
    """qwen38 + FastMTPDraft (mtp_fast), its chained proposals made on the device after each window's accept:
    generate's ids, KV rows and states; its windows too on this shape (the rows of a pass round alike here).
    Planted: the chain starts from the wrong row: the windows differ."""
    if plant:
        monkeypatch.setattr(MTPDev, "accept_dev", _mtp_wrong_row)
    hrun, t, drun, d = _mtp_case()
    assert mismatches(hrun, t, drun, d) == (["windows"] if plant else [])
    assert drun.ids == hrun.ids                                                    # lossless even when planted
    # No acceptance floor here: a random MTP head matches a random target by chance (about 1 / vocab a row), and
    # on the H200 host (16 threads, other rounding) this case kept 1 in all 39 windows. Rollback past kept > 1 is
    # held by the synthetic-draft cases above (1 < mean kept <= R), the real draft's windows by ``mismatches``.


def test_window_reads_nothing_back(setup):
    from test_qwen38_fast import no_host_reads

    _, make, spec, ref = setup
    t = make()
    d = SyntheticDraft(CPU, spec.vocab_size, R - 1, N + 2 * R)
    d.load(ref, 0.8, 3)
    loop = DeviceAccept(t, d, graphs=False)
    first = t.prefill(_prompt(spec)).argmax[-1]
    loop.bufs.start(t.length, first, N)
    with no_host_reads():
        loop._window(R)


def test_bad_input(setup):
    _, make, spec, ref = setup
    t = make()
    loop = DeviceAccept(t, SyntheticDraft(CPU, spec.vocab_size, R - 1, N + 2 * R), graphs=False)
    first = t.prefill(_prompt(spec)).argmax[-1]
    for n, r in ((N, 0), (N, 9), (0, R), (500, R)):
        with pytest.raises(ValueError):
            loop.run(first, n, r)


# ---- FAIL-first: each planted defect makes the comparison fail (bf16, the tiny shapes) ----

def _off_by_one(self, a, r):                                  # both paths: the torch ops and the fused kernel
    return (_REAL_KEPT(self, a, r) + 1).clamp(max=r)


def _anchor_wrong_row(self, a, kept, r):
    _REAL_TAIL(self, a, kept, r)
    self.bufs.ids[:1].copy_(a.index_select(0, kept.clamp(max=a.shape[0] - 1)))


_REAL_KEPT, _REAL_TAIL = DeviceAccept._kept, DeviceAccept._tail


def _commit_state_row(self, kept, r):
    return _REAL_COMMIT(self, kept + (kept < r).long(), r)                         # the state one row too far


def _tail_wrong_row(self, kept, r):
    _REAL_COMMIT(self, kept, r)                                          # the state right, the tail a row short
    c = self.conv_tail.shape
    self.conv_tail.copy_(self.proj.index_select(1, (kept - 1).clamp(min=0) + self.key_pos[:c[1]])[:, :, :c[2]])


_REAL_COMMIT = FastQwen38Target.commit_dev


@pytest.mark.parametrize("plant", ["kept", "anchor", "state", "tail"])
def test_fail_first_planted_defects_are_caught(setup, plant, monkeypatch):
    name, make, spec, ref = setup
    if plant in ("state", "tail") and name != "qwen38":
        pytest.skip("an attention-only engine has no recurrent state")
    hrun, h = _host(make, spec, ref, 0.8)
    if plant == "kept":
        monkeypatch.setattr(DeviceAccept, "_kept", _off_by_one)
    elif plant == "anchor":
        monkeypatch.setattr(DeviceAccept, "_tail", _anchor_wrong_row)
    else:
        monkeypatch.setattr(FastQwen38Target, "commit_dev", _commit_state_row if plant == "state" else _tail_wrong_row)
    try:
        drun, d = _device(make, spec, ref, 0.8)
    except RuntimeError:                                   # the host's range check on kept caught it first
        return
    assert mismatches(hrun, h, drun, d), f"the planted {plant} defect went unnoticed"


def _commit_every_kept(make, spec) -> list[str]:
    """One window of R rows, then commit_dev(kept) against verify + commit(kept) on a twin, kept = 0..R: the
    state and the conv tail (kept = 0: untouched). -> the kept values whose state or tail differ."""
    prompt, rows = _prompt(spec), [3, 7, 11, 2]
    bad = []
    for kept in range(R + 1):
        h, d = make(), make()
        h.prefill(prompt)
        d.prefill(prompt)
        h.verify(rows)
        if kept:
            h.commit(kept)
        d.rows_pass(torch.tensor(rows, device=d.device), torch.tensor([d.length], device=d.device))
        d.commit_dev(torch.tensor([kept], device=d.device), R)
        if not (torch.equal(h.state, d.state) and torch.equal(h.conv_tail, d.conv_tail)):
            bad.append(kept)
    return bad


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_commit_dev_restores_the_state_after_row_kept_minus_1(impl):
    """kept = 0..R: the masked replay (rows >= kept with g = b = 0) gives commit(kept)'s state bit for bit, on the
    torch scan and on the Triton recurrence (CUDA, or its interpreter with TRITON_INTERPRET=1)."""
    dev = torch.device(DEVICE if impl == "triton" else "cpu")
    make, spec, _ = _qwen38(dev, torch.float32)
    assert _commit_every_kept(lambda: _with_impl(make, impl), spec) == []


def _with_impl(make, impl):
    t = make()
    if impl == "triton":
        from bloomery_gates.kernels.families.qwen38.model import fused_ops
        from bloomery_gates.kernels.triton import delta_impl

        t.impl, t.recur = "triton", delta_impl("triton")
        t.prep, t.out_norm = fused_ops("triton")       # the impl's prepare with it (it writes the rows in place)
    return t


@pytest.mark.parametrize("plant", ["state", "tail"])
def test_fail_first_commit_dev_wrong_row(plant, monkeypatch):
    make, spec, _ = _qwen38()
    monkeypatch.setattr(FastQwen38Target, "commit_dev", _commit_state_row if plant == "state" else _tail_wrong_row)
    assert _commit_every_kept(make, spec) != []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("case", ["qwen3", "qwen38", "dflash", "mtp"])
def test_device_accept_graphs_on_cuda(case):
    """The same comparisons with the window captured as a CUDA graph (Triton ops where the engine picks them; the
    hybrid's masked replay on the Triton recurrence): ids, windows, KV rows, states and the next pass, bit for bit."""
    cuda = torch.device("cuda")
    if case in ENGINES:
        make, spec, _ = ENGINES[case](cuda, torch.float32)
        ref = _reference(make, spec)
        hrun, h = _host(make, spec, ref, 0.8)
        drun, d = _device(make, spec, ref, 0.8, graphs=True)
        assert mismatches(hrun, h, drun, d) == []
    else:
        assert mismatches(*(_dflash_case if case == "dflash" else _mtp_case)(cuda, torch.float32, True)) == []


class _Bufs:
    """A window's buffers for the bookkeeping alone (ids, out and the counters of ``WindowBufs``)."""

    def __init__(self, dev, r, gen):
        self.ids = torch.randint(0, 3, (r + 2,), generator=gen).to(dev)
        self.out = torch.full((1 + 2 * 16,), -1, dtype=torch.long, device=dev)
        self.p0, self.cnt, self.w = (torch.randint(0, 50, (1,), generator=gen).to(dev) for _ in range(3))
        self.n = torch.randint(0, 50, (1,), generator=gen).to(dev)


@triton_only
def test_fused_window_bookkeeping_equals_the_torch_ops():
    """``triton.window``'s two launches against ``DeviceAccept``'s torch ops on random windows (ids from 3 values,
    so every prefix length occurs; cnt above and below n): kept, out, the next anchor, p0, cnt, w all equal."""
    dev = torch.device(DEVICE)
    gen = torch.Generator().manual_seed(0)
    for trial in range(60):
        r = 1 + trial % 9
        a = torch.randint(0, 3, (r,), generator=gen).to(dev)
        runs = []
        for fused in (False, True):
            loop = DeviceAccept.__new__(DeviceAccept)
            loop.fused, loop.kept_buf = fused, torch.zeros(1, dtype=torch.long, device=dev)
            loop.bufs = _Bufs(dev, r, torch.Generator().manual_seed(trial))
            kept = loop._kept(a, r).clone()
            loop._tail(a, kept, r)
            b = loop.bufs
            runs.append([kept, b.out[:2 * r], b.ids[:1], b.p0, b.cnt, b.w])
        assert all(torch.equal(x, y) for x, y in zip(*runs, strict=True)), (trial, runs)


@triton_only
def test_fail_first_fused_kept_off_by_one_is_caught(monkeypatch):
    """Plant: the fused decision one row long (its first miss counted as a hit); the comparison above fails."""
    from bloomery_gates.kernels.triton import window

    real = window.kept
    monkeypatch.setattr(window, "kept", lambda ids, a, cnt, n, out: real(ids, a, cnt, n, out).add_(
        (out > 0) & (out < a.shape[0])))
    with pytest.raises(AssertionError):
        test_fused_window_bookkeeping_equals_the_torch_ops()
