"""qwen4exp's gated low-rank hyper-connections (docs/FAMILIES_MOE.md section 4.5): the reference against HF
transformers' ``Qwen4ExpTextGatedResidual`` in true float64, the device op against the reference through the gates'
(r) lines (bf16 and f32, emulated bands), the reference on the strict fake device, and the FAIL-first plant in
bf16: mix and inject swapped."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ops_check import check, fails_only, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import gated_hc as khc
from bloomery_gates.reference.ops import gated_hc as rhc
from bloomery_gates.reference.rounding import linear

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, S, R, N, EPS = 64, 4, 16, 40, 1e-6


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    base = r(N, H, sc=1.0)
    x = base.repeat(1, S) + r(N, S * H, sc=0.5)                 # streams that share most of their content
    return {"x": x, "norm": r(S * H, sc=0.2), "down": r(R, S * H, sc=0.15), "up": r(S * H, R, sc=0.5),
            "inject": r(S, S * H, sc=0.1), "block": r(H, H, sc=0.2), "mnorm": r(S * H, sc=0.2),
            "mdown": r(R, S * H, sc=0.15), "mup": r(S * H, R, sc=0.5)}


def as_dtype(w: dict[str, torch.Tensor], dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    pairs = {k: stored(v, dtype) for k, v in w.items()}
    return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}


def hc_ops() -> list[Op]:
    return [Op("grouped norm", H), Op("down", S * H), Op("silu", 1), Op("up", R), Op("sigmoid mix", 1),
            Op("mean over streams", S)]


# ---------------------------------------------------------------------------------------------- the math (HF f64)

@needs_hf
@pytest.mark.parametrize("combine", [True, False])
def test_reference_equals_hf_gated_residual_f64(combine):
    import transformers
    from transformers.models.qwen4_exp import modeling_qwen4_exp as m

    w = weights()
    cfg = transformers.Qwen4ExpTextConfig(hidden_size=H, hc_count=S, hc_lowrank=R, rms_norm_eps=EPS)
    with Float32AsFloat64():
        mod = m.Qwen4ExpTextGatedResidual(cfg, use_combine=combine).double()
    state = {"hc_norm.weight": w["norm"], "input_mix_weight_down.weight": w["down"],
             "input_mix_weight_up.weight": w["up"]}
    if combine:
        state["block_inject_weight.weight"] = w["inject"]
    mod.load_state_dict(state)
    x = w["x"].double()
    with torch.no_grad(), Float32AsFloat64():
        hf = mod(x)
    f = {k: v.double().numpy() for k, v in w.items()}
    got = rhc.gated_residual(f["x"], f["norm"], f["down"], f["up"], f["inject"] if combine else None, S, EPS)
    if not combine:
        assert got.inject is None
        assert np.abs(got.block_in - hf.numpy()).max() / np.abs(hf.numpy()).max() < 1e-12
        return
    mixed, _, inj = hf
    assert np.abs(got.block_in - mixed.numpy()).max() / np.abs(mixed.numpy()).max() < 1e-12
    assert np.abs(got.inject - inj.numpy()).max() < 1e-12
    y = mixed @ w["block"].double().T                           # HF's decoder layer: x + (y[..., None, :] * inj)
    want = (x + (y.unsqueeze(-2) * inj.unsqueeze(-1)).flatten(-2)).numpy()
    new = rhc.hc_inject(f["x"], linear(got.block_in, f["block"]), got.inject)
    assert np.abs(new - want).max() / np.abs(want).max() < 1e-12


def test_repeat_streams_and_the_group_statistics():
    e = np.arange(2 * H, dtype=np.float64).reshape(2, H) - 50.0
    x = rhc.repeat_streams(e, S)
    assert x.shape == (2, S * H) and all((x[:, s * H:(s + 1) * H] == e).all() for s in range(S))
    assert torch.equal(khc.repeat_streams(torch.tensor(e), S), torch.tensor(x))
    x[:, H:2 * H] *= 7.0                                          # one stream scaled: its own norm undoes it
    y = rhc.grouped_norm(x, np.zeros(S * H), H, 0.0)
    assert np.allclose(y[:, :H], y[:, H:2 * H], rtol=1e-14, atol=0)


# ---------------------------------------------------------------------------------------------- device vs host

def hc_gate(dtype: str, seed: int = 0, gains: bool = True):
    """One gated residual, a stand-in block (a projection), the inject and the final mixer: an (r) line each for
    the block input, the inject gains (``gains``), the new streams and the mixer's output."""
    kw, f = as_dtype(weights(seed), dtype)
    rep = report("gated-hc")
    hc = khc.gated_residual(kw["x"], kw["norm"], kw["down"], kw["up"], kw["inject"], S, EPS)
    new = khc.hc_inject(kw["x"], F.linear(hc.block_in, kw["block"]), hc.inject)
    mixed = khc.gated_residual(new, kw["mnorm"], kw["mdown"], kw["mup"], None, S, EPS)

    def reference():
        r = rhc.gated_residual(f["x"], f["norm"], f["down"], f["up"], f["inject"], S, EPS)
        streams = rhc.hc_inject(f["x"], linear(r.block_in, f["block"]), r.inject)
        head = rhc.gated_residual(streams, f["mnorm"], f["mdown"], f["mup"], None, S, EPS)
        return r.block_in, r.inject, streams, head.block_in

    ops = hc_ops()
    out_ops = ops + [Op("block", H), Op("inject add", 1)]
    check(rep, "hc block input [N, H]", hc.block_in, reference, dtype, ops, lambda r: r[0])
    if gains:
        inj_ops = [Op("grouped norm", H), Op("inject", S * H), Op("2 sigmoid", 1)]
        check(rep, "hc inject gains [N, S]", hc.inject, reference, dtype, inj_ops, lambda r: r[1])
    check(rep, "hc streams after inject [N, S*H]", new, reference, dtype, out_ops, lambda r: r[2])
    check(rep, "hc mixer output [N, H]", mixed.block_in, reference, dtype, out_ops + ops, lambda r: r[3])
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_gated_hc_gate_passes(dtype):
    rep = hc_gate(dtype)
    assert rep.finish() == 0, rep.lines
    assert len([line for line in rep.lines if line.startswith("(r) hc ")]) == 4


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(1).items()}

    def compute(x, norm, down, up, inject, block):
        r = rhc.gated_residual(x, norm, down, up, inject, S, EPS)
        return r.block_in, r.inject, rhc.hc_inject(x, linear(r.block_in, block), r.inject), rhc.repeat_streams(
            r.block_in, S)

    args = (f["x"], f["norm"], f["down"], f["up"], f["inject"], f["block"])
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert all(np.array_equal(a, b) for a, b in zip(dev, host, strict=True))


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_mix_and_inject_swapped(monkeypatch):
    """The defect: the per-stream inject gain weights the block's input (mean_s inject_s xn_s) and the per-element
    mix scales the block's output (x + mix * y). The block input line is the first to catch it."""
    real = khc.gated_residual

    def swapped(x, norm_w, down, up, inject, streams, eps):
        if inject is None:
            return real(x, norm_w, down, up, inject, streams, eps)
        h = x.shape[-1] // streams
        xn = khc.grouped_norm(x, norm_w, h, eps)
        a = F.silu(F.linear(xn, down).float() / streams).to(x.dtype)
        mix = torch.sigmoid(F.linear(a, up).float()).to(x.dtype)
        inj = (2.0 * torch.sigmoid(F.linear(xn, inject).float() / streams)).to(x.dtype)
        block_in = (inj.float()[..., :, None] * xn.float().unflatten(-1, (streams, h))).mean(-2).to(x.dtype)
        return khc.HcIn(block_in, mix)

    def inject_mix(x, block_out, mix):
        return (x.float() + mix.float() * block_out.float().repeat(1, mix.shape[-1] // block_out.shape[-1])).to(
            x.dtype)

    monkeypatch.setattr(khc, "gated_residual", swapped)
    monkeypatch.setattr(khc, "hc_inject", inject_mix)
    rep = hc_gate("bf16", gains=False)                        # the swapped "gains" are [N, S*H]: no such line
    assert fails_only(rep, "(r) hc "), rep.lines
    assert all(line.endswith(" FAIL") for line in rep.lines if line.startswith("(r) hc "))
