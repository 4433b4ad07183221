"""The graphed hybrid engine (kernels/families/qwen38/fast.py, ``FastQwen38Target``) on CPU: its logits against the
eager ``Qwen38Target`` inside the derived f32 logits band (the bundled fixture and a random small shape), the replay
rollback's bit-exactness at every k (drafted == plain: logits, states, tails), the passes' graph safety (no host read
inside a verify or a commit pass), a generate run lossless with the MTP and DFlash2 drafts; FAIL-first plants for
each. The Triton variants run on CUDA, or on CPU with TRITON_INTERPRET=1; the CUDA-graph test on CUDA only."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from test_qwen38 import FULL, IDS, LIN, make_qwen38

from bloomery_cli import bands
from bloomery_cli.loading import load_target
from bloomery_cli.speculative import generate
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target
from bloomery_gates.kernels.families.qwen38.model import Qwen38Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_only = pytest.mark.skipif(not ktriton.available(DEVICE), reason=(
    f"the Triton kernels need CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEVICE)}"))
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
HAVE_FIXTURE = (FIXTURES / "qwen38-tiny").is_dir()
TYPES = (LIN, FULL, LIN, LIN, FULL)


def _spec():
    return make_qwen38(types=TYPES, nk=2, nv=4, dk=8)      # dk = dv = 8: the Triton path applies


def _fixture():
    spec = load_target(FIXTURES / "qwen38-tiny")
    ids = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    return spec, [i % spec.vocab_size for i in ids]


def _rel_and_band(spec, prompt, window, impl="torch", dev="cpu", plant=None):
    """Prefill, verify ``window``, commit 2, verify one row: each pass's logits (fast vs eager) as worst rel, and
    the f32 logits band of the model's depth at the run's longest row."""
    eager = Qwen38Target(spec, "cpu", torch.float32, 96, len(window), impl="torch")
    fast = FastQwen38Target(spec, dev, torch.float32, 96, len(window), max_width=len(window), impl=impl)
    if plant:
        plant(fast)
    got, want = [], []
    for eng, out in ((eager, want), (fast, got)):
        out.append(eng.prefill(prompt, logits=True).logits.clone())
        out.append(eng.verify(window, logits=True).logits.clone())
        eng.commit(2)
        out.append(eng.verify(window[2:3], logits=True).logits.clone())
    rel = max(bands.worst_rel(g.double().cpu().numpy(), w.double().numpy()) for g, w in zip(got, want, strict=True))
    return rel, bands.logits_band("f32", spec.layer, spec.num_layers, len(prompt) + len(window)).value


@pytest.mark.skipif(not HAVE_FIXTURE, reason="fixture qwen38-tiny absent: bloomery fixtures build")
def test_fast_logits_equal_eager_within_f32_band_on_fixture():
    spec, ids = _fixture()
    rel, band = _rel_and_band(spec, ids[:24], ids[24:28])
    assert rel < band, (rel, band)


def test_fast_logits_equal_eager_within_f32_band_random_shape():
    rel, band = _rel_and_band(_spec(), IDS[:20], IDS[20:24])
    assert rel < band, (rel, band)


def test_fail_first_output_gate_dropped_leaves_the_band():
    """Plant: the gated attention's sigmoid gate is skipped (o, not o * sigmoid(gate)): the band check fails."""
    def plant(fast):
        real = fast._attention

        def ungated(*args):
            with _patched(torch, "sigmoid", lambda x: torch.ones_like(x)):
                return real(*args)
        fast._attention = ungated

    rel, band = _rel_and_band(_spec(), IDS[:20], IDS[20:24], plant=plant)
    assert rel > band


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _drafted_vs_plain(spec, impl="torch", rows=4, plant=None, attention="auto"):
    """Per k: prefill, verify R rows, commit k, continue one row a pass, against the plain run (one real row a
    pass, padded to R): logits, DeltaNet states and conv tails bit-equal?"""
    return [all(part.values()) for part in drafted_vs_plain_parts(spec, impl, rows, plant, attention)]


