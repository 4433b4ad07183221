"""GLM-5.3's mHC (docs/FAMILIES_MOE.md section 4.3): the reference against HF transformers'
``Glm5NextTextHyperConnection`` / ``Glm5NextTextHyperHead`` and its decoder layer's expand in true float64, the
device op against the reference through the gates' (r) lines (bf16 and f32, emulated bands), the reference on the
strict fake device, and the FAIL-first plants in bf16: Sinkhorn iterations off by one (either way), the head's mean
replaced by the first stream."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ops_check import check, fails_only, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import mhc as kmhc
from bloomery_gates.kernels.ops.norm import rms_norm as k_rms_norm
from bloomery_gates.reference.ops import mhc as rmhc
from bloomery_gates.reference.ops.norm import rms_norm
from bloomery_gates.reference.rounding import linear

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, S, N, ITERS, EPS, NORM_EPS = 64, 4, 40, 20, 1e-6, 1e-6
P = (2 + S) * S


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Streams that share most of their content; fn sized so the comb logits spread by about 3 (a comb that 20
    Sinkhorn rounds leave short of convergence in float32: see test_off_by_one_is_seen_only_where_unconverged)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    base = r(N, 1, H, sc=1.0)
    return {"x": base + r(N, S, H, sc=0.5), "fn": r(P, S * H, sc=0.2), "base": r(P, sc=0.5),
            "scale": 1.0 + r(3, sc=0.1), "block": r(H, H, sc=0.2), "norm": 1.0 + r(H, sc=0.1)}


def as_dtype(w: dict[str, torch.Tensor], dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """x and the block / norm weights in the run dtype; fn, base, scale stay float32 (the converter's F32)."""
    out = {k: stored(v, dtype if k in ("x", "block", "norm") else "f32") for k, v in w.items()}
    return {k: p[0] for k, p in out.items()}, {k: p[1] for k, p in out.items()}


def weight_ops(iters: int = ITERS) -> list[Op]:
    return [Op("rms over S*H", S * H), Op("fn", S * H), Op("softmax", S)] + [Op("sinkhorn pass", S)] * (2 * iters)


# ---------------------------------------------------------------------------------------------- the math (HF f64)

@needs_hf
def test_reference_equals_hf_mhc_f64():
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as m

    w = weights()
    cfg = transformers.Glm5NextTextConfig(hidden_size=H, hc_mult=S, hc_sinkhorn_iters=ITERS, hc_eps=EPS,
                                          rms_norm_eps=NORM_EPS)
    with Float32AsFloat64():
        mod = m.Glm5NextTextHyperConnection(cfg).double()
    mod.load_state_dict({"fn": w["fn"], "base": w["base"], "scale": w["scale"]})
    x = w["x"].double()[None]                                                # [1, N, S, H]
    with torch.no_grad(), Float32AsFloat64():
        post, comb, collapsed = mod(x)
        y = collapsed @ w["block"].double().T
        expanded = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
        head = m.Glm5NextTextHyperHead()(x)
    f = {k: v.double().numpy() for k, v in w.items()}
    mw = rmhc.mhc_weights(f["x"], f["fn"], f["base"], f["scale"], ITERS, EPS, NORM_EPS)
    mine = rmhc.mhc_collapse(f["x"], mw.pre)

    def rel(a, b):
        b = b[0].numpy()
        return np.abs(a - b).max() / np.abs(b).max()

    assert rel(mw.post, post) < 1e-12 and rel(mw.comb, comb) < 1e-12 and rel(mine, collapsed) < 1e-12
    assert rel(rmhc.mhc_expand(linear(mine, f["block"]), f["x"], mw.post, mw.comb), expanded) < 1e-12
    assert rel(rmhc.mhc_head(f["x"]), head) < 1e-12


def test_sinkhorn_is_doubly_stochastic_and_counts_its_rounds():
    logits = np.random.default_rng(0).standard_normal((6, S, S)) * 3.0
    c = rmhc.sinkhorn(logits, 200, EPS)
    assert np.allclose(c.sum(-2), 1.0, atol=1e-5) and np.allclose(c.sum(-1), 1.0, atol=1e-5)
    one = rmhc.sinkhorn(logits, 1, EPS)                                     # one round: softmax, then columns only
    e = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True) + EPS
    assert np.allclose(one, e / (e.sum(-2, keepdims=True) + EPS), rtol=1e-14, atol=0)
    k = kmhc.sinkhorn(torch.tensor(logits), ITERS, EPS).double().numpy()
    assert np.abs(k - rmhc.sinkhorn(logits, ITERS, EPS)).max() < 1e-5


