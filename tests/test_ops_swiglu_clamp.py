"""GLM-5.3's clamped SwiGLU (docs/FAMILIES_MOE.md section 4.3 "Experts"): the reference against HF transformers'
``Glm5NextTextMLP`` and ``Glm5NextTextExperts`` in true float64, the device op against the reference through the
gates' (r) lines (bf16 and f32, emulated bands; the chosen experts through the tier-1 line), the reference on the
strict fake device, and FAIL-first plants in bf16: the clamp dropped, the gate clamped from below too."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, fails_only, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.gates import moe_checks
from bloomery_gates.kernels.ops import moe as kmoe
from bloomery_gates.kernels.ops import swiglu_clamp as ksc
from bloomery_gates.reference.ops import moe as rmoe
from bloomery_gates.reference.ops import swiglu_clamp as rsc

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, I, E, K, N, LIMIT = 64, 32, 8, 2, 40, 2.5


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Projections of about 2.4 (x ~ 1, 64 inputs of 0.3): with L = 2.5 about a third of the gate and up values
    sit beyond the limit on one side or the other (test_the_limit_is_reached)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    return {"x": r(N, H, sc=1.0), "router": r(E, H, sc=0.5), "bias": r(E, sc=0.5), "gate_up": r(E, 2 * I, H),
            "down": r(E, H, I, sc=0.2), "wg": r(I, H), "wu": r(I, H), "wd": r(H, I, sc=0.2)}


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def test_the_limit_is_reached():
    w = weights()
    g, u = f64(w["x"]) @ f64(w["wg"]).T, f64(w["x"]) @ f64(w["wu"]).T
    assert (g > LIMIT).mean() > 0.1 and (g < -LIMIT).mean() > 0.1 and (np.abs(u) > LIMIT).mean() > 0.2
    act = rsc.clamp_act(g, u, LIMIT)
    sil = np.minimum(g, LIMIT) / (1 + np.exp(-np.minimum(g, LIMIT)))
    assert np.allclose(act, sil * np.clip(u, -LIMIT, LIMIT), rtol=1e-12, atol=0)   # tanh vs exp form


# ---------------------------------------------------------------------------------------------- the math (HF f64)

@needs_hf
def test_reference_equals_hf_clamped_mlp_and_experts_f64():
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as m

    w = weights()
    cfg = transformers.Glm5NextTextConfig(hidden_size=H, intermediate_size=I, moe_intermediate_size=I,
                                          n_routed_experts=E, num_experts_per_tok=K, swiglu_limit=LIMIT)
    cfg._experts_implementation = "eager"
    with Float32AsFloat64():
        mlp = m.Glm5NextTextMLP(cfg).double()
        experts = m.Glm5NextTextExperts(cfg).double()
    mlp.load_state_dict({"gate_proj.weight": w["wg"], "up_proj.weight": w["wu"], "down_proj.weight": w["wd"]})
    experts.load_state_dict({"gate_up_proj": w["gate_up"], "down_proj": w["down"]})
    x = f64(w["x"])
    routing = rmoe.sigmoid_group_topk(rmoe.router_logits(x, f64(w["router"])), f64(w["bias"]), K, 2, 1, True, 2.5)
    with torch.no_grad(), Float32AsFloat64():
        hf_mlp = mlp(torch.tensor(x)).numpy()
        hf_exp = experts(torch.tensor(x), torch.tensor(routing.ids), torch.tensor(routing.weights)).numpy()
    mine = rsc.swiglu_clamped(x, f64(w["wg"]), f64(w["wu"]), f64(w["wd"]), LIMIT)
    assert np.abs(mine - hf_mlp).max() / np.abs(hf_mlp).max() < 1e-12
    routed = rsc.routed_experts_clamped(x, routing, f64(w["gate_up"]), f64(w["down"]), LIMIT)
    assert np.abs(routed - hf_exp).max() / np.abs(hf_exp).max() < 1e-12


# ---------------------------------------------------------------------------------------------- device vs host

def clamp_gate(dtype: str, seed: int = 0):
    """A clamped dense MLP and a clamped routed block (sigmoid router, 2 groups): the tier-1 chosen-experts line
    and two (r) lines."""
    w = weights(seed)
    kw = {k: stored(v, dtype)[0] for k, v in w.items() if k not in ("router", "bias")}
    f = {k: stored(v, dtype)[1] for k, v in w.items() if k not in ("router", "bias")}
    rep = report("swiglu-clamp")
    dense = ksc.swiglu_clamped(kw["x"], kw["wg"], kw["wu"], kw["wd"], LIMIT)
    routing = kmoe.sigmoid_group_topk(kmoe.router_logits(kw["x"], w["router"]), w["bias"], K, 2, 1, True, 2.5)
    moe_checks.chosen_experts(rep, "block", routing, moe_checks.group_rule(K, 2, 1))
    routed = ksc.routed_experts_clamped(kw["x"], routing, kw["gate_up"], kw["down"], LIMIT)
    ids, wts = routing.ids.numpy(), routing.weights.double().numpy()      # the kernel's routing, as moe_checks

    def reference():
        r = rmoe.Routing(ids, wts, np.zeros(0))
        return (rsc.swiglu_clamped(f["x"], f["wg"], f["wu"], f["wd"], LIMIT),
                rsc.routed_experts_clamped(f["x"], r, f["gate_up"], f["down"], LIMIT))

    ops = [Op("gate/up", H), Op("clamp, silu * up", 1), Op("down", I)]
    check(rep, "clamped swiglu [N, H]", dense, reference, dtype, ops, lambda r: r[0])
    check(rep, "clamped routed experts [N, H]", routed, reference, dtype, ops + [Op("weighted sum", K)],
          lambda r: r[1])
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_clamp_gate_passes(dtype):
    rep = clamp_gate(dtype)
    assert rep.finish() == 0, rep.lines


def test_reference_runs_on_the_strict_device_bit_for_bit():
    w = weights(1)
    routing = rmoe.sigmoid_group_topk(rmoe.router_logits(f64(w["x"]), f64(w["router"])), f64(w["bias"]), K, 2, 1)

    def compute(x, wg, wu, wd, gate_up, down, ids, wts):
        return (rsc.swiglu_clamped(x, wg, wu, wd, LIMIT),
                rsc.routed_experts_clamped(x, rmoe.Routing(ids, wts, wts), gate_up, down, LIMIT))

    args = tuple(f64(w[k]) for k in ("x", "wg", "wu", "wd", "gate_up", "down")) + (routing.ids, routing.weights)
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert all(np.array_equal(a, b) for a, b in zip(dev, host, strict=True))


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_clamp_dropped(monkeypatch):
    monkeypatch.setattr(ksc, "clamp_act", lambda g, u, limit: torch.nn.functional.silu(g) * u)
    rep = clamp_gate("bf16")
    assert fails_only(rep, "(r) clamped "), rep.lines
    assert sum(line.endswith(" FAIL") for line in rep.lines) == 2


def test_fail_first_gate_clamped_from_below_too(monkeypatch):
    monkeypatch.setattr(ksc, "clamp_act", lambda g, u, limit: torch.nn.functional.silu(g.clamp(-limit, limit))
                        * u.clamp(-limit, limit))
    rep = clamp_gate("bf16")
    assert fails_only(rep, "(r) clamped "), rep.lines
