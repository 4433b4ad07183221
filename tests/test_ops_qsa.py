"""qwen4exp's QSA block mask (docs/FAMILIES_MOE.md section 4.5 "QSA"): the reference against HF transformers'
``Qwen4ExpTextQSAIndexer`` in true float64 (on every row without a tie at the cut), the device op against the
reference (tier 1 on the kernel's own float32 scores, the mask against the reference's float64 choice, the scores
within the emulated bands, bf16 and f32; prefill and a verify), the reference on the strict fake device, and
FAIL-first plants in bf16: the tail dropped, block keys roped at the block's last position."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_cli.oracle.hf import Float32AsFloat64
from bloomery_gates.kernels.ops import qsa as kqsa
from bloomery_gates.kernels.ops.rope import rope_tables
from bloomery_gates.reference.ops import dsa as rdsa
from bloomery_gates.reference.ops import qsa as rqsa
from bloomery_gates.reference.ops.rope import cos_sin

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, NI, DI, R, BUDGET, L, EPS, RD, THETA = 64, 2, 16, 2, 4, 24, 1e-6, 4, 10000.0
PREFILL, VERIFY = np.arange(L), np.arange(L - 5, L)


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(L, H, generator=g), "qk": torch.randn((NI + 1) * DI, H, generator=g) * 0.2,
            "q_norm": torch.randn(DI, generator=g) * 0.1, "k_norm": torch.randn(DI, generator=g) * 0.1}


def tied_at_the_cut(scores: np.ndarray, k: int) -> np.ndarray:
    top = -np.sort(-scores, axis=-1)
    if top.shape[-1] <= k:
        return np.zeros(len(scores), dtype=bool)
    return np.isfinite(top[:, k]) & (top[:, k - 1] == top[:, k])


def ref_select(f: dict, pos: np.ndarray) -> rdsa.Selection:
    w = rqsa.QsaWeights(f["qk"], f["q_norm"], f["k_norm"])
    return rqsa.qsa_select(f["x"], f["x"][pos], pos, w, NI, R, BUDGET, EPS, RD, THETA)


@needs_hf
def test_reference_equals_hf_qsa_f64():
    import transformers
    from transformers.models.qwen4_exp import modeling_qwen4_exp as m

    w = weights()
    cfg = transformers.Qwen4ExpTextConfig(hidden_size=H, indexer_n_heads=NI, indexer_kv_heads=1, indexer_head_dim=DI,
                                          indexer_budget=BUDGET, indexer_compress_ratio=R, rms_norm_eps=EPS,
                                          head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                                                         "partial_rotary_factor": RD / 16})
    with Float32AsFloat64():
        mod = m.Qwen4ExpTextQSAIndexer(cfg, 3).double()
    mod.load_state_dict({"index_qk_proj.weight": w["qk"], "q_layernorm.weight": w["q_norm"],
                         "k_layernorm.weight": w["k_norm"]})
    cos, sin = cos_sin(np.arange(L), RD, THETA)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool))[None, None]
    with torch.no_grad(), Float32AsFloat64():
        hf = mod(w["x"].double()[None], (torch.tensor(cos)[None], torch.tensor(sin)[None]), causal, None)[0, 0]
    f = {k: v.double().numpy() for k, v in w.items()}
    sel = ref_select(f, PREFILL)
    tied = tied_at_the_cut(sel.scores, BUDGET // R)
    assert tied.sum() < L // 2
    assert (hf.numpy()[~tied] == sel.mask[~tied]).all()
    assert not sel.mask[-1].all() and (sel.pools >= 0).sum() > L          # sparse, and blocks really chosen


def qsa_gate(dtype: str, pos: np.ndarray, plant: str = ""):
    w = weights()
    kx, fx = stored(w["x"], dtype)
    kw = kqsa.QsaWeights(*(stored(w[k], dtype)[0] for k in ("qk", "q_norm", "k_norm")))
    f = {"x": fx} | {k: stored(w[k], dtype)[1] for k in ("qk", "q_norm", "k_norm")}
    cos, sin = rope_tables(RD, THETA, L, "cpu")
    tpos = torch.tensor(pos)
    sel = kqsa.qsa_select(kx, kx[tpos], tpos, kw, NI, R, BUDGET, EPS, cos, sin)
    rep = report("qsa")
    t = len(pos)
    scores = sel.scores.numpy()
    blocks = rdsa.choose_pools(scores, rdsa.candidates(pos, scores.shape[-1], R), BUDGET // R)
    want = rdsa.token_mask(blocks, rdsa.tail_tokens(pos, R), L, R)
    host = "host transcription of the kernel's rule"
    differ = int((sel.pools.numpy() != blocks).any(-1).sum())
    rep.integer_match(f"qsa chosen blocks [{t}x{blocks.shape[-1]}]", t, differ, 0, ref=host)
    rep.integer_match(f"qsa chosen tokens with the tail [{t}x{L}]", t, int((sel.mask.numpy() != want).any(-1).sum()),
                      0, ref=host)
    ref = ref_select(f, pos)
    rep.integer_match(f"qsa chosen tokens [{t}x{L}]", t, int((sel.mask.numpy() != ref.mask).any(-1).sum()), 0)

    def reference():
        s = ref_select(f, pos).scores
        return np.where(np.isfinite(s), s, 0.0)

    ops = [Op("qk", H), Op("norm", DI), Op("rope", 2), Op("mean", R), Op("score", DI), Op("heads", NI)]
    check(rep, f"qsa block scores [{t}, NB]", torch.where(sel.scores.isfinite(), sel.scores, 0.0), reference, dtype,
          ops)
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("pos", [PREFILL, VERIFY], ids=["prefill", "verify"])
def test_qsa_gate_passes(dtype, pos):
    rep = qsa_gate(dtype, pos)
    assert rep.finish() == 0, rep.lines


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(1).items()}
    names = list(f)

    def compute(pos, *arrays):
        return ref_select(dict(zip(names, arrays, strict=True)), pos)

    dev, host = on_fake_device(compute, VERIFY, *f.values()), compute(VERIFY, *f.values())
    assert np.array_equal(dev.mask, host.mask) and np.array_equal(dev.scores, host.scores)


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_tail_dropped(monkeypatch):
    monkeypatch.setattr(kqsa, "tail_tokens", lambda pos, r: torch.full((len(pos), r - 1), -1))
    rep = qsa_gate("bf16", PREFILL)
    assert rep.finish() == 1
    bad = [line for line in rep.lines if line.endswith(" FAIL")]
    assert [b.split(" [")[0] for b in bad] == ["(r) qsa chosen tokens with the tail", "(r) qsa chosen tokens"]


def test_fail_first_block_keys_roped_at_their_last_token(monkeypatch):
    real = kqsa.block_keys
    monkeypatch.setattr(kqsa, "block_keys", lambda kraw, kn, r, eps, cos, sin: real(kraw, kn, r, eps, cos[r - 1:],
                                                                                     sin[r - 1:]))
    rep = qsa_gate("bf16", PREFILL)
    assert rep.finish() == 1
    assert any(line.startswith("(r) qsa block scores") and line.endswith(" FAIL") for line in rep.lines), rep.lines
