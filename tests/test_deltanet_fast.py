"""The hybrid engine's fast path: the delta-rule recurrence (torch scan and the Triton kernel) against the f64
reference and each other, the replay rollback's bit-exactness (one pass of T rows == T passes of one row),
the chunked prefill, and FAIL-first plants (a replay by the chunked form, a replay of the wrong rows).

The Triton tests run on CUDA, or on CPU with TRITON_INTERPRET=1 (``TRITON_INTERPRET=1 pytest -q
tests/test_deltanet_fast.py``); otherwise they skip with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_qwen38 import IDS, make_qwen38

from bloomery_gates.kernels import triton as ktriton
from bloomery_gates.kernels.families.qwen38 import model as kq
from bloomery_gates.kernels.ops.gated_deltanet import delta_chunked, delta_recurrent, delta_scan
from bloomery_gates.reference.ops.gated_deltanet import delta_rule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_only = pytest.mark.skipif(not ktriton.available(DEVICE), reason=(
    f"the Triton delta rule needs CUDA and triton (or TRITON_INTERPRET=1): {ktriton.why_unavailable(DEVICE)}"))


def _inputs(n=2, t=7, nv=4, dk=16, dv=64, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, t, nv, dk, generator=gen) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n, t, nv, dk, generator=gen), dim=-1)
    v = torch.randn(n, t, nv, dv, generator=gen)
    g, b = -2 * torch.rand(n, t, nv, generator=gen), torch.rand(n, t, nv, generator=gen)
    s0 = torch.randn(n, nv, dk, dv, generator=gen)
    return [x.to(device) for x in (q, k, v, g, b, s0)]


def _reference(q, k, v, g, b, s0):
    """f64 reference per sequence: (o [N, T, nv, dv], last state [N, nv, dk, dv])."""
    outs = [delta_rule(*(x[i].double().cpu().numpy() for x in (q, k, v, g, b)), s0[i].double().cpu().numpy())
            for i in range(q.shape[0])]
    return np.stack([o for o, _ in outs]), np.stack([s for _, s in outs])


def _rel(a, ref) -> float:
    a = a.double().cpu().numpy() if isinstance(a, torch.Tensor) else a
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def _one_row_at_a_time(fn, q, k, v, g, b, s0):
    s, outs = s0.clone(), []
    for t in range(q.shape[1]):
        o, s = fn(*(x[:, t:t + 1] for x in (q, k, v, g, b)), s)
        outs.append(o)
    return torch.cat(outs, 1), s


@pytest.mark.parametrize("dk,dv", [(16, 64), (8, 8)])      # 8 x 8: the rollback tests' tiny heads
@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_recurrence_matches_f64_reference_and_replays_bit_exactly(impl, dk, dv):
    fn = ktriton.delta_impl(impl)
    x = _inputs(dk=dk, dv=dv, device=DEVICE if impl == "triton" else "cpu")
    o, s = fn(*x)
    ref_o, ref_s = _reference(*x)
    assert _rel(o, ref_o) < 1e-5 and _rel(s, ref_s) < 1e-5
    o1, s1 = _one_row_at_a_time(fn, *x)                       # the plain run's one-row passes and commits
    assert torch.equal(o1, o) and torch.equal(s1, s)          # bit-equal: what the replay rollback relies on
    prefix, sp = fn(*(t[:, :3] for t in x[:5]), x[5])         # a replay of the kept prefix of 3 rows
    assert torch.equal(prefix, o[:, :3])
    assert torch.equal(fn(*(t[:, 3:] for t in x[:5]), sp)[1], s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the replicated layout's effect shows in compiled code")
def test_fail_first_replicated_state_block_breaks_the_replay(monkeypatch):
    """Plant: an 8 x 8 state block launched with 4 warps (128 threads for 64 elements, each held twice), as before
    ``recurrent_warps``: on the H200 T rows in one launch then differ from one row a launch."""
    from bloomery_gates.kernels.triton import deltanet

    monkeypatch.setattr(deltanet, "recurrent_warps", lambda dk, bv: 4)
    x = _inputs(dk=8, dv=8, device="cuda")
    o, s = deltanet.delta_recurrent(*x)
    o1, s1 = _one_row_at_a_time(deltanet.delta_recurrent, *x)
    assert not (torch.equal(o1, o) and torch.equal(s1, s))


@pytest.mark.parametrize("dk,dv", [(16, 64), (8, 8)])
@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_commit_of_every_layer_in_one_launch_equals_each_layers_replay(impl, dk, dv):
    """The engine's commit: the rows of N sequences (layers) read in place from [N, W, ...] buffers, the walk
    bounded by kept on the device, the state only -> bit-equal to N calls replaying rows[:kept] one sequence each
    (every kept, 0 included). A kernel that ignored the bound or misread the buffers' width fails it."""
    fn = ktriton.delta_impl(impl)
    dev = DEVICE if impl == "triton" else "cpu"
    w, r = 9, 6                                                       # buffer width 9, a window of 6 rows
    x = _inputs(n=3, t=w, nv=4, dk=dk, dv=dv, seed=3, device=dev)
    for kept in range(r + 1):
        ref = x[5].clone()
        for i in range(3):
            ref[i:i + 1] = fn(*(t[i:i + 1, :kept] for t in x[:5]), x[5][i:i + 1])[1] if kept else x[5][i:i + 1]
        st = x[5].clone()
        o, s = fn(*(t[:, :r] for t in x[:5]), st, st, rows=torch.tensor([kept], device=dev), outputs=False)
        assert o is None and s is st
        assert torch.equal(st, ref), kept


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_verify_without_the_state_and_a_chained_step_with_it_give_the_same_bits(impl):
    """store=False (a verify: the commit replays the state) gives the outputs of the full call; a one-row pass that
    writes its state in place (a chained plain step) gives the commit's replay of that row."""
    fn = ktriton.delta_impl(impl)
    dev = DEVICE if impl == "triton" else "cpu"
    x = _inputs(n=2, t=5, seed=4, device=dev)
    o, s = fn(*x)
    o2, s2 = fn(*x, store=False)
    assert s2 is None and torch.equal(o2, o)
    st = x[5].clone()
    one, _ = fn(*(t[:, :1] for t in x[:5]), st, st)                 # the chain: outputs and state in one launch
    assert torch.equal(one, o[:, :1])
    assert torch.equal(st, fn(*(t[:, :1] for t in x[:5]), x[5])[1])