def test_off_by_one_is_seen_only_where_unconverged():
    """What the FAIL-first plant can and cannot see: 19 against 20 rounds moves a comb whose logits spread by 3 by
    about 1e-3 (relative), far above the float32 comb line's band; one whose logits spread by 0.5 has converged
    below float32 rounding (2^-24) by then, so there an off-by-one changes nothing a float32 engine computes."""
    rng = np.random.default_rng(1)
    for spread, lo, hi in ((3.0, 1e-4, 1.0), (0.5, 0.0, 1e-8)):
        lg = rng.standard_normal((N, S, S)) * spread
        a, b = rmhc.sinkhorn(lg, ITERS, EPS), rmhc.sinkhorn(lg, ITERS - 1, EPS)
        assert lo <= np.abs(a - b).max() / np.abs(a).max() < hi


# ---------------------------------------------------------------------------------------------- device vs host

def mhc_gate(dtype: str, seed: int = 0):
    """One mHC sublayer around a stand-in block (a projection), then the head's mean and final norm: (r) lines on
    the float32 weights (comb; pre and post), the collapse, the expand and the head."""
    kw, f = as_dtype(weights(seed), dtype)
    rep = report("mhc")
    mw = kmhc.mhc_weights(kw["x"], kw["fn"], kw["base"], kw["scale"], ITERS, EPS, NORM_EPS)
    block_in = kmhc.mhc_collapse(kw["x"], mw.pre)
    new = kmhc.mhc_expand(F.linear(block_in, kw["block"]), kw["x"], mw.post, mw.comb)
    head = k_rms_norm(kmhc.mhc_head(new), kw["norm"], NORM_EPS)

    def reference():
        r = rmhc.mhc_weights(f["x"], f["fn"], f["base"], f["scale"], ITERS, EPS, NORM_EPS)
        b = rmhc.mhc_collapse(f["x"], r.pre)
        streams = rmhc.mhc_expand(linear(b, f["block"]), f["x"], r.post, r.comb)
        return r, b, streams, rms_norm(rmhc.mhc_head(streams), f["norm"], NORM_EPS)

    wops = weight_ops()
    out_ops = wops + [Op("collapse", S), Op("block", H), Op("expand", S + 1)]
    check(rep, "mhc comb [N, S, S]", mw.comb, reference, dtype, wops, lambda r: r[0].comb)
    check(rep, "mhc pre, post [N, 2S]", torch.cat([mw.pre, mw.post], -1), reference, dtype, wops[:2],
          lambda r: np.concatenate([r[0].pre, r[0].post], -1))
    check(rep, "mhc block input [N, H]", block_in, reference, dtype, wops[:2] + [Op("collapse", S)], lambda r: r[1])
    check(rep, "mhc streams after expand [N, S, H]", new, reference, dtype, out_ops, lambda r: r[2])
    check(rep, "mhc head norm(mean) [N, H]", head, reference, dtype, out_ops + [Op("mean", S), Op("norm", H)],
          lambda r: r[3])
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_mhc_gate_passes(dtype):
    rep = mhc_gate(dtype)
    assert rep.finish() == 0, rep.lines
    assert len([line for line in rep.lines if line.startswith("(r) mhc ")]) == 5


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(1).items()}

    def compute(x, fn, base, scale, block):
        r = rmhc.mhc_weights(x, fn, base, scale, ITERS, EPS, NORM_EPS)
        b = rmhc.mhc_collapse(x, r.pre)
        return r, b, rmhc.mhc_head(rmhc.mhc_expand(linear(b, block), x, r.post, r.comb))

    args = (f["x"], f["fn"], f["base"], f["scale"], f["block"])
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert np.array_equal(dev[0].comb, host[0].comb) and np.array_equal(dev[0].pre, host[0].pre)
    assert np.array_equal(dev[1], host[1]) and np.array_equal(dev[2], host[2])


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

@pytest.mark.parametrize("off", [-1, 1])
def test_fail_first_sinkhorn_iterations_off_by_one(monkeypatch, off):
    real = kmhc.sinkhorn
    monkeypatch.setattr(kmhc, "sinkhorn", lambda logits, iters, eps: real(logits, iters + off, eps))
    rep = mhc_gate("bf16")
    assert fails_only(rep, "(r) mhc comb"), rep.lines


def test_fail_first_head_takes_one_stream(monkeypatch):
    monkeypatch.setattr(kmhc, "mhc_head", lambda x: x[:, 0])
    assert fails_only(mhc_gate("bf16"), "(r) mhc head"), mhc_gate("bf16").lines
