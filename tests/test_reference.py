"""The float64 host reference: ops, the Qwen3 target, the DFlash drafter.

The Qwen3 reference is held against HF transformers in tests/test_oracle.py; here are the ops'
own identities and the DFlash properties that follow from DRAFTERS.md section 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomery_gates.reference.drafts import dflash
from bloomery_gates.reference.families.qwen3 import model as qwen3
from bloomery_gates.reference.ops.attention import attention, causal_mask, softmax
from bloomery_gates.reference.ops.mlp import silu, swiglu
from bloomery_gates.reference.ops.norm import rms_norm
from bloomery_gates.reference.ops.rope import apply_rope, rotate_half
from bloomery_gates.reference.weights import as_f64
from bloomery_gates.spec import DFlashSpec, LayerShape, ModelSpec

SHAPE = LayerShape(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                   rms_eps=1e-6, rope_theta=10000.0)
VOCAB = 97


def _layer_tensors(g: torch.Generator, prefix: str, s: LayerShape) -> dict[str, torch.Tensor]:
    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    def norm(n: int) -> torch.Tensor:
        return 1.0 + torch.randn(n, generator=g) * 0.1

    h, nh, nkv, d, i = s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size
    return {
        prefix + "input_layernorm.weight": norm(h),
        prefix + "post_attention_layernorm.weight": norm(h),
        prefix + "self_attn.q_proj.weight": rnd(nh * d, h),
        prefix + "self_attn.k_proj.weight": rnd(nkv * d, h),
        prefix + "self_attn.v_proj.weight": rnd(nkv * d, h),
        prefix + "self_attn.o_proj.weight": rnd(h, nh * d),
        prefix + "self_attn.q_norm.weight": norm(d),
        prefix + "self_attn.k_norm.weight": norm(d),
        prefix + "mlp.gate_proj.weight": rnd(i, h),
        prefix + "mlp.up_proj.weight": rnd(i, h),
        prefix + "mlp.down_proj.weight": rnd(h, i),
    }


def tiny_qwen3(seed: int = 0, layers: int = 2, tied: bool = False) -> ModelSpec:
    """A random Qwen3 target: H=32, heads 4, kv 2, head_dim 8, I=64, V=97, weights N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(VOCAB, 32, generator=g) * 0.1}
    for i in range(layers):
        t |= _layer_tensors(g, f"model.layers.{i}.", SHAPE)
    t["model.norm.weight"] = 1.0 + torch.randn(32, generator=g) * 0.1
    if not tied:
        t["lm_head.weight"] = torch.randn(VOCAB, 32, generator=g) * 0.1
    return ModelSpec(family="qwen3", source=Path("tiny-qwen3"), source_format="hf", layer=SHAPE,
                     num_layers=layers, vocab_size=VOCAB, tie_word_embeddings=tied, max_position=256,
                     tensors=t)


def tiny_dflash(seed: int = 1, layers: int = 2, layer_ids: tuple[int, ...] = (0, 1),
                block: int = 4) -> DFlashSpec:
    """A random DFlash drafter for ``tiny_qwen3`` (same LayerShape), mask id 96."""
    g = torch.Generator().manual_seed(seed)
    n = len(layer_ids)
    t: dict[str, torch.Tensor] = {
        "fc.weight": torch.randn(32, n * 32, generator=g) * 0.1,
        "hidden_norm.weight": 1.0 + torch.randn(32, generator=g) * 0.1,
        "norm.weight": 1.0 + torch.randn(32, generator=g) * 0.1,
    }
    for i in range(layers):
        t |= _layer_tensors(g, f"layers.{i}.", SHAPE)
    return DFlashSpec(kind="dflash", source=Path("tiny-dflash"), layer=SHAPE, num_layers=layers,
                      block_size=block, mask_token_id=VOCAB - 1, target_layer_ids=layer_ids,
                      vocab_size=VOCAB, tensors=t)


def _with(spec, **tensors: torch.Tensor):
    return dataclasses.replace(spec, tensors={**spec.tensors, **tensors})


IDS = [3, 17, 42, 5, 88, 1, 60, 23, 9, 71]
RNG = np.random.default_rng(0)


# ---- ops ------------------------------------------------------------------------------------------

