"""GLM-5.3's MLA without RoPE and its DSA k-pool indexer (docs/FAMILIES_MOE.md section 4.3): the reference against
HF transformers' ``Glm5NextTextAttention`` (a full indexer layer, then a shared one) in true float64, the device
ops against the reference (tier 1: the chosen pools and tokens against the host transcription of the kernel's rule
on its own float32 scores, and against the reference's own float64 choice; tier 2: scores and attention outputs
within the emulated bands, bf16 and f32), prefill and a verify at the end of a context, the reference on the strict
fake device, and FAIL-first plants in bf16: the tail rule dropped, the shared layer running its own choice."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import dsa as kdsa
from bloomery_gates.kernels.ops import mla as kmla
from bloomery_gates.reference.ops import dsa as rdsa
from bloomery_gates.reference.ops import mla as rmla

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, NH, QL, KL, DN, DV = 64, 4, 24, 16, 16, 16
NI, DI, P, TOPK, L, EPS = 2, 16, 2, 4, 24, 1e-6
MLA_KEYS = ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b", "o")
IDX_KEYS = ("wq_b", "wk", "k_norm_w", "k_norm_b", "weights_proj", "gate", "ape")


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    w = {"x": r(L, H, sc=1.0)}
    for layer in (0, 1):
        w |= {f"{layer}.q_a": r(QL, H, sc=0.15), f"{layer}.q_a_norm": 1.0 + r(QL, sc=0.1),
              f"{layer}.q_b": r(NH * DN, QL, sc=0.3), f"{layer}.kv_a": r(KL, H, sc=0.15),
              f"{layer}.kv_a_norm": 1.0 + r(KL, sc=0.1), f"{layer}.kv_b": r(NH * (DN + DV), KL, sc=0.3),
              f"{layer}.o": r(H, NH * DV, sc=0.15)}
    w |= {"wq_b": r(NI * DI, QL, sc=0.4), "wk": r(DI, H, sc=0.2), "k_norm_w": 1.0 + r(DI, sc=0.1),
          "k_norm_b": r(DI, sc=0.3), "weights_proj": r(NI, H, sc=0.3), "gate": r(DI, H, sc=0.2),
          "ape": r(P, DI, sc=0.3)}
    return w


def split(w: dict, layer: int, mla_cls, idx_cls):
    return mla_cls(**{k: w[f"{layer}.{k}"] for k in MLA_KEYS}), idx_cls(**{k: w[k] for k in IDX_KEYS})


def as_dtype(w: dict[str, torch.Tensor], dtype: str):
    pairs = {k: stored(v, dtype) for k, v in w.items()}
    return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}


# ---------------------------------------------------------------------------------------------- the math (HF f64)

def hf_layers(w):
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as m

    cfg = transformers.Glm5NextTextConfig(
        hidden_size=H, num_attention_heads=NH, num_key_value_heads=NH, q_lora_rank=QL, kv_lora_rank=KL,
        qk_nope_head_dim=DN, v_head_dim=DV, qk_rope_head_dim=0, index_topk=TOPK, index_kpool=P, index_head_dim=DI,
        index_n_heads=NI, index_kpool_always_select_tail=True, num_hidden_layers=2, rms_norm_eps=EPS,
        linear_num_heads=NH, layer_types=["indexed_attention"] * 2, indexer_types=["full", "shared"],
        mlp_layer_types=["dense", "dense"])
    cfg._attn_implementation = "eager"
    mods = []
    for layer in (0, 1):
        with Float32AsFloat64():
            mod = m.Glm5NextTextAttention(cfg, layer).double()
        state = {"q_a_proj.weight": w[f"{layer}.q_a"], "q_a_layernorm.weight": w[f"{layer}.q_a_norm"],
                 "q_b_proj.weight": w[f"{layer}.q_b"], "kv_a_proj_with_mqa.weight": w[f"{layer}.kv_a"],
                 "kv_a_layernorm.weight": w[f"{layer}.kv_a_norm"], "kv_b_proj.weight": w[f"{layer}.kv_b"],
                 "o_proj.weight": w[f"{layer}.o"]}
        if layer == 0:
            state |= {"indexer.wq_b.weight": w["wq_b"], "indexer.wk.weight": w["wk"],
                      "indexer.k_norm.weight": w["k_norm_w"], "indexer.k_norm.bias": w["k_norm_b"],
                      "indexer.weights_proj.weight": w["weights_proj"],
                      "indexer.index_kpool_compress_gate": w["gate"], "indexer.index_kpool_compress_ape": w["ape"]}
        mod.load_state_dict(state)
        mods.append(mod)
    return mods


def reference_pair(f: dict, pos: np.ndarray, select_tail: bool = True):
    """The reference's full layer and shared layer on queries at ``pos`` over keys 0..L-1: (selection, out0, out1)."""
    m0, iw = split(f, 0, rmla.MlaWeights, rdsa.IndexerWeights)
    m1, _ = split(f, 1, rmla.MlaWeights, rdsa.IndexerWeights)
    x, xq = f["x"], f["x"][pos]
    qr0 = rmla.q_resid(xq, m0, EPS)
    sel = rdsa.indexer(x, xq, qr0, pos, iw, NI, P, TOPK, select_tail)
    out0 = rmla.mla_attention(qr0, rmla.latent(x, m0, EPS), sel.mask, m0, NH, DN)
    out1 = rmla.mla_attention(rmla.q_resid(xq, m1, EPS), rmla.latent(x, m1, EPS), sel.mask, m1, NH, DN)
    return sel, out0, out1


