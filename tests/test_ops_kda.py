"""GLM-5.3's KDA linear attention (docs/FAMILIES_MOE.md section 4.3): the reference against HF transformers'
``Glm5NextTextLinearAttention`` (its chunked path) and ``recurrent_kimi_delta_attention`` in true float64; the
device's scan and chunked forms against the reference through the gates' (r) lines (bf16 and f32, emulated
bands) and against each other; the state rolled back exactly on a reject (per-row states and the conv tail); the
reference on the strict fake device; FAIL-first plants in bf16: the gate's lower bound ignored, a rollback that
keeps one row too many."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, fails_only, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import kda as kkda
from bloomery_gates.reference.ops import kda as rkda

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, NH, D, K, N, LB, EPS = 64, 2, 16, 4, 40, -5.0, 1e-6
C = NH * D
F32_KEYS = ("conv", "dt_bias", "a_log")                   # HF's conv1d and the converter's ssm_a / ssm_dt: F32


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Gate pre-activations of about 2 around dt_bias 1.5 (rate e^0.2): g spreads over (-5, 0), so ignoring the
    bound (softplus instead) moves every decay."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    return {"x": r(N, H, sc=1.0), "q": r(C, H, sc=0.2), "k": r(C, H, sc=0.2), "v": r(C, H, sc=0.2),
            "conv": r(3 * C, K, sc=0.5), "f_a": r(D, H, sc=0.2), "f_b": r(C, D, sc=0.4),
            "dt_bias": 1.5 + r(C, sc=0.5), "a_log": 0.2 + r(NH, sc=0.1), "b": r(NH, H, sc=0.2),
            "g_a": r(D, H, sc=0.2), "g_b": r(C, D, sc=0.4), "norm": 1.0 + r(D, sc=0.1), "o": r(H, C, sc=0.2)}


def as_dtype(w: dict[str, torch.Tensor], dtype: str):
    pairs = {k: stored(v, "f32" if k in F32_KEYS else dtype) for k, v in w.items()}
    kw = {k: p[0] for k, p in pairs.items()}
    f = {k: p[1] for k, p in pairs.items()}
    x_k, x_f = kw.pop("x"), f.pop("x")
    return x_k, kkda.KdaWeights(**kw), x_f, rkda.KdaWeights(**f)


def kda_ops(rows: int) -> list[Op]:
    return [Op("q/k/v", H), Op("conv", K), Op("silu", 1), Op("l2", D), Op("gate", D), Op("delta", D),
            Op("state read", D), Op("rows", rows)]


# ---------------------------------------------------------------------------------------------- the math (HF f64)

@needs_hf
def test_reference_equals_hf_kda_f64():
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as m

    w = weights()
    cfg = transformers.Glm5NextTextConfig(hidden_size=H, linear_num_heads=NH, linear_head_dim=D,
                                          linear_conv_kernel_dim=K, linear_lower_bound=LB, rms_norm_eps=EPS,
                                          num_attention_heads=NH, num_key_value_heads=NH, hidden_act="silu")
    with Float32AsFloat64():
        mod = m.Glm5NextTextLinearAttention(cfg, 0).double()
    mod.load_state_dict({"q_proj.weight": w["q"], "k_proj.weight": w["k"], "v_proj.weight": w["v"],
                         "conv1d.weight": w["conv"][:, None, :], "forget_gate.f_a_proj.weight": w["f_a"],
                         "forget_gate.f_b_proj.weight": w["f_b"], "forget_gate.dt_bias": w["dt_bias"],
                         "forget_gate.A_log": w["a_log"], "b_proj.weight": w["b"], "g_a_proj.weight": w["g_a"],
                         "g_b_proj.weight": w["g_b"], "o_norm.weight": w["norm"], "o_proj.weight": w["o"]})
    with torch.no_grad(), Float32AsFloat64():
        hf = mod(w["x"].double()[None])[0].numpy()
    xf = w["x"].double().numpy()
    rw = rkda.KdaWeights(**{k: v.double().numpy() for k, v in w.items() if k != "x"})
    got = rkda.kda_attention(xf, rw, NH, LB, EPS)
    assert np.abs(got.out - hf).max() / np.abs(hf).max() < 1e-12

    rng = np.random.default_rng(0)                      # the recurrent form alone, on prepared inputs
    q, k, v = (torch.tensor(rng.standard_normal((1, 9, NH, D))) for _ in range(3))
    g = torch.tensor(LB * rng.random((1, 9, NH, D)))
    b = torch.tensor(rng.random((1, 9, NH)))
    with torch.no_grad(), Float32AsFloat64():
        o, s = m.recurrent_kimi_delta_attention(q, k, v, g, b, None, True, use_qk_l2norm_in_kernel=False)
    mo, ms = rkda.kda_rule(q[0].numpy() * D ** -0.5, k[0].numpy(), v[0].numpy(), g[0].numpy(), b[0].numpy())
    assert np.abs(mo - o[0].numpy()).max() < 1e-12 and np.abs(ms - s[0].numpy()).max() < 1e-12


def test_the_lower_bound_bounds_the_decay():
    w = weights()
    f = (w["x"] @ w["f_a"].T @ w["f_b"].T).double().numpy()
    g = rkda.forget_gate(f, w["dt_bias"].double().numpy(), w["a_log"].double().numpy(), D, LB)
    free = rkda.forget_gate(f, w["dt_bias"].double().numpy(), w["a_log"].double().numpy(), D, None)
    assert g.shape == (N, NH, D) and (g > LB).all() and (g < 0).all() and g.min() < 0.8 * LB
    assert free.min() < LB                                  # unbounded below without it: the bound is doing work


# ---------------------------------------------------------------------------------------------- device vs host

def kda_gate(dtype: str, form: str = "scan", seed: int = 0):
    """One KDA layer on N rows: (r) lines on the recurrence's output, the state after N rows, the layer output."""
    x, kw, xf, rw = as_dtype(weights(seed), dtype)
    rep = report("kda")
    got = kkda.kda_attention(x, kw, NH, LB, EPS, form=form)

    def reference():
        return rkda.kda_attention(xf, rw, NH, LB, EPS)

    ops = kda_ops(N)
    check(rep, f"kda core ({form}) [N, n, d]", got.core, reference, dtype, ops, lambda r: r.core)
    check(rep, f"kda state after {N} rows ({form}) [n, d, d]", got.state, reference, dtype, ops, lambda r: r.state)
    check(rep, f"kda layer out ({form}) [N, H]", got.out, reference, dtype, ops + [Op("norm", D), Op("o", C)],
          lambda r: r.out)
    return rep