def test_rms_norm_unit_rms_and_scale_invariant():
    x = RNG.normal(size=(5, 16))
    y = rms_norm(x, np.ones(16), 0.0)
    assert np.allclose(np.sqrt(np.mean(y * y, axis=-1)), 1.0, atol=1e-14)
    assert np.allclose(rms_norm(7.5 * x, np.ones(16), 0.0), y, atol=1e-14)
    w = RNG.normal(size=16)
    assert np.allclose(rms_norm(x, w, 1e-6), rms_norm(x, np.ones(16), 1e-6) * w, atol=1e-14)


def test_rope_rotate_half_preserves_norm_and_is_relative():
    assert np.array_equal(rotate_half(np.array([1.0, 2, 3, 4])), [-3.0, -4, 1, 2])
    q = RNG.normal(size=(1, 1, 8))
    k = RNG.normal(size=(1, 1, 8))
    assert np.allclose(apply_rope(q, np.array([0]), 1e4), q, atol=0)        # position 0: identity
    qr = apply_rope(q, np.array([11]), 1e4)
    assert np.isclose(np.linalg.norm(qr), np.linalg.norm(q), rtol=1e-14)
    # q(p) . k(p') depends only on p - p'
    dots = [np.sum(apply_rope(q, np.array([p + c]), 1e4) * apply_rope(k, np.array([3 + c]), 1e4))
            for p, c in [(9, 0), (9, 5), (9, 40)]]
    assert np.allclose(dots, dots[0], rtol=1e-12)


