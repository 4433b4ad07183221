"""DeepSeek V4's sqrt-softplus router with hash layers (issue 26; docs/FAMILIES_MOE.md section 4.4 "Router", "Hash
layers"): the reference against HF transformers' ``DeepseekV4TopKRouter`` and ``DeepseekV4HashRouter`` in true
float64, the device op against the reference (the chosen experts exactly: a learned layer's against the host
transcription on the device's own float32 choice scores, a hash layer's against the host table lookup; the weights
through (r) lines, bf16 and f32), the reference on the strict fake device, and FAIL-first plants in bf16: the hash
table shifted by one, the router's bias applied to the weights."""

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
from bloomery_gates.kernels.ops import router_v4 as krv
from bloomery_gates.reference.ops import router_v4 as rrv

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, E, K, N, V, SCALE = 64, 8, 2, 40, 50, 1.5


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """x, router Wr, bias (of the size of the score gaps, so it changes choices: test_the_bias_and_table_matter),
    tid2eid [V, K] with distinct experts per row, token ids [N]."""
    g = torch.Generator().manual_seed(seed)
    table = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(V)])
    return {"x": torch.randn(N, H, generator=g), "router": torch.randn(E, H, generator=g) * 0.15,
            "bias": torch.randn(E, generator=g) * 0.3, "tid2eid": table,
            "tokens": torch.randint(1, V, (N,), generator=g)}


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def test_the_bias_and_table_matter():
    """The plants must be able to show: the bias changes some rows' choice, the shifted table some rows' ids."""
    w = weights()
    logits = f64(w["x"]) @ f64(w["router"]).T
    biased = rrv.sqrtsoftplus_topk(logits, f64(w["bias"]), K).ids
    plain = rrv.sqrtsoftplus_topk(logits, np.zeros(E), K).ids
    assert (biased != plain).any(-1).mean() > 0.2
    tab, tok = w["tid2eid"].numpy(), w["tokens"].numpy()
    assert (rrv.hash_ids(tab, tok) != rrv.hash_ids(tab, tok - 1)).any(-1).mean() > 0.5
    with pytest.raises(ValueError, match="outside the hash table"):
        rrv.hash_ids(tab, np.array([V]))


def test_sqrt_softplus_is_stable():
    x = np.array([-800.0, -30.0, 0.0, 1e-3, 30.0, 800.0])
    want = np.sqrt(np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30)))))
    assert np.allclose(rrv.sqrt_softplus(x), want, rtol=1e-12, atol=0) and np.isfinite(rrv.sqrt_softplus(x)).all()


# ---------------------------------------------------------------------------------------------- the math (HF f64)

@needs_hf
def test_reference_equals_hf_routers_f64():
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    w = weights()
    cfg = transformers.DeepseekV4Config(hidden_size=H, n_routed_experts=E, num_experts_per_tok=K, vocab_size=V,
                                        routed_scaling_factor=SCALE)
    assert cfg.scoring_func == "sqrtsoftplus"
    with Float32AsFloat64():
        learned, hashed = m.DeepseekV4TopKRouter(cfg).double(), m.DeepseekV4HashRouter(cfg).double()
    learned.load_state_dict({"weight": w["router"], "e_score_correction_bias": w["bias"]})
    hashed.load_state_dict({"weight": w["router"], "tid2eid": w["tid2eid"].long()})
    x = torch.tensor(f64(w["x"]))
    with torch.no_grad(), Float32AsFloat64():
        hl, hw, hi = learned(x)
        _, hhw, hhi = hashed(x, w["tokens"])
    mine_l = rrv.sqrtsoftplus_topk(f64(w["x"]) @ f64(w["router"]).T, f64(w["bias"]), K, SCALE)
    mine_h = rrv.hash_route(f64(w["x"]) @ f64(w["router"]).T, w["tid2eid"].numpy(), w["tokens"].numpy(), SCALE)
    assert np.abs(hl.numpy() - f64(w["x"]) @ f64(w["router"]).T).max() < 1e-12
    for (ids, wts), (hids, hwts) in (((mine_l.ids, mine_l.weights), (hi, hw)), ((mine_h.ids, mine_h.weights),
                                                                                (hhi, hhw))):
        o, ho = np.argsort(ids, -1), np.argsort(hids.numpy(), -1)        # HF's top-k is unsorted: compare as sets
        assert np.array_equal(np.take_along_axis(ids, o, -1), np.take_along_axis(hids.numpy(), ho, -1))
        d = np.take_along_axis(wts, o, -1) - np.take_along_axis(hwts.numpy(), ho, -1)
        assert np.abs(d).max() < 1e-14


# ---------------------------------------------------------------------------------------------- device vs host

def router_gate(dtype: str, seed: int = 0):
    """A learned layer and a hash layer on the same rows: two tier-1 integer lines, two (r) weight lines."""
    w = weights(seed)
    x, xf = stored(w["x"], dtype)
    rep = report("router-v4")
    logits = kmoe.router_logits(x, w["router"])
    learned = krv.sqrtsoftplus_topk(logits, w["bias"], K, SCALE)
    hashed = krv.hash_route(logits, w["tid2eid"], w["tokens"], SCALE)
    moe_checks.chosen_experts(rep, "v4 layer", learned, moe_checks.softmax_rule(K))     # topk_stable of s + b
    tab, tok = w["tid2eid"].numpy(), w["tokens"].numpy()
    moe_checks.chosen_experts(rep, "v4 hash layer", hashed, lambda _c: rrv.hash_ids(tab, tok))
    wr = f64(w["router"].float())
    ids_l, ids_h = learned.ids.numpy(), hashed.ids.numpy()

    def reference():
        s = rrv.sqrt_softplus(xf @ wr.T)
        return rrv.renormalised(s, ids_l, SCALE), rrv.renormalised(s, ids_h, SCALE)

    ops = [Op("router", H), Op("renorm", K)]
    check(rep, "v4 layer routing weights [N, k]", learned.weights, reference, dtype, ops, lambda r: r[0])
    check(rep, "v4 hash layer routing weights [N, k]", hashed.weights, reference, dtype, ops, lambda r: r[1])
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_router_gate_passes(dtype):
    rep = router_gate(dtype)
    assert rep.finish() == 0, rep.lines


def test_reference_runs_on_the_strict_device_bit_for_bit():
    w = weights(1)

    def compute(x, wr, bias, tab, tok):
        logits = x @ wr.T
        a, b = rrv.sqrtsoftplus_topk(logits, bias, K, SCALE), rrv.hash_route(logits, tab, tok, SCALE)
        return a.ids, a.weights, b.ids, b.weights

    args = (f64(w["x"]), f64(w["router"]), f64(w["bias"]), w["tid2eid"].numpy(), w["tokens"].numpy())
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert all(np.array_equal(a, b) for a, b in zip(dev, host, strict=True))


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_hash_table_shifted_by_one(monkeypatch):
    monkeypatch.setattr(krv, "hash_ids", lambda tab, tok: tab[tok.long() - 1].long())
    rep = router_gate("bf16")
    assert fails_only(rep, "(r) v4 hash layer chosen experts"), rep.lines


def test_fail_first_bias_applied_to_the_weights(monkeypatch):
    def planted(logits, bias, k, scale=1.0):
        c = krv.sqrt_softplus(logits) + bias.float()
        ids = kmoe.topk_stable(c, k)
        return kmoe.Routing(ids, krv.renormalised(c, ids, scale), c)

    monkeypatch.setattr(krv, "sqrtsoftplus_topk", planted)
    rep = router_gate("bf16")
    assert fails_only(rep, "(r) v4 layer routing weights"), rep.lines
