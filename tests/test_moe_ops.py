"""The shared MoE blocks: reference vs HF transformers (true f64), device vs reference (tier 2 through the gates'
``close``), the chosen experts vs the host transcription (tier 1, ties included), and FAIL-first plants: router
bias applied to the weights, group limit ignored, shared-expert gate dropped, tie rule reversed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from bloomery_cli.contract import Report
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.gates import moe_checks
from bloomery_gates.gates.close import close, exact_and_emulated
from bloomery_gates.kernels.ops import moe as kmoe
from bloomery_gates.reference.ops import moe as rmoe

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, I, E, K, N = 32, 16, 8, 2, 40


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    return {"x": r(N, H, sc=1.0), "router": r(E, H, sc=0.5), "bias": r(E, sc=0.5), "gate_up": r(E, 2 * I, H),
            "down": r(E, H, I), "sg": r(I, H), "su": r(I, H), "sd": r(H, I), "sgate": r(1, H)}


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


# ---------------------------------------------------------------------------------------------- routers

def test_topk_stable_breaks_ties_by_lower_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert kmoe.topk_stable(x, 2).tolist() == [[1, 2], [0, 1]]
    assert rmoe.topk_stable(x.numpy(), 2).tolist() == [[1, 2], [0, 1]]


def test_softmax_weights_are_renormalised_softmax():
    w = weights()
    logits = rmoe.router_logits(f64(w["x"]), f64(w["router"]))
    r = rmoe.softmax_topk(logits, K)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.sort(p, axis=-1)[:, ::-1][:, :K]
    assert np.allclose(r.weights, top / top.sum(-1, keepdims=True), rtol=1e-13, atol=0)


def test_group_limit_restricts_the_choice():
    c = np.array([[0.9, 0.1, 0.8, 0.7, 0.75, 0.7]])         # groups [0.9 0.1 0.8] [0.7 0.75 0.7]: sums 1.7 vs 1.45
    assert rmoe.group_limited_choice(c, 2, 2, 1).tolist() == [[0, 2]]
    c = np.array([[0.9, 0.1, 0.1, 0.8, 0.75, 0.7]])         # group 1 wins (1.55 vs 1.0) though 0.9 is the best
    assert rmoe.group_limited_choice(c, 2, 2, 1).tolist() == [[3, 4]]
    assert kmoe.group_limited_choice(torch.tensor(c, dtype=torch.float32), 2, 2, 1).tolist() == [[3, 4]]


@needs_hf
def test_softmax_block_equals_hf_qwen3_5_moe_f64():
    import transformers
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

    w = weights()
    cfg = transformers.Qwen3_5MoeTextConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K,
                                            moe_intermediate_size=I, shared_expert_intermediate_size=I)
    cfg._experts_implementation = "eager"
    with Float32AsFloat64():
        block = m.Qwen3_5MoeSparseMoeBlock(cfg).double()
    block.load_state_dict({"gate.weight": w["router"], "experts.gate_up_proj": w["gate_up"],
                           "experts.down_proj": w["down"], "shared_expert.gate_proj.weight": w["sg"],
                           "shared_expert.up_proj.weight": w["su"], "shared_expert.down_proj.weight": w["sd"],
                           "shared_expert_gate.weight": w["sgate"]})
    with torch.no_grad(), Float32AsFloat64():
        hf = block(w["x"].double()[None])[0].numpy()
        _, _, hf_ids = block.gate(w["x"].double())
    x = f64(w["x"])
    routing = rmoe.softmax_topk(rmoe.router_logits(x, f64(w["router"])), K)
    ref = rmoe.moe_block(x, routing, f64(w["gate_up"]), f64(w["down"]),
                         (f64(w["sg"]), f64(w["su"]), f64(w["sd"]), f64(w["sgate"])))
    assert (np.sort(routing.ids, -1) == np.sort(hf_ids.numpy(), -1)).all()
    assert np.abs(ref - hf).max() / np.abs(hf).max() < 1e-12


@needs_hf
def test_sigmoid_router_equals_hf_mimo_v2():
    import transformers
    from transformers.models.mimo_v2_flash import modeling_mimo_v2_flash as m

    w = weights(1)
    cfg = transformers.MiMoV2FlashConfig(hidden_size=H, n_routed_experts=E, num_experts_per_tok=K, n_group=2,
                                         topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5)
    router = m.MiMoV2FlashTopkRouter(cfg)
    router.weight.data, router.e_score_correction_bias.data = w["router"].clone(), w["bias"].clone()
    with torch.no_grad():
        _, hf_w, hf_ids = router(w["x"])                         # HF's router is float32 by construction
    ref = rmoe.sigmoid_group_topk(rmoe.router_logits(f64(w["x"]), f64(w["router"])), f64(w["bias"]), K, 2, 1,
                                  True, 2.5)
    order = np.argsort(hf_ids.numpy(), -1)
    ids, ws = np.take_along_axis(hf_ids.numpy(), order, -1), np.take_along_axis(hf_w.numpy(), order, -1)
    mine = np.argsort(ref.ids, -1)
    assert (np.take_along_axis(ref.ids, mine, -1) == ids).all()
    assert np.abs(np.take_along_axis(ref.weights, mine, -1) - ws).max() < 1e-6      # HF's float32 router


# ---------------------------------------------------------------------------------------------- device vs host

def kernel_routing(w, sigmoid: bool) -> kmoe.Routing:
    logits = kmoe.router_logits(w["x"], w["router"])
    return kmoe.sigmoid_group_topk(logits, w["bias"], K, 2, 1, True, 2.5) if sigmoid else kmoe.softmax_topk(logits, K)


def ref_routing(x: np.ndarray, w, sigmoid: bool) -> rmoe.Routing:
    logits = rmoe.router_logits(x, f64(w["router"]))
    return rmoe.sigmoid_group_topk(logits, f64(w["bias"]), K, 2, 1, True, 2.5) if sigmoid \
        else rmoe.softmax_topk(logits, K)


def block_gate(w, sigmoid: bool, shared: bool) -> Report:
    """A gate over one MoE block, f32: tier 1 on the chosen experts, tier 2 on the block output."""
    report = Report("moe-block", emit=lambda _l: None)
    routing = kernel_routing(w, sigmoid)
    sh = (w["sg"], w["su"], w["sd"], w["sgate"]) if shared else None
    got = kmoe.moe_block(w["x"], routing, w["gate_up"], w["down"], sh).numpy()
    rule = moe_checks.group_rule(K, 2, 1) if sigmoid else moe_checks.softmax_rule(K)
    moe_checks.chosen_experts(report, "block", routing, rule)

    def reference():
        x = f64(w["x"])
        shr = (f64(w["sg"]), f64(w["su"]), f64(w["sd"]), f64(w["sgate"])) if shared else None
        return rmoe.moe_block(x, ref_routing(x, w, sigmoid), f64(w["gate_up"]), f64(w["down"]), shr)

    exact, emulated = exact_and_emulated("f32", reference)
    ops = moe_checks.moe_ops(H, I, K, I if shared else None, True)
    close(report, "moe block out", got, exact, emulated, "f32", ops)
    return report


@pytest.mark.parametrize("sigmoid,shared", [(False, True), (True, False), (False, False)])
def test_block_gate_passes(sigmoid, shared):
    report = block_gate(weights(2), sigmoid, shared)
    assert report.finish() == 0, report.lines
    assert sum(report.facts["expert_load"]["block"]) == N * K


def test_a_row_depends_only_on_itself_at_a_given_row_count():
    w = weights(3)
    routing = kernel_routing(w, False)
    whole = kmoe.routed_experts(w["x"], routing, w["gate_up"], w["down"])
    other = dict(w, x=torch.cat([w["x"][:5], torch.randn(N - 5, H) * 2.0]))      # rows 5.. changed: other experts
    other_routing = kernel_routing(other, False)
    assert not torch.equal(other_routing.ids[5:], routing.ids[5:])
    again = kmoe.routed_experts(other["x"], other_routing, w["gate_up"], w["down"])
    assert torch.equal(whole[:5], again[:5])
    chunked = kmoe.routed_experts(w["x"], routing, w["gate_up"], w["down"], budget=1)
    assert torch.allclose(whole, chunked, rtol=1e-5, atol=1e-6)


def test_tier1_on_tied_scores():
    w = weights(4)
    w["router"][3] = w["router"][1]                            # experts 1 and 3 score equal on every row
    w["bias"][3] = w["bias"][1]
    for sigmoid in (False, True):
        routing = kernel_routing(w, sigmoid)
        ids = routing.ids.numpy()
        assert not ((ids == 3).any(-1) & ~(ids == 1).any(-1)).any()     # 3 never chosen without 1
        report = Report("t", emit=lambda _l: None)
        rule = moe_checks.group_rule(K, 2, 1) if sigmoid else moe_checks.softmax_rule(K)
        assert moe_checks.chosen_experts(report, "tied", routing, rule)


# ---------------------------------------------------------------------------------------------- FAIL-first

def failed(report: Report, head: str) -> bool:
    return report.finish() == 1 and any(line.startswith(head) and line.endswith(" FAIL") for line in report.lines)


def test_fail_first_router_bias_on_the_weights(monkeypatch):
    def biased(logits, bias, k, n_group=1, topk_group=1, norm=True, scale=1.0):
        r = kmoe.Routing.__new__(kmoe.Routing)
        good = real(logits, bias, k, n_group, topk_group, norm, scale)
        s = torch.sigmoid(logits) + bias                          # the defect: weights from the biased scores
        wts = s.gather(-1, good.ids)
        r.ids, r.choice, r.weights = good.ids, good.choice, wts / wts.sum(-1, keepdim=True) * scale
        return r

    real = kmoe.sigmoid_group_topk
    monkeypatch.setattr(kmoe, "sigmoid_group_topk", biased)
    assert failed(block_gate(weights(2), True, False), "(r) moe block out")


def test_fail_first_group_limit_ignored(monkeypatch):
    monkeypatch.setattr(kmoe, "group_limited_choice", lambda c, k, g, tg: kmoe.topk_stable(c, k))
    report = block_gate(weights(2), True, False)
    assert failed(report, "(r) block chosen experts")


def test_fail_first_shared_expert_gate_dropped(monkeypatch):
    real = kmoe.shared_expert
    monkeypatch.setattr(kmoe, "shared_expert", lambda x, g, u, d, gate: real(x, g, u, d, None))
    assert failed(block_gate(weights(2), False, True), "(r) moe block out")


def test_fail_first_tie_rule_reversed(monkeypatch):
    monkeypatch.setattr(kmoe, "topk_stable", lambda x, k: torch.sort(x.flip(-1), dim=-1, descending=True,
                                                                      stable=True)[1][..., :k].neg() + x.shape[-1] - 1)
    w = weights(4)
    w["router"][3] = w["router"][1]
    report = Report("t", emit=lambda _l: None)
    moe_checks.chosen_experts(report, "tied", kernel_routing(w, False), moe_checks.softmax_rule(K))
    assert failed(report, "(r) tied chosen experts")