@triton_only
def test_triton_recurrence_takes_strided_views_of_one_sequence():
    """A sequence whose rows are not contiguous (a transposed view, as a caller's reshape may give) reads as its
    contiguous copy: the kernel reads in place only rows laid out as it indexes them."""
    from bloomery_gates.kernels.triton.deltanet import delta_recurrent as tri

    x = _inputs(n=1, t=5, nv=4, dk=16, dv=64, seed=5, device=DEVICE)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in x[:5]]        # same values, rows strided
    assert not views[0].is_contiguous()
    o, s = tri(*x)
    o2, s2 = tri(*views, x[5])
    assert torch.equal(o, o2) and torch.equal(s, s2)


def test_torch_recurrence_is_the_scan():
    """The scan of each sequence alone (a batched einsum may sum another way on some CPU BLAS: the H200 host's)."""
    x = _inputs()
    o, s = delta_recurrent(*x)
    each = [delta_scan(*(t[i:i + 1] for t in x)) for i in range(x[0].shape[0])]
    o2, s2 = torch.cat([e[0] for e in each]), torch.cat([e[1] for e in each])
    assert torch.equal(o, o2) and torch.equal(s, s2)
    out = torch.empty_like(x[5])
    assert delta_recurrent(*x, s_out=out)[1] is out and torch.equal(out, s2)