def drafted_vs_plain_parts(spec, impl="torch", rows=4, plant=None, attention="auto", dev=None):
    """``_drafted_vs_plain`` per part: for each k a dict drafted / cont (logits), state, conv, kcache -> bit-equal?
    (.ci/diag_rollback.py prints them on the H200)."""
    dev = dev or (DEVICE if impl == "triton" else "cpu")
    prompt, window, after = IDS[:12], IDS[12:12 + rows], IDS[12 + rows:16 + rows]

    def engine():
        e = FastQwen38Target(spec, dev, torch.float32, 64, rows, max_width=rows, impl=impl, attention=attention)
        if plant:
            plant(e)
        e.prefill(prompt)
        return e

    plain = engine()
    pl = []
    for x in window + after:
        pl.append(plain.verify([x], logits=True).logits[0].clone())
        plain.commit(1)
    pl = torch.stack(pl)
    res = []
    for k in range(1, rows + 1):
        eng = engine()
        drafted = eng.verify(window, logits=True).logits[:k].clone()
        eng.commit(k)
        cont = []
        for x in window[k:] + after:
            cont.append(eng.verify([x], logits=True).logits[0].clone())
            eng.commit(1)
        res.append({"drafted": torch.equal(drafted, pl[:k]), "cont": torch.equal(torch.stack(cont), pl[k:]),
                    "state": torch.equal(eng.state, plain.state), "conv": torch.equal(eng.conv_tail, plain.conv_tail),
                    "kcache": torch.equal(eng.k_cache[:, :, :eng.length], plain.k_cache[:, :, :plain.length])})
    return res


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_rollback_at_every_k_equals_the_plain_run(impl):
    """Triton: the DeltaNet kernels (prepare, recurrence, out norm) and the Triton rms / silu; the attention is the
    masked matmul on CPU, because the interpreter's tl.dot is not row-position invariant (measured: a row's
    attention output moves by 6e-8 with its place in the tile), and the compiled kernel on CUDA."""
    assert all(_drafted_vs_plain(_spec(), impl, attention="auto" if DEVICE == "cuda" else "torch"))


def test_fail_first_commit_replays_one_row_too_many():
    """Plant: the commit's replay runs rows 0..k (one past the kept prefix): no k stays bit-equal to the plain run."""
    def plant(e):
        real = e._commit_pass
        e._commit_pass = lambda kept: real(min(kept + 1, e.max_width))
        e.commit_graphs.fn = e._commit_pass

    assert not any(_drafted_vs_plain(_spec(), plant=plant))


def test_fail_first_commit_keeps_the_pass_tail():
    """Plant: the conv tail after a commit is the pass's last K-1 rows, whatever was kept (the padded plain run takes
    in its padding rows): no k stays bit-equal."""
    def plant(e):
        real = e._commit_pass

        def fn(kept):
            real(kept)
            k = e.hybrid.linear_conv_kernel_dim
            e.conv_tail.copy_(e.proj[:, e._last:e._last + k - 1, :e.hybrid.conv_dim])
        e._commit_pass = fn
        e.commit_graphs.fn = fn

    assert not any(_drafted_vs_plain(_spec(), plant=plant))