@pytest.mark.parametrize("dtype,form", [("bf16", "scan"), ("bf16", "chunked"), ("f32", "scan"), ("f32", "chunked")])
def test_kda_gate_passes(dtype, form):
    rep = kda_gate(dtype, form)
    assert rep.finish() == 0, rep.lines


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_chunked_and_scan_agree(chunk):
    """Both forms on the same prepared float32 inputs (several chunks, a padded last one, an entry state)."""
    g = torch.Generator().manual_seed(5)
    q, k = (kkda.l2norm(torch.randn(N, NH, D, generator=g)) for _ in range(2))
    v = torch.randn(N, NH, D, generator=g)
    gate = LB * torch.rand(N, NH, D, generator=g)
    b = torch.rand(N, NH, generator=g)
    s0 = torch.randn(NH, D, D, generator=g) * 0.3
    o1, s1 = kkda.kda_scan(q, k, v, gate, b, s0)
    o2, s2 = kkda.kda_chunked(q, k, v, gate, b, s0, chunk=chunk)
    assert (o1 - o2).abs().max() / o1.abs().max() < 1e-5 and (s1 - s2).abs().max() / s1.abs().max() < 1e-5


def test_rollback_is_exact():
    """A verify of R rows keeps every row's state; committing k rows takes states[k-1] and the conv tail
    buf[k : k+K-1]. On the verify's own prepared inputs: states[k-1] is bit for bit the state a scan of only those
    k rows ends in, the rows after k continue from it bit for bit as the straight scan does, and the conv restarted
    from the committed tail gives the straight conv's rows bit for bit. (At the layer level the projections of a
    k-row and an R-row call may round differently; the gates pad their passes to one row count for that.)"""
    from bloomery_gates.kernels.ops.causal_conv import causal_conv

    g = torch.Generator().manual_seed(7)
    r = 6
    q, k = (kkda.l2norm(torch.randn(r, NH, D, generator=g)) for _ in range(2))
    v = torch.randn(r, NH, D, generator=g)
    gate = LB * torch.rand(r, NH, D, generator=g)
    b = torch.rand(r, NH, generator=g)
    s0 = torch.randn(NH, D, D, generator=g) * 0.3
    o_all, states = kkda.kda_scan(q, k, v, gate, b, s0, keep=True)
    assert states.shape == (r, NH, D, D)
    buf = torch.randn(K - 1 + r, 3 * C, generator=g)
    w_conv = torch.randn(3 * C, K, generator=g)
    conv_all = causal_conv(buf, w_conv)
    for kept in range(1, r + 1):
        o_k, s_k = kkda.kda_scan(q[:kept], k[:kept], v[:kept], gate[:kept], b[:kept], s0)
        assert torch.equal(states[kept - 1], s_k) and torch.equal(o_all[:kept], o_k)
        if kept < r:
            o_rest, s_rest = kkda.kda_scan(q[kept:], k[kept:], v[kept:], gate[kept:], b[kept:], states[kept - 1])
            assert torch.equal(o_rest, o_all[kept:]) and torch.equal(s_rest, states[-1])
            assert torch.equal(causal_conv(buf[kept:], w_conv), conv_all[kept:])