@triton_only
def test_triton_recurrence_matches_torch_scan_in_place():
    x = _inputs(n=3, t=16, nv=6, dk=32, dv=128, seed=1, device=DEVICE)
    from bloomery_gates.kernels.triton.deltanet import delta_recurrent as tri

    o_t, s_t = delta_recurrent(*(t.cpu() for t in x))
    state = x[5].clone()
    o, s = tri(*x[:5], state, state)                           # s_out = the input state (the commit's in-place)
    assert s is state
    torch.testing.assert_close(o.cpu(), o_t, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(s.cpu(), s_t, atol=2e-5, rtol=2e-5)


def test_fail_first_chunked_replay_is_not_bit_exact():
    """The chunked form agrees to rounding but not bit for bit: it could not serve as the verify/replay."""
    x = _inputs(t=16)
    o, s = delta_recurrent(*x)
    oc, sc = delta_chunked(*x, chunk=16)
    torch.testing.assert_close(oc, o, atol=1e-5, rtol=1e-5)
    assert not (torch.equal(oc, o) and torch.equal(sc, s))


def _drafted_vs_plain(impl: str, spec, rows=4, commit_fn=None):
    """Prefill, verify R rows, commit k (every k), continue one row a pass; vs the plain run. Returns, per k,
    whether the logits and the states are bit-equal."""
    prompt, window, after = IDS[:12], IDS[12:16], IDS[16:20]
    res = []
    for k in range(1, rows + 1):
        eng = kq.Qwen38Target(spec, DEVICE if impl == "triton" else "cpu", torch.float32, 64, rows, impl=impl)
        if commit_fn:
            eng.recur = commit_fn(eng.recur)
        eng.prefill(prompt)
        drafted = eng.verify(window, logits=True).logits[:k]
        eng.commit(k)
        cont = []
        for x in window[k:] + after:
            cont.append(eng.verify([x], logits=True).logits[0])
            eng.commit(1)
        plain = kq.Qwen38Target(spec, eng.device, torch.float32, 64, rows, impl=impl)
        plain.prefill(prompt)
        pl = []
        for x in window + after:
            pl.append(plain.verify([x], logits=True).logits[0])
            plain.commit(1)
        pl = torch.stack(pl)
        res.append(torch.equal(drafted, pl[:k]) and torch.equal(torch.stack(cont), pl[k:])
                   and torch.equal(eng.state, plain.state) and torch.equal(eng.conv_tail, plain.conv_tail))
    return res


def _spec():
    return make_qwen38(nk=2, nv=4, dk=8)                 # dk = dv = 8: powers of two, the Triton path applies


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=triton_only)])
def test_engine_rollback_by_replay_is_bit_exact(impl):
    assert all(_drafted_vs_plain(impl, _spec()))


def test_fail_first_replay_by_chunked_form_breaks_bit_exactness():
    """Plant: the commit's replay (a call with s_out) runs the chunked form; the verify keeps the scan."""

    def planted(recur):
        def fn(q, k, v, g, b, state, s_out=None):
            if s_out is None:
                return recur(q, k, v, g, b, state)
            o, s = delta_chunked(q, k, v, g, b, state, chunk=4)
            s_out.copy_(s)
            return o, s_out
        return fn

    assert not all(_drafted_vs_plain("torch", _spec(), commit_fn=planted))


def test_fail_first_replay_of_all_rows_differs(monkeypatch):
    """Plant: the commit replays every row of the pass (the state after the last row, whatever was kept): the
    one-row commits of the padded passes take in the padding rows, so no k stays equal."""
    monkeypatch.setattr(kq.Qwen38Target, "_rollback_row", lambda self, kept, first, n: n - 1)
    assert not any(_drafted_vs_plain("torch", _spec()))


