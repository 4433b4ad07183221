"""glm5next (GLM-5.3) trunk, issue 25: the float64 reference (reference/families/glm5next/model.py) pinned to
transformers' ``Glm5NextTextModel`` (bloomery_cli/families/glm5next/oracle.py) on a tiny random checkpoint made
here (tests/glm5next_factory.py: [KDA, MLA full, MLA shared, KDA], 4 mHC streams, DSA k-pool 2 / top-4, 8 experts
top-2 in 2 groups, x2.5).

Bands against HF (docs/FAMILIES_MOE.md 2.2):
  * HF with its float32 islands lifted (``Float32AsFloat64``): a true float64 forward, so the band is float64's:
    1e-12 relative to max |x| (measured 4e-15 on final and logits).
  * HF as shipped (``.to(float64)``, its RMSNorms, mHC mixes, router, KDA kernel, indexer and softmax in float32):
    each island rounds at float32's 2^-24 = 6e-8 relative, thousands of them per forward (2.2 counted 2235 fp32
    ops in an 8-token glm5_next pass), so the band is float32-scale: 1e-5 relative to max |logit| (measured 1.2e-6
    on logits of max 3.7; 2.2 measured 4.4e-8 on logits of 0.54 with init-scale weights), and no further from
    the reference than an all-float32 HF run is (the islands are a subset of that run's roundings).
A plant (the reference's Sinkhorn rounds off by one) shows the lifted comparison fails on a real defect."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import glm5next_factory as fac
import numpy as np
import pytest
import torch

from bloomery_cli.families.glm5next.reader import glm5next_from_hf
from bloomery_gates.reference.families.glm5next import model as ref
from bloomery_gates.reference.ops import mhc as rmhc

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
T = 12


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return fac.write(tmp_path_factory.mktemp("glm5next") / "f32")


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return [int(i) for i in np.random.default_rng(0).integers(0, fac.V, T)]


def test_reference_taps_and_layers(ckpt, ids):
    """Shapes; each layer on its own (reference_layer, the shared layer given its full layer's input) equals the
    whole run bit for bit; final_norm of the last streams is the head's input; the shared layer without the full
    layer's input is a named ValueError; the DSA is sparse here and the experts really route."""
    spec = glm5next_from_hf(ckpt)
    out = ref.forward(spec, ids)
    assert out.hidden.shape == (fac.L + 1, T, fac.S, fac.H) and out.logits.shape == (T, fac.V)
    assert (out.hidden[0] == out.hidden[0][:, :1]).all()                       # S copies of the embedding
    for layer in range(fac.L):
        full = out.hidden[ref.full_layer_of(spec, layer)] if fac.IDX[layer] == "shared" and \
            fac.TYPES[layer] == "indexed_attention" else None
        assert (ref.reference_layer(spec, layer, out.hidden[layer], full) == out.hidden[layer + 1]).all()
    with pytest.raises(ValueError, match="layer 2 .shared indexer"):
        ref.reference_layer(spec, 2, out.hidden[2])
    assert (ref.final_norm(spec, out.hidden[-1]) == out.final).all()
    w = ref.as_f64(spec)
    a, _ = ref.attn_input(spec, w, 1, out.hidden[1])
    mask = ref.selection(spec, w, 1, a)
    assert mask.sum(axis=1)[-1] < T and (mask <= np.tri(T, dtype=bool)).all()  # sparse, and causal
    seen = []
    true_route = ref.route
    ref.route = lambda *a: seen.append(true_route(*a)) or seen[-1]
    try:
        ref.forward(spec, ids)
    finally:
        ref.route = true_route
    assert len(seen) == 3 and all(len(np.unique(r.ids)) >= 5 for r in seen)   # each sparse layer uses >= 5 of 8


def hf_fp32_logits(spec, ids) -> np.ndarray:
    from bloomery_cli.families.glm5next.oracle import build_hf_glm5next
    model = build_hf_glm5next(spec, lift=False).to(torch.float32)
    with torch.no_grad():
        final = model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
    return (final.double() @ spec.tensors["lm_head.weight"].double().T).numpy()


@needs_hf
def test_reference_equals_hf_text_model(ckpt, ids):
    """The reference against transformers in both tiers (module docstring); the hidden streams of every layer too
    (HF's hidden_states[l] for l < L are the streams entering layer l)."""
    from bloomery_cli.families.glm5next.oracle import build_hf_glm5next, hf_glm5next_taps
    from bloomery_cli.oracle.hf import Float32AsFloat64
    spec = glm5next_from_hf(ckpt)
    out = ref.forward(spec, ids)
    final, logits = hf_glm5next_taps(spec, ids)
    assert rel(out.final, final) < 1e-12 and rel(out.logits, logits) < 1e-12
    assert (out.logits.argmax(-1) == logits.argmax(-1)).all()
    with torch.no_grad(), Float32AsFloat64():
        hs = build_hf_glm5next(spec)(input_ids=torch.tensor([ids]), use_cache=False,
                                     output_hidden_states=True).hidden_states
    assert len(hs) == fac.L + 1
    for layer in range(fac.L):
        assert rel(out.hidden[layer], hs[layer][0].numpy()) < 1e-12, layer
    _, islands = hf_glm5next_taps(spec, ids, lift=False)
    fp32 = rel(out.logits, hf_fp32_logits(spec, ids))
    got = rel(out.logits, islands)
    assert 1e-10 < got < 1e-5 and got <= fp32, (got, fp32)


@needs_hf
@pytest.mark.parametrize("off", [-1, 1])
def test_fail_first_the_oracle_sees_sinkhorn_off_by_one(ckpt, ids, monkeypatch, off):
    """Planted: the reference's Sinkhorn runs iters + off rounds; the lifted comparison fails (the check can fail)."""
    from bloomery_cli.families.glm5next.oracle import hf_glm5next_taps
    spec = glm5next_from_hf(ckpt)
    _, logits = hf_glm5next_taps(spec, ids)
    true = rmhc.sinkhorn
    monkeypatch.setattr(rmhc, "sinkhorn", lambda x, iters, eps: true(x, iters + off, eps))
    assert rel(ref.forward(spec, ids).logits, logits) > 1e-10