def test_attention_gqa_matches_per_head_loop_and_mask():
    q, k, v = RNG.normal(size=(5, 4, 8)), RNG.normal(size=(6, 2, 8)), RNG.normal(size=(6, 2, 8))
    mask = RNG.random((5, 6)) < 0.6
    mask[:, 0] = True
    out = attention(q, k, v, mask)
    for h in range(4):
        kv = h // 2
        for t in range(5):
            sel = np.flatnonzero(mask[t])
            p = softmax(k[sel, kv] @ q[t, h] / np.sqrt(8))
            assert np.allclose(out[t, h], p @ v[sel, kv], atol=1e-14)
    one = np.zeros((5, 6), dtype=bool)
    one[:, 2] = True                                            # a single key: output = its value
    assert np.allclose(attention(q, k, v, one), np.repeat(v[2][None], 5, 0)[:, [0, 0, 1, 1]], atol=1e-14)
    assert np.array_equal(causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    with pytest.raises(ValueError):
        attention(q, k, v, np.zeros((5, 6), dtype=bool))


def test_swiglu():
    assert np.allclose(silu(np.array([0.0, 1.0, -800.0])), [0.0, 1 / (1 + np.exp(-1)), 0.0])
    x, g, u = RNG.normal(size=(3, 4)), RNG.normal(size=(6, 4)), RNG.normal(size=(6, 4))
    d = RNG.normal(size=(4, 6))
    want = np.stack([d @ (silu(g @ r) * (u @ r)) for r in x])
    assert np.allclose(swiglu(x, g, u, d), want, atol=1e-13)


def test_weights_cached_per_spec_and_exact():
    spec = tiny_qwen3()
    w = as_f64(spec)
    assert as_f64(spec) is w
    e = w["model.embed_tokens.weight"]
    assert e.dtype == np.float64 and e is w["model.embed_tokens.weight"]
    assert np.array_equal(e, spec.tensors["model.embed_tokens.weight"].double().numpy())
    bf = dataclasses.replace(spec, tensors={k: v.bfloat16() for k, v in spec.tensors.items()})
    assert as_f64(bf) is not w
    assert np.array_equal(as_f64(bf)["model.norm.weight"], bf.tensors["model.norm.weight"].double().numpy())


# ---- qwen3 target -----------------------------------------------------------------------------------

def test_qwen3_shapes_and_taps():
    spec = tiny_qwen3()
    out = qwen3.forward(spec, IDS)
    assert out.logits.shape == (10, VOCAB) and out.hidden.shape == (3, 10, 32) and out.final.shape == (10, 32)
    assert np.array_equal(out.hidden[0], as_f64(spec)["model.embed_tokens.weight"][IDS])
    assert np.allclose(out.final, rms_norm(out.hidden[-1], as_f64(spec)["model.norm.weight"], 1e-6))
    hf = qwen3.hf_hidden_states(out)
    assert np.array_equal(hf[:2], out.hidden[:2]) and np.array_equal(hf[2], out.final)


def test_qwen3_is_causal():
    spec = tiny_qwen3()
    full = qwen3.forward(spec, IDS)
    prefix = qwen3.forward(spec, IDS[:4])
    assert np.allclose(prefix.logits, full.logits[:4], atol=1e-13, rtol=0)
    other = qwen3.forward(spec, IDS[:4] + [0] * 6)
    assert np.allclose(other.logits[:4], full.logits[:4], atol=1e-13, rtol=0)
    assert not np.allclose(other.logits[4:], full.logits[4:])


def test_qwen3_tied_head_uses_embedding():
    spec = tiny_qwen3(tied=True)
    out = qwen3.forward(spec, IDS)
    assert np.allclose(out.logits, out.final @ as_f64(spec)["model.embed_tokens.weight"].T, atol=1e-14)


def test_qwen3_rejects_bad_ids():
    with pytest.raises(ValueError):
        qwen3.forward(tiny_qwen3(), [VOCAB])
    with pytest.raises(ValueError):
        qwen3.forward(tiny_qwen3(), [])


# ---- dflash drafter -------------------------------------------------------------------------------------

def test_dflash_shapes():
    target, draft = tiny_qwen3(), tiny_dflash()
    taps = qwen3.forward(target, IDS)
    out = dflash.forward(draft, target, taps, anchor_id=IDS[-1], s=9)
    assert out.logits.shape == (3, VOCAB) and out.layer_out.shape == (2, 4, 32)
    assert out.u.shape == (9, 32) and out.final.shape == (4, 32)
    assert np.array_equal(out.ids, np.argmax(out.logits, axis=-1))
    assert np.allclose(out.final, rms_norm(out.layer_out[-1], as_f64(draft)["norm.weight"], 1e-6))


def test_dflash_zero_sublayers_reduce_to_head_of_embedding():
    """Wo = 0 and down = 0: h stays E(y), so logits = head(rms(E(y), norm))[1:]; mask rows agree."""
    target = tiny_qwen3()
    draft = tiny_dflash(layers=1)
    draft = _with(draft, **{"layers.0.self_attn.o_proj.weight": torch.zeros(32, 32),
                            "layers.0.mlp.down_proj.weight": torch.zeros(32, 64)})
    out = dflash.forward(draft, target, qwen3.forward(target, IDS), anchor_id=5)
    w, wd = as_f64(target), as_f64(draft)
    e = w["model.embed_tokens.weight"][[5, VOCAB - 1, VOCAB - 1, VOCAB - 1]]
    want = rms_norm(e, wd["norm.weight"], 1e-6)[1:] @ w["lm_head.weight"].T
    assert np.allclose(out.logits, want, atol=1e-14)
    assert np.allclose(out.logits[0], out.logits[2], atol=1e-14)


def test_dflash_context_features_use_hf_convention():
    """u_p = rms(fc([hf[l_j+1][p]]_j), hidden_norm); a last-layer id reads the post-final-norm rows."""
    target = tiny_qwen3()
    taps = qwen3.forward(target, IDS)
    draft = tiny_dflash(layer_ids=(0, 1))                       # l = 1 = L-1 -> final
    wd = as_f64(draft)
    c = np.concatenate([taps.hidden[1, :6], taps.final[:6]], axis=-1)
    want = rms_norm(c @ wd["fc.weight"].T, wd["hidden_norm.weight"], 1e-6)
    assert np.allclose(dflash.context_features(draft, taps, 6), want, atol=1e-14)
    with pytest.raises(ValueError):
        dflash.context_features(tiny_dflash(layer_ids=(0, 2)), taps, 6)


def test_dflash_depends_on_context_layer_ids_and_order():
    """Shifting target_layer_ids or swapping the feature concat order changes the drafts' logits."""
    target = tiny_qwen3(layers=3)
    taps = qwen3.forward(target, IDS)
    base = tiny_dflash(layer_ids=(0, 1))
    ref = dflash.forward(base, target, taps, 7).logits
    for ids in [(1, 2), (1, 0)]:
        other = dataclasses.replace(base, target_layer_ids=ids)
        assert not np.allclose(dflash.forward(other, target, taps, 7).logits, ref, atol=1e-6)
    # rows past s in taps are ignored
    assert np.allclose(dflash.forward(base, target, qwen3.forward(target, IDS[:8]), 7).logits,
                       dflash.forward(base, target, taps, 7, s=8).logits, atol=1e-13)


def test_dflash_block_is_bidirectional():
    """No mask: the anchor row (row 0) sees the mask rows after it, so changing the mask id moves it.
    Under a causal mask row 0 would depend on the context and the anchor only."""
    target = tiny_qwen3()
    taps = qwen3.forward(target, IDS)
    draft = tiny_dflash()
    a = dflash.forward(draft, target, taps, 7).layer_out[:, 0]
    b = dflash.forward(dataclasses.replace(draft, mask_token_id=3), target, taps, 7).layer_out[:, 0]
    assert not np.allclose(a, b, atol=1e-6)


def _rope_vec(x: np.ndarray, p: int, theta: float) -> np.ndarray:
    """Rotate pair (i, i + d/2) of one head vector by angle p * theta^(-2i/d) (a 2x2 rotation)."""
    d = len(x)
    y = x.copy()
    for i in range(d // 2):
        a = p * theta ** (-2 * i / d)
        y[i] = x[i] * np.cos(a) - x[i + d // 2] * np.sin(a)
        y[i + d // 2] = x[i + d // 2] * np.cos(a) + x[i] * np.sin(a)
    return y


def test_dflash_one_layer_matches_loop_transcription():
    """A second, loop-by-loop transcription of DRAFTERS.md section 2 for one layer: per head, per row,
    keys = context features at 0..s-1 then block rows at s..s+B-1, every block row sees every key."""
    target, draft = tiny_qwen3(), tiny_dflash(layers=1, layer_ids=(1,))
    taps = qwen3.forward(target, IDS)
    s, anchor, eps, theta = 7, 11, 1e-6, 1e4
    out = dflash.forward(draft, target, taps, anchor, s=s)
    w, wt = as_f64(draft), as_f64(target)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x) + eps) * g

    u = [rms(w["fc.weight"] @ taps.final[p], w["hidden_norm.weight"]) for p in range(s)]
    y = [anchor] + [VOCAB - 1] * 3
    h = [wt["model.embed_tokens.weight"][t] for t in y]
    a = [rms(r, w["layers.0.input_layernorm.weight"]) for r in h]
    kv_rows, kv_pos = u + a, list(range(s + 4))
    pw = "layers.0.self_attn."
    new_h = []
    for t in range(4):
        heads = []
        for hd in range(4):
            g = hd // 2
            q = rms(w[pw + "q_proj.weight"][hd * 8:(hd + 1) * 8] @ a[t], w[pw + "q_norm.weight"])
            q = _rope_vec(q, s + t, theta)
            scores, values = [], []
            for x, p in zip(kv_rows, kv_pos, strict=True):
                k = rms(w[pw + "k_proj.weight"][g * 8:(g + 1) * 8] @ x, w[pw + "k_norm.weight"])
                scores.append(q @ _rope_vec(k, p, theta) / np.sqrt(8))
                values.append(w[pw + "v_proj.weight"][g * 8:(g + 1) * 8] @ x)
            e = np.exp(np.array(scores) - max(scores))
            heads.append((e / e.sum()) @ np.array(values))
        r = h[t] + w[pw + "o_proj.weight"] @ np.concatenate(heads)
        m = rms(r, w["layers.0.post_attention_layernorm.weight"])
        gate, up = w["layers.0.mlp.gate_proj.weight"] @ m, w["layers.0.mlp.up_proj.weight"] @ m
        new_h.append(r + w["layers.0.mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up))
    assert np.allclose(out.layer_out[0], np.array(new_h), atol=1e-13, rtol=0)
    logits = [wt["lm_head.weight"] @ rms(r, w["norm.weight"]) for r in new_h[1:]]
    assert np.allclose(out.logits, np.array(logits), atol=1e-13, rtol=0)