@triton_only
def test_engine_triton_matches_torch():
    spec = _spec()
    a = kq.Qwen38Target(spec, "cpu", torch.float32, 64, 4, impl="torch")
    b = kq.Qwen38Target(spec, DEVICE, torch.float32, 64, 4, impl="triton")
    for e in (a, b):
        e.prefill(IDS[:20])
    la, lb = a.verify(IDS[20:24], logits=True).logits, b.verify(IDS[20:24], logits=True).logits
    torch.testing.assert_close(lb.cpu(), la, atol=1e-5, rtol=1e-5)
    a.commit(2)
    b.commit(2)
    torch.testing.assert_close(b.state.cpu(), a.state, atol=1e-5, rtol=1e-5)


def test_prefill_chunked_state_matches_scan():
    """The prefill's chunked delta rule leaves the state a one-row-at-a-time run leaves (to rounding)."""
    spec = _spec()
    a = kq.Qwen38Target(spec, "cpu", torch.float32, 128, 4, impl="torch")
    b = kq.Qwen38Target(spec, "cpu", torch.float32, 128, 4, impl="torch")
    a.prefill(IDS[:70])                                       # > one chunk of 64
    b.prefill(IDS[:1])
    for x in IDS[1:70]:
        b.verify([x])
        b.commit(1)
    torch.testing.assert_close(a.state, b.state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.conv_tail, b.conv_tail, atol=1e-5, rtol=1e-5)


def test_auto_impl_is_torch_on_cpu_and_for_odd_head_dims():
    assert kq.Qwen38Target(_spec(), "cpu", torch.float32, 64, 4).impl == "torch"
    odd = make_qwen38(dk=6)
    assert kq.Qwen38Target(odd, "cpu", torch.float32, 64, 4).impl == "torch"


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_prep_and_out_norm_match_torch(dtype):
    """The fused conv + SiLU + l2 + gates kernel and the gated output norm against the torch composition."""
    from bloomery_gates.kernels.ops.gated_deltanet import gated_rms_norm, prepare_torch
    from bloomery_gates.kernels.triton import deltanet_prep as kp

    gen = torch.Generator().manual_seed(3)
    n, r, kt, nk, nv, dk, dv = 1, 5, 4, 2, 4, 16, 32
    c = 2 * nk * dk + nv * dv
    buf, w = torch.randn(n, kt - 1 + r, c, generator=gen), torch.randn(c, kt, generator=gen) * 0.5
    alpha, beta = torch.randn(n, r, nv, generator=gen) * 3, torch.randn(n, r, nv, generator=gen)
    a_log, dt_bias = torch.log(torch.rand(nv, generator=gen) * 4 + 0.1), torch.randn(nv, generator=gen)
    args = [x.to(DEVICE, dtype) for x in (buf, w, alpha, beta, a_log, dt_bias)]
    want = prepare_torch(*[x.cpu() for x in args], nk, dk, dv)
    got = kp.prepare(*args, nk, dk, dv)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x.cpu(), y.float(), atol=tol, rtol=tol)
    o, z, wn = torch.randn(n, r, nv, dv, generator=gen), torch.randn(n, r, nv, dv, generator=gen), torch.rand(dv) + 0.5
    on = kp.gated_rms_norm(o.to(DEVICE), wn.to(DEVICE, dtype), z.to(DEVICE, dtype), 1e-6, dtype)
    ref = gated_rms_norm(o, wn.to(dtype), z.to(dtype), 1e-6, dtype)
    assert on.dtype == dtype
    torch.testing.assert_close(on.cpu().float(), ref.float(), atol=tol, rtol=tol)
    one = kp.prepare(*[x[:, :kt] if i == 0 else x for i, x in enumerate(args[:2])], args[2][:, :1], args[3][:, :1],
                     *args[4:], nk, dk, dv)
    assert all(torch.equal(a[:, 0], b[:, 0]) for a, b in zip(one, got, strict=True))   # row-local: same bits