def tied_at_the_cut(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows whose k-th and (k+1)-th best candidate scores are equal (-inf: not a candidate): there the chosen set
    depends on the tie rule. relu makes exact ties common: a pool every head scores below zero scores 0."""
    top = -np.sort(-scores, axis=-1)
    if top.shape[-1] <= k:
        return np.zeros(len(scores), dtype=bool)
    return np.isfinite(top[:, k]) & (top[:, k - 1] == top[:, k])


@needs_hf
def test_reference_equals_hf_full_and_shared_layers_f64():
    """Attention on HF's own choice within 1e-12 on every row (both layers); the choice itself equal to HF's on
    every row where no tie sits at the cut. On a tie HF's torch.topk picks an unspecified member; ours is the
    stated rule (lower pool first), so those rows are counted, not compared."""
    w = weights()
    l0, l1 = hf_layers(w)
    x = w["x"].double()[None]
    with torch.no_grad(), Float32AsFloat64():
        out0, _, topk = l0(x, attention_mask=torch.ones(1, L, dtype=torch.bool))
        out1, _, _ = l1(x, attention_mask=torch.ones(1, L, dtype=torch.bool), prev_topk_indices=topk)
    f = {k: v.double().numpy() for k, v in w.items()}
    sel, _, _ = reference_pair(f, np.arange(L))
    hf_mask = np.zeros((L, L + 1), dtype=bool)
    idx = topk[0].numpy()
    hf_mask[np.arange(L)[:, None], np.where(idx >= 0, idx, L)] = True
    hf_mask = hf_mask[:, :L]
    tied = tied_at_the_cut(sel.scores, TOPK // P)
    assert 0 < tied.sum() < L // 2                                      # this seed has ties at the cut (row 15)
    assert (hf_mask[~tied] == sel.mask[~tied]).all()
    assert sel.mask.sum() > L and (sel.pools >= 0).sum() > 0 and (sel.tail >= 0).sum() > 0
    assert not sel.mask[-1, :-6].all()                                       # sparse: the last query skips pools
    for layer, hf in ((0, out0), (1, out1)):
        m, _ = split(f, layer, rmla.MlaWeights, rdsa.IndexerWeights)
        mine = rmla.mla_attention(rmla.q_resid(f["x"], m, EPS), rmla.latent(f["x"], m, EPS), hf_mask, m, NH, DN)
        assert np.abs(mine - hf[0].numpy()).max() / np.abs(hf[0].numpy()).max() < 1e-12


def test_the_tail_rule_on_small_cases():
    pos = np.arange(7)
    assert rdsa.tail_tokens(pos, 2)[:, 0].tolist() == [0, -1, 2, -1, 4, -1, 6]
    assert rdsa.tail_tokens(np.array([5]), 4).tolist() == [[4, 5, -1]]
    assert kdsa.tail_tokens(torch.tensor([5]), 4).tolist() == [[4, 5, -1]]
    cand = rdsa.candidates(np.array([0, 1, 4]), 3, 2)
    assert cand.tolist() == [[False, False, False], [True, False, False], [True, True, False]]
    got = rdsa.choose_pools(np.array([[0.5, 0.5, 0.9]]), np.array([[True, True, False]]), 2)
    assert got.tolist() == [[0, 1]]
    assert rdsa.choose_pools(np.array([[0.5, 0.5, 0.9]]), np.array([[False, True, False]]), 2).tolist() == [[1, -1]]


# ---------------------------------------------------------------------------------------------- device vs host

def mla_gate(dtype: str, pos: np.ndarray, select_tail: bool = True, shared_reindexes: bool = False):
    """A full indexer layer and a shared one on queries at ``pos`` (keys 0..L-1)."""
    kw, f = as_dtype(weights(), dtype)
    rep = report("mla-dsa")
    m0, iw = split(kw, 0, kmla.MlaWeights, kdsa.IndexerWeights)
    m1, _ = split(kw, 1, kmla.MlaWeights, kdsa.IndexerWeights)
    tpos = torch.tensor(pos)
    x, xq = kw["x"], kw["x"][tpos]
    qr0 = kmla.q_resid(xq, m0, EPS)
    sel = kdsa.indexer(x, xq, qr0, tpos, iw, NI, P, TOPK, select_tail)
    out0 = kmla.mla_attention(qr0, kmla.latent(x, m0, EPS), sel.mask, m0, NH, DN)
    qr1 = kmla.q_resid(xq, m1, EPS)
    mask1 = kdsa.indexer(x, xq, qr1, tpos, iw, NI, P, TOPK, select_tail).mask if shared_reindexes else sel.mask
    out1 = kmla.mla_attention(qr1, kmla.latent(x, m1, EPS), mask1, m1, NH, DN)

    scores = sel.scores.numpy()                                 # tier 1: the kernel's rule on its own scores
    cand = rdsa.candidates(pos, scores.shape[-1], P)
    pools = rdsa.choose_pools(scores, cand, TOPK // P)
    want = rdsa.token_mask(pools, rdsa.tail_tokens(pos, P), L, P)
    t = len(pos)
    rep.integer_match(f"dsa chosen pools [{t}x{pools.shape[-1]}]", t,
                      int((sel.pools.numpy() != pools).any(-1).sum()), 0, ref="host transcription of the kernel's rule")
    rep.integer_match(f"dsa chosen tokens with the tail [{t}x{L}]", t, int((sel.mask.numpy() != want).any(-1).sum()),
                      0, ref="host transcription of the kernel's rule")
    ref = reference_pair(f, pos)
    rep.integer_match(f"dsa chosen tokens [{t}x{L}]", t, int((sel.mask.numpy() != ref[0].mask).any(-1).sum()), 0)
    rep.integer_match(f"shared layer's tokens [{t}x{L}]", t, int((mask1.numpy() != ref[0].mask).any(-1).sum()), 0)

    def reference():
        s, o0, o1 = reference_pair(f, pos)
        return np.where(np.isfinite(s.scores), s.scores, 0.0), o0, o1

    idx_ops = [Op("wk", H), Op("layer norm", DI), Op("gate", H), Op("pool", P), Op("q", QL), Op("score", DI),
               Op("heads", NI)]
    att_ops = [Op("q_a", H), Op("norm", QL), Op("q_b", QL), Op("kv_a", H), Op("norm", KL), Op("kv_b", KL),
               Op("scores", DN), Op("softmax", L), Op("pv", L), Op("o", NH * DV)]
    check(rep, f"dsa index scores [{t}, P]", torch.where(sel.scores.isfinite(), sel.scores, 0.0), reference, dtype,
          idx_ops, lambda r: r[0])
    check(rep, f"mla out, full indexer layer [{t}, H]", out0, reference, dtype, att_ops, lambda r: r[1])
    check(rep, f"mla out, shared indexer layer [{t}, H]", out1, reference, dtype, att_ops, lambda r: r[2])
    return rep


PREFILL, VERIFY = np.arange(L), np.arange(L - 5, L)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("pos", [PREFILL, VERIFY], ids=["prefill", "verify"])
def test_mla_dsa_gate_passes(dtype, pos):
    rep = mla_gate(dtype, pos)
    assert rep.finish() == 0, rep.lines


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(1).items()}
    names = list(f)

    def compute(pos, *arrays):
        return reference_pair(dict(zip(names, arrays, strict=True)), pos)

    dev, host = on_fake_device(compute, VERIFY, *f.values()), compute(VERIFY, *f.values())
    assert np.array_equal(dev[0].mask, host[0].mask) and np.array_equal(dev[0].pools, host[0].pools)
    assert np.array_equal(dev[1], host[1]) and np.array_equal(dev[2], host[2])


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

@pytest.mark.parametrize("pos", [PREFILL, VERIFY], ids=["prefill", "verify"])
def test_fail_first_tail_rule_dropped(pos):
    rep = mla_gate("bf16", pos, select_tail=False)
    assert rep.finish() == 1
    bad = [line for line in rep.lines if line.endswith(" FAIL")]
    assert any(line.startswith("(r) dsa chosen tokens with the tail") for line in bad), rep.lines
    assert not any(line.startswith("(r) dsa chosen pools") for line in bad)       # pools fine: only the tail


def test_fail_first_shared_layer_runs_its_own_choice():
    """The defect: the shared layer runs the indexer on its own queries instead of taking the full layer's
    choice. Its tokens line and its output line fail; the full layer's lines pass."""
    rep = mla_gate("bf16", PREFILL, shared_reindexes=True)
    assert rep.finish() == 1
    bad = [line for line in rep.lines if line.endswith(" FAIL")]
    assert len(bad) == 2 and bad[0].startswith("(r) shared layer's tokens"), rep.lines
    assert bad[1].startswith("(r) mla out, shared indexer layer")