def rollback_gate(dtype: str, commit=lambda states, k: states[k - 1]):
    """Prefix 30 rows, verify 6, commit 3 (the reject after the third): (r) the committed state against the
    reference's state after the prefix and those 3 rows only."""
    x, kw, xf, rw = as_dtype(weights(3), dtype)
    rep = report("kda-rollback")
    prep = kkda.kda_attention(x[:30], kw, NH, LB, EPS)
    verify = kkda.kda_attention(x[30:36], kw, NH, LB, EPS, prep.buf[-(K - 1):], prep.state, keep=True)
    check(rep, "kda state after commit 3 of 6 [n, d, d]", commit(verify.state, 3),
          lambda: rkda.kda_attention(xf[:33], rw, NH, LB, EPS), dtype, kda_ops(33), lambda r: r.state)
    return rep


def test_rollback_gate_passes():
    assert rollback_gate("bf16").finish() == 0


def test_reference_runs_on_the_strict_device_bit_for_bit():
    w = {k: v.double().numpy() for k, v in weights(1).items()}
    names = [k for k in w if k != "x"]

    def compute(x, *ws):
        return rkda.kda_attention(x, rkda.KdaWeights(**dict(zip(names, ws, strict=True))), NH, LB, EPS)

    args = (w["x"], *(w[k] for k in names))
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert all(np.array_equal(getattr(dev, f), getattr(host, f)) for f in ("out", "core", "state", "tail"))


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

@pytest.mark.parametrize("form", ["scan", "chunked"])
def test_fail_first_lower_bound_ignored(monkeypatch, form):
    real = kkda.forget_gate
    monkeypatch.setattr(kkda, "forget_gate", lambda f, dt, a, d, lb: real(f, dt, a, d, None))
    rep = kda_gate("bf16", form)
    assert fails_only(rep, "(r) kda "), rep.lines
    assert sum(line.endswith(" FAIL") for line in rep.lines) == 3


def test_fail_first_rollback_keeps_one_row_too_many():
    rep = rollback_gate("bf16", commit=lambda states, k: states[k])
    assert fails_only(rep, "(r) kda state after commit"), rep.lines
