"""DeepSeek V4's attention and trained HC head as ops (reference/ops/v4_attention.py, kernels/ops/v4_attention.py,
``hyper_head`` in reference/ops/mhc.py and kernels/ops/mhc.py), issue 26:

  * each layer's attention (sliding, CSA, HCA) and the HC head of transformers' ``DeepseekV4ForCausalLM``, taken
    by forward hooks on the tiny checkpoint of tests/deepseek4_factory.py in true float64 (``Float32AsFloat64``),
    against the reference op on the same input: 1e-12 relative; a planted defect in the op fails it;
  * the kernel ops against the reference ops in float32 (1e-5 relative), the CSA choice exactly, and a pass
    at positions 8..11 over the cache of a pass at 0..7 equal to the rows 8..11 of one pass over 0..11;
  * the interleaved rope's conjugate undoes it, and the leading (non-rope) channels pass untouched."""

from __future__ import annotations

import importlib.util

import deepseek4_factory as fac
import numpy as np
import pytest
import torch

from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_gates.kernels.families.deepseek4 import model as kd
from bloomery_gates.kernels.ops import mhc as kmhc
from bloomery_gates.kernels.ops import v4_attention as kv4
from bloomery_gates.reference.families.deepseek4 import model as ref
from bloomery_gates.reference.ops import mhc as rmhc
from bloomery_gates.reference.ops import v4_attention as rv4

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
T = 12


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return deepseek4_from_hf(fac.write(tmp_path_factory.mktemp("v4ops") / "f32"))


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return [int(i) for i in np.random.default_rng(0).integers(0, fac.V, T)]


@pytest.fixture(scope="module")
def hf_calls(spec, ids):
    """(input, output) of every layer's self_attn and of the HC head, from one lifted float64 HF forward."""
    from bloomery_cli.families.deepseek4.oracle import build_hf_deepseek4
    from bloomery_cli.oracle.hf import Float32AsFloat64
    model = build_hf_deepseek4(spec)
    seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def keep(name):
        return lambda mod, args, out: seen.__setitem__(name, (args[0][0].numpy(), (out[0] if isinstance(
            out, tuple) else out)[0].numpy()))
    hooks = [model.model.layers[l].self_attn.register_forward_hook(keep(f"attn{l}")) for l in range(fac.L)]
    hooks.append(model.model.hc_head.register_forward_hook(keep("head")))
    with torch.no_grad(), Float32AsFloat64():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return seen


@needs_hf
@pytest.mark.parametrize("layer", range(fac.L))
def test_attention_equals_hf(spec, hf_calls, layer):
    """Layer ``layer``'s attention (sliding, CSA, HCA, CSA) on HF's own input equals HF's output."""
    x, want = hf_calls[f"attn{layer}"]
    got = ref.attention(spec, ref.as_f64(spec), layer, x)[0]
    assert rel(got, want) < 1e-12, rel(got, want)


@needs_hf
def test_hyper_head_equals_hf(spec, hf_calls):
    x, want = hf_calls["head"]
    w = ref.as_f64(spec)
    got = rmhc.hyper_head(x, w["model.hc_head.hc_fn"], w["model.hc_head.hc_base"], w["model.hc_head.hc_scale"],
                          spec.hc.eps, spec.layer.rms_eps)
    assert rel(got, want) < 1e-12
    assert rel(rmhc.mhc_head(x), want) > 1e-3           # the plant: the mean is not the trained head


