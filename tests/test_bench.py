"""The fast decode engine (fused weights and ops, graph-ready passes) against the eager engine, the Triton
decode kernels against their torch rule, and ``bloomery bench`` end to end on CPU (tiny shape, fixtures)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_dflash, make_target

from bloomery_cli.bench.command import ReplayDraft, accept_for_tau, bench, bench_command
from bloomery_cli.bench.shapes import SHAPES, hf_model, random_pair, weight_bytes
from bloomery_cli.speculative import generate
from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.drafts.dflash import DFlashDraft, FastDFlashDraft
from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target, Qwen3Target, stack_rows
from bloomery_gates.kernels.graphs import TorchOps

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26]


def test_fast_engine_matches_eager_pass_by_pass():
    t = make_target(layers=3)
    eager = Qwen3Target(t, "cpu", torch.float32, 64, rows=4)
    fast = FastQwen3Target(t, "cpu", torch.float32, 64, max_width=4, impl="torch")
    a, b = eager.prefill(PROMPT, logits=True), fast.prefill(PROMPT, logits=True)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.taps, a.taps, atol=1e-5, rtol=1e-5)
    for ids, keep in (([5, 6, 7], 2), ([8, 9, 10, 11], 4), ([12], 1)):
        a, b = eager.verify(ids, logits=True), fast.verify(ids, logits=True)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
        assert b.argmax == a.argmax and b.taps.shape == a.taps.shape
        eager.commit(keep)
        fast.commit(keep)


def test_fast_draft_matches_eager_draft_and_stays_lossless():
    t = make_target(layers=3)
    d = make_dflash(t, layers=2, block=4, layer_ids=(0, 2))
    eager = Qwen3Target(t, "cpu", torch.float32, 96, rows=4)
    fast = FastQwen3Target(t, "cpu", torch.float32, 96, max_width=4, tap_ids=(1, 3), impl="torch")
    de, df = DFlashDraft(d, eager, 96), FastDFlashDraft(d, fast, 96)
    pe, pf = eager.prefill(PROMPT), fast.prefill(PROMPT)
    de.prompt(pe.taps)
    df.prompt(pf.taps)
    anchor = pe.argmax[-1]
    for kept in (2, 1, 3):
        a, b = de.propose(anchor, detail=True), df.propose(anchor, detail=True)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
        va, vb = eager.verify([anchor, *a.ids]), fast.verify([anchor, *b.ids])
        de.accept(kept, va.taps)
        df.accept(kept, vb.taps)
        eager.commit(kept)
        fast.commit(kept)
        anchor = va.argmax[kept - 1]
    with pytest.raises(ValueError, match="this draft reads"):
        FastDFlashDraft(d, FastQwen3Target(t, "cpu", torch.float32, 96, max_width=4, tap_ids=(1,), impl="torch"), 96)
    plain = generate(FastQwen3Target(t, "cpu", torch.float32, 96, max_width=4, impl="torch"), None, PROMPT, 40)
    eng = FastQwen3Target(t, "cpu", torch.float32, 96, max_width=4, tap_ids=(1, 3), impl="torch")
    assert generate(eng, FastDFlashDraft(d, eng, 96), PROMPT, 40).ids == plain.ids
    every = FastQwen3Target(t, "cpu", torch.float32, 96, max_width=4, impl="torch")    # every tap (the gate's)
    assert generate(every, FastDFlashDraft(d, every, 96), PROMPT, 40).ids == plain.ids


def test_stack_rows_views_adjacent_blocks_and_copies_others():
    buf = torch.arange(24.0).view(6, 4)
    v = stack_rows(buf[:2], buf[2:3], buf[3:])
    assert v.data_ptr() == buf.data_ptr() and torch.equal(v, buf)
    c = stack_rows(buf[3:], buf[:2])
    assert c.data_ptr() != buf.data_ptr() and torch.equal(c, torch.cat([buf[3:], buf[:2]]))


def test_accept_for_tau_solves_the_geometric_sum():
    for tau in (1.5, 3.0, 6.0, 12.0):
        a = accept_for_tau(tau, 16)
        assert sum(a ** j for j in range(16)) == pytest.approx(tau, rel=1e-9)
    assert accept_for_tau(16.0, 16) == 1.0 and accept_for_tau(1.0, 16) == pytest.approx(0.0, abs=1e-12)


def test_replay_draft_proposes_the_reference_with_the_set_acceptance():
    class Inner:
        def prompt(self, taps): ...
        def propose(self, anchor): return type("P", (), {"ids": [0, 0, 0]})()
        def accept(self, kept, taps): ...

    ref = list(range(100, 140))
    rd = ReplayDraft(Inner(), ref, 1.0, 500)
    rd.prompt(None)
    assert rd.propose(100).ids == [101, 102, 103]
    rd.accept(4, None)
    assert rd.propose(104).ids == [105, 106, 107] and rd.off_track == 0
    rd = ReplayDraft(Inner(), ref, 0.0, 500)
    rd.prompt(None)
    assert rd.propose(100).ids == [102, 103, 104]


def test_random_shape_weights_are_views_and_hf_agrees():
    t, d = random_pair(SHAPES["tiny"], torch.device("cpu"), torch.float32)
    q, k = t.tensors["model.layers.0.self_attn.q_proj.weight"], t.tensors["model.layers.0.self_attn.k_proj.weight"]
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    assert weight_bytes(t.tensors) == sum(x.numel() * x.element_size() for x in t.tensors.values())
    fast = FastQwen3Target(t, "cpu", torch.float32, 64, max_width=4, impl="torch")
    assert fast.layers[0].wqkv.data_ptr() == q.data_ptr()               # fused without a copy
    ours = fast.prefill(PROMPT, logits=True).logits
    with torch.no_grad():
        theirs = hf_model(t, torch.device("cpu"))(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert d.target_layer_ids == (1,) and d.block_size == 4


def test_bench_tiny_shape_on_cpu():
    rec = bench("qwen3-dflash", "tiny", "cpu", "f32", prompt_len=24, n=40, hf_tokens=8, emit=lambda line: None,
                quiet=True)
    c = rec["conditions"]
    assert c["device"] == "cpu" and c["dtype"] == "f32" and c["batch"] == 1 and c["width"] == "fixed"
    assert rec["plain"]["tok_s"] > 0 and rec["plain"]["ids_equal_padded"]
    assert [v["rows"] for v in rec["verify"]] == [1, 2, 3, 4]
    sweep = {s["tau_nominal"]: s for s in rec["sweep"]}
    assert set(sweep) == {1.0, 2.0, 3.0, 4.0}
    assert sweep[1.0]["accept_mean"] == 1.0 and sweep[4.0]["accept_mean"] == 4.0
    assert all(s["ids_identical"] and s["off_track"] == 0 for s in rec["sweep"])
    assert [p["a"] for p in rec["cost_policy"]] == [0.02, 0.98]
    assert all(p["ids_identical"] for p in rec["cost_policy"])
    assert rec["hf"]["ids_equal_ours"] and rec["hf"]["tok_s"] > 0
    assert any(line.startswith("plain tok_s=") for line in rec["lines"])


def test_bench_command_writes_the_record(tmp_path):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bench_command)
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--dtype", "f32",
                                   "--prompt-len", "16", "-n", "24", "--width", "cost", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert rec["conditions"]["width"] == "cost" and rec["conditions"]["commit"]
    assert all(s["ids_identical"] for s in rec["sweep"])
    bad = CliRunner().invoke(app, ["qwen3-dflash", "--shape", "huge", "--device", "cpu"])
    assert bad.exit_code == 2 and "expected one of" in bad.output


def test_bench_on_the_gate_fixtures_measures_acceptance():
    rec = bench("qwen3-dflash", None, "cpu", "f32", n=48, hf_tokens=4, taus=(1.0, 8.0), emit=lambda line: None,
                quiet=True)
    m = rec["measured"]
    assert m["accept_mean"] > 1.0 and m["tok_s"] > 0 and m["ids_identical_padded"]
    assert rec["sweep"][-1]["accept_mean"] == 8.0 and rec["sweep"][-1]["ids_identical"]


triton_only = pytest.mark.skipif(not ktriton.available("cpu") and not torch.cuda.is_available(), reason=(
    "the Triton decode kernels need CUDA and triton (or TRITON_INTERPRET=1)"))


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_decode_ops_match_torch(dtype):
    from bloomery_gates.kernels.triton.decode import TritonOps

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    nq, nkv, d, h, cap = 8, 2, 32, 64, 96
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    x = torch.randn(5, h, generator=gen).to(dev, dtype)
    w = torch.rand(h, generator=gen).to(dev) + 0.5
    torch.testing.assert_close(TritonOps.rms(x, w, 1e-6), TorchOps.rms(x, w, 1e-6), **tol)
    gu = torch.randn(3, 2 * 40, generator=gen).to(dev, dtype)
    torch.testing.assert_close(TritonOps.silu_mul(gu), TorchOps.silu_mul(gu), **tol)
    from bloomery_gates.kernels.ops.rope import rope_tables
    cos, sin = rope_tables(d, 10000.0, cap, dev)
    qn, kn = (torch.rand(d, generator=gen).to(dev) + 0.5 for _ in range(2))
    kc0 = torch.randn(nkv, cap, d, generator=gen).to(dev, dtype)
    vc0 = torch.randn(nkv, cap, d, generator=gen).to(dev, dtype)
    for r, p0, causal in ((1, 40, True), (6, 17, True), (4, 60, False)):
        qkv = torch.randn(r, (nq + 2 * nkv) * d, generator=gen).to(dev, dtype)
        p = torch.tensor([p0], device=dev)
        outs = []
        for ops in (TritonOps, TorchOps):
            q, kc, vc = qkv.clone(), kc0.clone(), vc0.clone()
            ops.qk_rope_store(q, nq, nkv, d, qn, kn, cos, sin, p, kc, vc, 1e-6)
            outs.append((q, kc, vc, ops.attention(q, nq, nkv, d, kc, vc, p, causal)))
        for a, b in zip(outs[0][:3], outs[1][:3], strict=True):
            torch.testing.assert_close(a, b, **tol)
        # compiled Triton dots of f32 operands run in tf32 (the interpreter's in f32)
        attn_tol = {"atol": 5e-3, "rtol": 5e-3} if dev == "cuda" and dtype == torch.float32 else tol
        torch.testing.assert_close(outs[0][3], outs[1][3], **attn_tol)
        # qwen38's sigmoid gate, a strided [R, nq, d] view, applied in the attention's combine kernel
        gate = torch.randn(r, nq, 2 * d, generator=gen).to(dev, dtype)[..., d:]
        gated = [ops.attention(outs[0][0], nq, nkv, d, outs[0][1], outs[0][2], p, causal, gate=gate)
                 for ops in (TritonOps, TorchOps)]
        torch.testing.assert_close(gated[0], gated[1], **attn_tol)
        torch.testing.assert_close(gated[1], outs[1][3] * torch.sigmoid(gate.reshape(r, nq * d)), **tol)
        assert not torch.allclose(gated[0], outs[0][3], **attn_tol)        # the gate is applied, not dropped
        # keys from ``first`` on (an MTP store's slot 0 holds no row): equal to the masked matmul, and not the same
        # as attending every key (slot 0 here holds a random row, so dropping the bound changes the output)
        later = [ops.attention(outs[0][0], nq, nkv, d, outs[0][1], outs[0][2], p, causal, first=1)
                 for ops in (TritonOps, TorchOps)]
        torch.testing.assert_close(later[0], later[1], **attn_tol)
        assert not torch.allclose(later[1], outs[1][3], **attn_tol)


def test_stack_rows_copies_neighbours_from_different_storages():
    big = torch.zeros(8, 4)
    a, b = big[:4].clone(), big[4:].clone()            # separate storages, whatever their addresses
    s = stack_rows(a, b)
    assert s.untyped_storage().data_ptr() not in (a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_passes_equal_eager_passes_and_stay_lossless():
    t, d = random_pair(SHAPES["tiny"], torch.device("cuda"), torch.bfloat16)
    taps = tuple(l + 1 for l in d.target_layer_ids)
    runs = {}
    for graphs in (False, True):
        eng = FastQwen3Target(t, "cuda", torch.bfloat16, 128, max_width=4, tap_ids=taps, graphs=graphs)
        plain = generate(eng, None, PROMPT, 48)
        eng.rows = 4
        padded = generate(eng, None, PROMPT, 48)
        drafted = generate(eng, FastDFlashDraft(d, eng, 128, graphs=graphs), PROMPT, 48)
        runs[graphs] = (plain.ids, padded.ids, drafted.ids, eng.verify(PROMPT[:3], logits=True).logits.clone())
        assert drafted.ids == padded.ids
        assert eng.graphs.enabled == graphs and (len(eng.graphs.graphs) > 0) == graphs
    assert runs[False][:3] == runs[True][:3]
    torch.testing.assert_close(runs[False][3], runs[True][3], rtol=1e-2, atol=1e-2)


def test_first_engine_frees_a_failed_path_before_building_the_next():
    """A path whose build raises may leave an object behind in a reference cycle (every engine was one before its
    graphs held their passes weakly); on a card it is collected before the next path is built, so the two never hold
    memory at once."""
    import gc
    import weakref

    from bloomery_cli.bench.common import first_engine

    class Engine:
        def __init__(self):
            self.fn = self.run                          # a cycle, as an engine's GraphSet made

        def run(self):
            pass

    dead = []

    def build(path):
        if path == "fast":
            e = Engine()
            dead.append(weakref.ref(e))
            raise RuntimeError("capture failed")
        assert dead[0]() is None, "the failed path's engine is still alive while the next one is built"
        return "target", None, path, 0.0

    logs = []
    collecting = gc.isenabled()
    gc.disable()                                        # only first_engine's own collection may free it
    try:
        got = first_engine([("fast",), ("eager",)], build, str, torch.device("cuda"), logs.append)
    finally:
        if collecting:
            gc.enable()
    assert got == ("target", None, "eager") and "capture failed" in logs[0]