class HostRead(RuntimeError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Any tensor -> host read (item, tolist, bool/int/float/index of a tensor) raises ``HostRead``: a pass that
    would sync (and could not be captured into a CUDA graph) fails here on CPU already."""
    def boom(*_a, **_k):
        raise HostRead("a host read of a device value inside a pass")

    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
    old = {n: getattr(torch.Tensor, n) for n in names}
    for n in names:
        setattr(torch.Tensor, n, boom)
    try:
        yield
    finally:
        for n, f in old.items():
            setattr(torch.Tensor, n, f)


def test_verify_and_commit_passes_read_nothing_back():
    eng = FastQwen38Target(_spec(), "cpu", torch.float32, 64, None, max_width=4, impl="torch")
    eng.prefill(IDS[:12])
    eng.inp.put([eng.length, *IDS[12:16]])
    with no_host_reads():
        for r in (1, 4):
            eng._verify_pass(r)
        eng._commit_pass(3)


def test_fail_first_a_pass_with_a_host_branch_is_caught():
    """Plant: the verify pass branches on a device value (as an ``if p0 > 0`` would): the guard raises."""
    eng = FastQwen38Target(_spec(), "cpu", torch.float32, 64, None, max_width=4, impl="torch")
    eng.prefill(IDS[:12])
    real = eng.forward
    eng.forward = lambda ids, p0, bufs: real(ids, p0 if bool(p0 > 0) else p0, bufs)
    with no_host_reads(), pytest.raises(HostRead):
        eng._verify_pass(1)


@triton_only
def test_triton_engine_matches_torch_engine():
    """Logits and the committed state of the Triton path against the torch path, inside the derived f32 logits band."""
    spec = _spec()
    a = FastQwen38Target(spec, "cpu", torch.float32, 64, 4, max_width=4, impl="torch")
    b = FastQwen38Target(spec, DEVICE, torch.float32, 64, 4, max_width=4, impl="triton")
    for e in (a, b):
        e.prefill(IDS[:20])
    la, lb = a.verify(IDS[20:24], logits=True).logits, b.verify(IDS[20:24], logits=True).logits
    band = bands.logits_band("f32", spec.layer, spec.num_layers, 24).value
    assert bands.worst_rel(lb.double().cpu().numpy(), la.double().numpy()) < band
    a.commit(3)
    b.commit(3)
    for x, y in ((b.state, a.state), (b.conv_tail, a.conv_tail)):
        assert bands.worst_rel(x.double().cpu().numpy(), y.double().numpy()) < band

def test_drafted_generate_is_lossless_with_mtp_and_dflash2():
    """The bench's drafts bound to the fast engine: greedy drafted ids == plain ids (rows padded alike)."""
    from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_dflash2, random_qwen38
    from bloomery_gates.kernels.drafts.dflash2 import DFlash2Draft
    from bloomery_gates.kernels.drafts.mtp import MTPDraft

    s, cpu = HYBRID_SHAPES["qwen38-tiny"], torch.device("cpu")
    tspec, mspec = random_qwen38(s, cpu, torch.float32)
    dspec = random_dflash2(s, tspec, 4, cpu, torch.float32)
    prompt = IDS[:10]
    for make in (lambda t: MTPDraft(mspec, t, 96, width=3), lambda t: DFlash2Draft(dspec, t, 96, impl="torch")):
        eng = FastQwen38Target(tspec, cpu, torch.float32, 96, 4, max_width=4, impl="torch")
        plain = generate(eng, None, prompt, 24).ids
        drafted = generate(eng, make(eng), prompt, 24)
        assert drafted.ids == plain and drafted.tally.windows > 0


def test_named_errors():
    eng = FastQwen38Target(_spec(), "cpu", torch.float32, 16, None, max_width=4, impl="torch")
    with pytest.raises(RuntimeError, match="commit without a pass"):
        eng.commit(1)
    eng.prefill(IDS[:4])
    with pytest.raises(ValueError, match="captures 1..4"):
        eng.verify(IDS[:5])
    eng.verify(IDS[:2])
    with pytest.raises(ValueError, match="cannot commit 3 rows of a pass of 2"):
        eng.commit(3)


@cuda_only
def test_cuda_graph_passes_equal_eager_passes_and_stay_lossless():
    spec = _spec()
    runs = {}
    for graphs in (False, True):
        eng = FastQwen38Target(spec, "cuda", torch.bfloat16, 96, 4, max_width=4, graphs=graphs)
        eng.prefill(IDS[:12])
        eng.capture(range(1, 5))
        runs[graphs] = generate(eng, None, IDS[:12], 32).ids
    assert runs[True] == runs[False]