PLANTS = {
    "conjugate dropped": (lambda mp: mp.setattr(rv4, "tail_rope", lambda x, p, r, conjugate=False,
                                                true=rv4.tail_rope: x if conjugate else true(x, p, r)), (0, 1, 2)),
    "window one short": (lambda mp: mp.setattr(rv4, "sliding_mask", lambda q, k, w, true=rv4.sliding_mask:
                                               true(q, k, w - 1)), (0, 1, 2)),
    "CSA overlap dropped": (lambda mp: mp.setattr(rv4, "pool_windows", lambda k, z, b, m, o, true=rv4.pool_windows:
                                                  true(k[:, k.shape[1] // 2:] if o else k,
                                                       z[:, z.shape[1] // 2:] if o else z,
                                                       b[:, b.shape[1] // 2:] if o else b, m, False)), (1,)),
    "indexer choice ignored (every visible entry)": (lambda mp: mp.setattr(
        rv4, "chosen_mask", lambda c, n: np.ones((c.shape[0], n), dtype=bool)), (1, 3)),
    "indexer relu dropped": (lambda mp: mp.setattr(rv4, "indexer_scores", lambda q, k, hw: np.einsum(
        "thw,th->tw", np.einsum("thd,wd->thw", q, k) / np.sqrt(q.shape[-1]), hw)), (1, 3)),
    "entry visible one window early": (lambda mp: mp.setattr(rv4, "visible", lambda p, n, m, true=rv4.visible:
                                                             true(p + m, n, m)), (1, 2)),
}


@needs_hf
@pytest.mark.parametrize("plant", list(PLANTS))
def test_fail_first_a_planted_attention_defect_is_seen(spec, hf_calls, monkeypatch, plant):
    do, layers = PLANTS[plant]
    do(monkeypatch)
    for layer in layers:
        x, want = hf_calls[f"attn{layer}"]
        assert rel(ref.attention(spec, ref.as_f64(spec), layer, x)[0], want) > 1e-6, layer


def test_tail_rope_conjugate_undoes_it_and_keeps_the_lead():
    x = np.random.default_rng(0).standard_normal((6, 3, 32))
    pos = np.arange(6) + 5
    rope = rv4.Rope(1e4, 8)
    y = rv4.tail_rope(x, pos, rope)
    assert (y[..., :24] == x[..., :24]).all() and rel(y, x) > 1e-2
    assert rel(rv4.tail_rope(y, pos, rope, conjugate=True), x) < 1e-15
    # GPT-J pairs: channel 24 + 2i turns with 24 + 2i + 1 (not with 24 + i + 4, the rotate-half pairing)
    c, s = rv4.rope_angles(pos, rope)
    assert np.allclose(y[..., 24], x[..., 24] * c[:, None, 0] - x[..., 25] * s[:, None, 0], atol=1e-15)
    k = kv4.tail_rope(torch.tensor(x, dtype=torch.float32), torch.tensor(pos), kv4.Rope(1e4, 8)).double().numpy()
    assert rel(k, y) < 1e-6


@pytest.mark.parametrize("layer", range(fac.L))
def test_kernel_equals_reference_f32(spec, layer):
    """The kernel op (float32) against the reference op on the same rows: 1e-5; the CSA choice exactly; and a
    cached pass over positions 8..11 after one over 0..7 gives those rows of the whole pass."""
    x = np.random.default_rng(layer).standard_normal((T, fac.H))
    want, chosen = ref.attention(spec, ref.as_f64(spec), layer, x)
    t = {n[len("model."):]: v.float() for n, v in spec.tensors.items() if n.startswith("model.layers.")}
    s, kind = spec.attn, spec.layer_types[layer]
    rate = {"csa": s.csa_rate, "hca": s.hca_rate}.get(kind, 0)
    w, rope = kd.attn_weights(spec, t, layer), kd.layer_rope(spec, layer)

    def run(rows, p0=0, cache=None):
        return kv4.v4_attention(torch.tensor(rows, dtype=torch.float32), w, kind, s.num_heads, s.window, rope,
                                spec.layer.rms_eps, rate, s.index_heads, s.index_topk, s.o_groups, p0, cache)
    got, kch = run(x)
    assert rel(got.double().numpy(), want) < 1e-5
    if kind == "csa":
        assert np.array_equal(kch.numpy(), chosen)
    cache = kv4.V4Cache.empty(32, kind, s.head_dim, s.index_head_dim, "cpu", torch.float32)
    run(x[:8], 0, cache)
    tail, _ = run(x[8:], 8, cache)
    assert rel(tail.double().numpy(), want[8:]) < 1e-5


def test_kernel_hyper_head_equals_reference_f32(spec):
    x = np.random.default_rng(3).standard_normal((T, fac.S, fac.H))
    w = ref.as_f64(spec)
    names = ("model.hc_head.hc_fn", "model.hc_head.hc_base", "model.hc_head.hc_scale")
    want = rmhc.hyper_head(x, *(w[n] for n in names), spec.hc.eps, spec.layer.rms_eps)
    got = kmhc.hyper_head(torch.tensor(x, dtype=torch.float32), *(spec.tensors[n].float() for n in names),
                          spec.hc.eps, spec.layer.rms_eps)
    assert rel(got.double().numpy(), want) < 1e-5

