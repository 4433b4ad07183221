"""qwen4exp's PLE hashed n-gram memory (docs/FAMILIES_MOE.md section 4.5 "PLE"): the tables and the hashed ids
against HF transformers' ``Qwen4ExpTextNGramEmbedding`` exactly, the layer against ``Qwen4ExpTextPLELayer`` in true
float64, the device op against the reference (the hashed ids exactly, the new streams within the emulated bands,
bf16 and f32), a continuation (context ids and the conv tail) equal to one pass, the reference on the strict fake
device, and FAIL-first plants in bf16: a hash multiplier wrong, the conv not dilated."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import ple as kple
from bloomery_gates.reference.ops import ple as rple

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, S, E, NG, HPN, BASE, EOS, V, K, T, EPS, SEED = 64, 4, 32, 3, 2, 1000, 1, 300, 4, 30, 1e-6, 1234
HEADS = (NG - 1) * HPN
TABLES = rple.ngram_tables(V, NG, HPN, BASE, 0, SEED)
ROWS = int(TABLES.sizes.sum())


def token_ids(seed: int = 0) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(2, V, T)
    ids[[7, 8, 19]] = EOS                                      # segments: two eos in a row, one alone
    return ids


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    return {"x": r(T, S * H, sc=1.0), "table": r(ROWS, E // HEADS, sc=1.0), "key": r(S * H, E, sc=0.3),
            "value": r(H, E, sc=0.3), "norm_key": r(S * H, sc=0.1), "norm_query": r(S * H, sc=0.1),
            "norm_conv": r(S * H, sc=0.1), "conv": r(S * H, K, sc=0.4)}


# ---------------------------------------------------------------------------------------------- the math (HF)

def hf_config():
    import transformers

    return transformers.Qwen4ExpTextConfig(
        hidden_size=H, hc_count=S, vocab_size=V, eos_token_id=EOS, ple_layer_ids=[1], ple_embed_dim=E,
        ple_conv_kernel_size=K, ngram_size=NG, heads_per_ngram=HPN, ngram_vocab_size_base=BASE,
        make_ngram_vocab_size_divisible_by=128, seed=SEED, split_ngram_parts=1, rms_norm_eps=EPS,
        num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"])


@needs_hf
def test_tables_and_ids_equal_hf_exactly():
    from transformers.models.qwen4_exp import modeling_qwen4_exp as m

    emb = m.Qwen4ExpTextNGramEmbedding(hf_config(), E, 0, 0).double()
    assert emb.layer_multipliers.tolist() == TABLES.multipliers.tolist()
    assert emb.ngram_heads_vocab_sizes.tolist() == TABLES.sizes.tolist()
    assert emb.ngram_heads_offsets.tolist() == TABLES.offsets.tolist()
    rows = emb.ngram_embedding.weight.shape[0]
    emb.ngram_embedding.weight.data = torch.arange(rows, dtype=torch.float64)[:, None].repeat(1, E // HEADS)
    ids = token_ids()
    with torch.no_grad():
        hf = emb(torch.tensor(ids)[None], None)[0].view(T, HEADS, -1)[..., 0].long().numpy()
    mine = rple.ngram_ids(ids, np.full(NG - 1, EOS), TABLES, EOS, HPN)
    assert (mine == hf).all() and len(np.unique(mine)) > 3 * T


@needs_hf
def test_layer_equals_hf_ple_layer_f64():
    from transformers.models.qwen4_exp import modeling_qwen4_exp as m

    w = weights()
    with Float32AsFloat64():
        mod = m.Qwen4ExpTextPLELayer(hf_config(), 0, 0).double()
    table = torch.zeros_like(mod.ple_embedding.ngram_embedding.weight)
    table[:ROWS] = w["table"]
    mod.load_state_dict({"ple_embedding.ngram_embedding.weight": table, "key_proj.weight": w["key"],
                         "value_proj.weight": w["value"], "norm_key.weight": w["norm_key"],
                         "norm_query.weight": w["norm_query"], "norm_conv.weight": w["norm_conv"],
                         "conv1d.weight": w["conv"][:, None, :]}, strict=False)
    ids = token_ids()
    x = w["x"].double()
    with torch.no_grad(), Float32AsFloat64():
        hf = (x[None] + mod(x[None], torch.tensor(ids)[None], None))[0].numpy()
    f = {k: v.double().numpy() for k, v in w.items()}
    hashed = rple.ngram_ids(ids, np.full(NG - 1, EOS), TABLES, EOS, HPN)
    mine = rple.ple_layer(f["x"], hashed, pweights(f, rple.PleWeights), S, NG, EPS)
    assert np.abs(mine - hf).max() / np.abs(hf).max() < 1e-12


def pweights(f: dict, cls):
    return cls(**{k: f[k] for k in ("table", "key", "value", "norm_key", "norm_query", "norm_conv", "conv")})


def test_a_continuation_equals_one_pass():
    """Context ids and the conv tail carry a split exactly: ids over [0, 12) then [12, T) equal one pass (integers,
    kernel and reference), and the reference layer's rows after the split equal the one pass's within 1e-12."""
    ids, f = token_ids(1), {k: v.double().numpy() for k, v in weights(1).items()}
    one = rple.ngram_ids(ids, np.full(NG - 1, EOS), TABLES, EOS, HPN)
    two = rple.ngram_ids(ids[12:], ids[12 - (NG - 1):12], TABLES, EOS, HPN)
    assert (one[12:] == two).all()
    tt = {k: torch.tensor(getattr(TABLES, k)) for k in ("multipliers", "sizes", "offsets")}
    kid = kple.ngram_ids(torch.tensor(ids[12:]), torch.tensor(ids[10:12]), tt["multipliers"], tt["sizes"],
                         tt["offsets"], EOS, HPN)
    assert (kid.numpy() == two).all()
    pw = pweights(f, rple.PleWeights)
    whole = rple.ple_layer(f["x"], one, pw, S, NG, EPS)
    from bloomery_gates.reference.ops.gated_hc import grouped_norm

    # the conv tail: norm_conv(gv) of the (K-1) N rows before the split, recomputed from the one pass's inputs
    def gv_normed(rows):
        e = pw.table[one[rows]].reshape(rows.stop - rows.start, -1)
        h = H
        key = grouped_norm(e @ pw.key.T, pw.norm_key, h, EPS).reshape(-1, S, h)
        q = grouped_norm(f["x"][rows], pw.norm_query, h, EPS).reshape(-1, S, h)
        a = (key * q).sum(-1) / np.sqrt(h)
        gate = np.sign(a) * np.sqrt(np.maximum(np.abs(a), 1e-6))
        gv = (0.5 * (1 + np.tanh(0.5 * gate)))[:, :, None] * (e @ pw.value.T)[:, None, :]
        return grouped_norm(gv.reshape(-1, S * h), pw.norm_conv, h, EPS)

    tail = gv_normed(slice(12 - (K - 1) * NG, 12))
    part = rple.ple_layer(f["x"][12:], two, pw, S, NG, EPS, tail)
    assert np.abs(part - whole[12:]).max() / np.abs(whole).max() < 1e-12


# ---------------------------------------------------------------------------------------------- device vs host

def ple_gate(dtype: str, seed: int = 0):
    w, ids = weights(seed), token_ids(seed)
    kx = {k: stored(v, dtype)[0] for k, v in w.items()}
    f = {k: stored(v, dtype)[1] for k, v in w.items()}
    tt = {k: torch.tensor(getattr(TABLES, k)) for k in ("multipliers", "sizes", "offsets")}
    rep = report("ple")
    hashed = kple.ngram_ids(torch.tensor(ids), torch.full((NG - 1,), EOS), tt["multipliers"], tt["sizes"],
                            tt["offsets"], EOS, HPN)
    out = kple.ple_layer(kx["x"], hashed, pweights(kx, kple.PleWeights), S, NG, EPS)
    ref_ids = rple.ngram_ids(ids, np.full(NG - 1, EOS), TABLES, EOS, HPN)
    differ = int((hashed.numpy() != ref_ids).any(-1).sum())
    rep.integer_match(f"ple hashed n-gram ids [{T}x{HEADS}]", T, differ, 0)
    ops = [Op("key", E), Op("norm", H), Op("gate", H), Op("value", E), Op("norm conv", H), Op("conv", K),
           Op("silu, add", 2)]
    check(rep, f"ple streams after [{T}, S*H]", out,
          lambda: rple.ple_layer(f["x"], ref_ids, pweights(f, rple.PleWeights), S, NG, EPS), dtype, ops)
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_ple_gate_passes(dtype):
    rep = ple_gate(dtype)
    assert rep.finish() == 0, rep.lines


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(2).items()}
    ids = token_ids(2)
    names = list(f)

    def compute(ids, context, mult, sizes, offsets, *arrays):
        a = dict(zip(names, arrays, strict=True))
        hashed = rple.ngram_ids(ids, context, rple.NgramTables(mult, sizes, offsets), EOS, HPN)
        return hashed, rple.ple_layer(a["x"], hashed, pweights(a, rple.PleWeights), S, NG, EPS)

    args = (ids, np.full(NG - 1, EOS), TABLES.multipliers, TABLES.sizes, TABLES.offsets, *f.values())
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert np.array_equal(dev[0], host[0]) and np.array_equal(dev[1], host[1])


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_hash_multiplier_wrong(monkeypatch):
    """The defect: the multiplier of the second token (k = 1) read one odd number off (a reader's slip, or the
    table of another PLE layer): every 2-gram and 3-gram id moves."""
    real = kple.ngram_ids

    def wrong(ids, context, mult, sizes, offsets, eos, hpn):
        return real(ids, context, mult + torch.tensor([0, 2, 0]), sizes, offsets, eos, hpn)

    monkeypatch.setattr(kple, "ngram_ids", wrong)
    rep = ple_gate("bf16")
    assert rep.finish() == 1
    bad = [line.split(" [")[0] for line in rep.lines if line.endswith(" FAIL")]
    assert bad == ["(r) ple hashed n-gram ids", "(r) ple streams after"], rep.lines


def test_fail_first_conv_not_dilated(monkeypatch):
    real = kple.dilated_conv
    monkeypatch.setattr(kple, "dilated_conv", lambda z, w, dilation, tail=None: real(z, w, 1, tail))
    rep = ple_gate("bf16")
    assert rep.finish() == 1
    assert [line.split(" [")[0] for line in rep.lines if line.endswith(" FAIL")] == ["(r) ple streams after"]
