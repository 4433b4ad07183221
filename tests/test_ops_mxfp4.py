"""MXFP4 experts kept in 4 bits (issue 26; docs/FAMILIES_MOE.md section 4.4 "Quant in practice", section 9.1): the
format against two outside decoders (gguf-py's GGML MXFP4 for the GGML nibble order, transformers' gpt-oss
``_convert_moe_packed_tensors`` for the OCP order), the kernel's pack / decode byte for byte and value for value
against the reference, the resident bytes of a packed tiny MoE (tensor nbytes: 4.25/16 of bf16's), the routed path
decoding only the chosen experts' tiles, the gates' lines (bf16 and f32), and FAIL-first plants in bf16: a scale
read as e4m3 instead of e8m0, the nibble order swapped."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from ops_check import check, failed, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_gates.gates import moe_checks
from bloomery_gates.kernels.ops import moe as kmoe
from bloomery_gates.kernels.ops import mxfp4 as kmx
from bloomery_gates.reference.ops import moe as rmoe
from bloomery_gates.reference.ops import mxfp4 as rmx

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
H, I, E, K, N, LIMIT = 64, 32, 8, 2, 24, 10.0


def packed_moe(seed: int = 0) -> dict:
    """A tiny MoE whose experts are MXFP4 (quantised from random weights with a spread of block magnitudes, so the
    scales span many e8m0 values); x, router in float."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.exp2(torch.randint(-3, 3, (E, 2 * I + H, 1), generator=g).float())

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    gate_up = r(E, 2 * I, H) * spread[:, :2 * I]
    down = r(E, H, I, sc=0.2) * spread[:, 2 * I:]
    return {"x": r(N, H, sc=1.0), "router": r(E, H, sc=0.5), "gate_up": rmx.quantize(gate_up.double().numpy()),
            "down": rmx.quantize(down.double().numpy())}


def on_device(w: rmx.Mxfp4) -> kmx.Mxfp4:
    return kmx.Mxfp4(torch.from_numpy(w.codes.copy()), torch.from_numpy(w.scales.copy()))


# ---------------------------------------------------------------------------------------------- the format

def test_mxfp4_bytes_is_4_25_bits_a_weight():
    for f in (rmx.mxfp4_bytes, kmx.mxfp4_bytes):
        assert f(32) == 17 and f(1 << 20) * 8 == (1 << 20) * 4.25
        with pytest.raises(ValueError, match="whole blocks"):
            f(48)


def test_e8m0_decodes_exactly():
    e = np.array([0, 1, 2, 126, 127, 128, 254, 255], dtype=np.uint8)
    want = [2.0 ** -127, 2.0 ** -126, 2.0 ** -125, 0.5, 1.0, 2.0, 2.0 ** 127]
    assert rmx.e8m0(e)[:-1].tolist() == want and np.isnan(rmx.e8m0(e)[-1])
    got = kmx.e8m0(torch.from_numpy(e)).double().numpy()
    assert got[:-1].tolist() == want and np.isnan(got[-1])


def test_reference_equals_gguf_py_ggml_mxfp4():
    """Our bytes through ``to_ggml`` decode in gguf-py to our values, and gguf-py's own quantiser's bytes through
    ``from_ggml`` decode here to gguf-py's values (the GGML nibble order j / j + 16 both ways)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    w = packed_moe()["gate_up"]
    mine = rmx.dequantize(w)
    theirs = quants.dequantize(rmx.to_ggml(w), Q.MXFP4).astype(np.float64)
    assert theirs.shape == mine.shape and np.array_equal(theirs, mine)
    x = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    ggml = quants.quantize(x, Q.MXFP4)
    back = rmx.from_ggml(ggml, 96)
    assert np.array_equal(rmx.dequantize(back), quants.dequantize(ggml, Q.MXFP4).astype(np.float64))
    assert np.array_equal(rmx.to_ggml(back), ggml)


@needs_hf
def test_reference_equals_hf_gpt_oss_decoder():
    """transformers' decoder of OCP-order blocks [E, R, G, 16] + e8m0 scales [E, R, G] (it returns W^T)."""
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors

    w = packed_moe()["down"]
    blocks = torch.from_numpy(w.codes.reshape(E, H, I // 32, 16).copy())
    hf = _convert_moe_packed_tensors(blocks, torch.from_numpy(w.scales.copy()), dtype=torch.float32)
    assert np.array_equal(hf.transpose(1, 2).double().numpy(), rmx.dequantize(w))


@needs_hf
def test_reference_routed_equals_hf_deepseek_v4_experts_f64():
    """The routed experts on the decoded values = HF ``DeepseekV4Experts`` (clamped SwiGLU, swiglu_limit) in f64."""
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    from bloomery_cli.oracle.hf import Float32AsFloat64

    w = packed_moe(4)
    cfg = transformers.DeepseekV4Config(hidden_size=H, intermediate_size=I, n_routed_experts=E,
                                        num_experts_per_tok=K, swiglu_limit=1.0)
    cfg._experts_implementation = "eager"
    with Float32AsFloat64():
        experts = m.DeepseekV4Experts(cfg).double()
    experts.load_state_dict({"gate_up_proj": torch.tensor(rmx.dequantize(w["gate_up"])),
                             "down_proj": torch.tensor(rmx.dequantize(w["down"]))})
    x = w["x"].double().numpy()
    routing = rmoe.softmax_topk(rmoe.router_logits(x, w["router"].double().numpy()), K)
    with torch.no_grad(), Float32AsFloat64():
        hf = experts(torch.tensor(x), torch.tensor(routing.ids), torch.tensor(routing.weights)).numpy()
    mine = rmx.routed_experts_mxfp4(x, routing, w["gate_up"], w["down"], 1.0)
    gu = np.einsum("toh,th->to", rmx.dequantize(w["gate_up"])[routing.ids[:, 0]], x)      # first choice [T, 2I]
    assert (np.abs(gu) > 1.0).mean() > 0.2                                   # the clamp at 1.0 really bites
    assert np.abs(mine - hf).max() / np.abs(hf).max() < 1e-12


def test_quantize_is_near_and_kernel_bytes_equal_reference():
    x = torch.randn(4, 3, 128, generator=torch.Generator().manual_seed(3)) * torch.tensor([1e-3, 1.0, 40.0])[:, None]
    ref, ker = rmx.quantize(x.double().numpy()), kmx.quantize(x)
    assert np.array_equal(ker.codes.numpy(), ref.codes) and np.array_equal(ker.scales.numpy(), ref.scales)
    deq = rmx.dequantize(ref)
    blocks = np.abs(x.double().numpy()).reshape(4, 3, 4, 32).max(-1, keepdims=True)
    err = np.abs(deq - x.double().numpy()).reshape(4, 3, 4, 32) / blocks
    assert err.max() <= 0.25 + 1e-12                       # half the widest e2m1 step (2 at 4..6) over amax >= 4
    assert np.array_equal(rmx.unpack_codes(rmx.pack_codes(rmx.unpack_codes(ref.codes))), rmx.unpack_codes(ref.codes))
    for dt in (torch.bfloat16, torch.float32):
        assert np.array_equal(kmx.dequantize(ker, dt).double().numpy(), deq)       # exact in both run dtypes
    with pytest.raises(ValueError, match="bf16 or f32"):
        kmx.dequantize(ker, torch.float16)


# ---------------------------------------------------------------------------------------------- memory

def test_resident_expert_bytes_are_a_quarter_of_bf16_plus_scales():
    """The packed tiny MoE's experts on the device, measured with tensor nbytes: 4.25 / 16 of the same experts in
    bf16 (a quarter, plus one e8m0 byte per 32 weights), and what ``mxfp4_bytes`` (the plan's count) says."""
    w = packed_moe()
    dev = [on_device(w["gate_up"]), on_device(w["down"])]
    bf16 = [kmx.dequantize(d, torch.bfloat16) for d in dev]
    n = sum(t.numel() for t in bf16)
    packed, wide = sum(d.nbytes for d in dev), sum(t.nbytes for t in bf16)
    assert n == E * 3 * I * H and wide == 2 * n
    assert packed == rmx.mxfp4_bytes(n) == kmx.mxfp4_bytes(n)
    assert packed * 64 == wide * 17                           # 4.25 bits / 16 bits
    assert wide / 4 < packed < wide / 4 * 1.07


def test_routed_path_decodes_only_the_chosen_tiles(monkeypatch):
    """The gather + decode runs on the chosen experts' tiles only, a chunk at a time: no decode ever sees all E
    experts, every decoded tile is a chosen expert's, and at most ``budget`` bytes are decoded at once."""
    w = packed_moe()
    x = w["x"][:3].bfloat16()
    routing = kmoe.softmax_topk(kmoe.router_logits(x, w["router"]), K)
    seen, real = [], kmx.gathered

    def spy(p, ids, dtype):
        out = real(p, ids, dtype)
        seen.append((ids.tolist(), out.nbytes))
        return out

    monkeypatch.setattr(kmx, "gathered", spy)
    budget = 2 * (2 * I * H + H * I) * 2                      # two pairs' tiles in bf16
    kmx.routed_experts_mxfp4(x, routing, on_device(w["gate_up"]), on_device(w["down"]), LIMIT, budget=budget)
    chosen = set(routing.ids.reshape(-1).tolist())
    assert len(seen) == 2 * 3 and len(chosen) < E               # 6 pairs in 3 chunks, gate_up and down each
    assert all(set(ids) <= chosen and len(ids) <= 2 for ids, _ in seen)
    assert max(nb for _, nb in seen) <= budget


# ---------------------------------------------------------------------------------------------- device vs host

def mxfp4_gate(dtype: str, seed: int = 0):
    """The MXFP4 routed experts (clamped SwiGLU, DeepSeek V4's): the tier-1 chosen-experts line, the decoded chosen
    tiles bit for bit against the reference's exact values, and the (r) line of the routed output."""
    w = packed_moe(seed)
    x, xf = stored(w["x"], dtype)
    rep = report("mxfp4")
    routing = kmoe.softmax_topk(kmoe.router_logits(x, w["router"]), K)
    moe_checks.chosen_experts(rep, "mxfp4 block", routing, moe_checks.softmax_rule(K))
    gu, dn = on_device(w["gate_up"]), on_device(w["down"])
    ids = routing.ids.reshape(-1).unique()
    dec = [kmx.gathered(gu, ids, x.dtype).double().numpy(), kmx.gathered(dn, ids, x.dtype).double().numpy()]
    want = [rmx.dequantize(w["gate_up"])[ids.numpy()], rmx.dequantize(w["down"])[ids.numpy()]]
    differ = sum(int((a != b).sum()) for a, b in zip(dec, want, strict=True))
    rep.integer_match(f"mxfp4 decoded chosen tiles [{len(ids)} experts]", sum(a.size for a in dec), differ, 0,
                      ref="exact e2m1 x e8m0")
    routed = kmx.routed_experts_mxfp4(x, routing, gu, dn, LIMIT)
    r_ids, r_w = routing.ids.numpy(), routing.weights.double().numpy()

    def reference():
        return rmx.routed_experts_mxfp4(xf, rmoe.Routing(r_ids, r_w, np.zeros(0)), w["gate_up"], w["down"], LIMIT)

    ops = [Op("gate/up", H), Op("clamp, silu * up", 1), Op("down", I), Op("weighted sum", K)]
    check(rep, "mxfp4 routed experts [N, H]", routed, reference, dtype, ops)
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_mxfp4_gate_passes(dtype):
    rep = mxfp4_gate(dtype)
    assert rep.finish() == 0, rep.lines


def test_kernel_equals_unpacked_clamped_experts_bit_for_bit():
    """The gather-decode path is the plain clamped routed path on the decoded weights (same ops, same order)."""
    from bloomery_gates.kernels.ops import swiglu_clamp as ksc

    w = packed_moe(2)
    x = w["x"].bfloat16()
    routing = kmoe.softmax_topk(kmoe.router_logits(x, w["router"]), K)
    gu, dn = on_device(w["gate_up"]), on_device(w["down"])
    a = kmx.routed_experts_mxfp4(x, routing, gu, dn, LIMIT)
    b = ksc.routed_experts_clamped(x, routing, kmx.dequantize(gu, x.dtype), kmx.dequantize(dn, x.dtype), LIMIT)
    assert torch.equal(a, b)


def test_reference_runs_on_the_strict_device_bit_for_bit():
    w = packed_moe(1)
    x = w["x"].double().numpy()
    routing = rmoe.softmax_topk(rmoe.router_logits(x, w["router"].double().numpy()), K)

    def compute(x, gc, gs, dc, ds, ids, wts):
        gu, dn = rmx.Mxfp4(gc, gs), rmx.Mxfp4(dc, ds)
        return rmx.dequantize(gu), rmx.routed_experts_mxfp4(x, rmoe.Routing(ids, wts, wts), gu, dn, LIMIT)

    args = (x, w["gate_up"].codes, w["gate_up"].scales, w["down"].codes, w["down"].scales, routing.ids,
            routing.weights)
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert all(np.array_equal(a, b) for a, b in zip(dev, host, strict=True))


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_scale_read_as_e4m3(monkeypatch):
    monkeypatch.setattr(kmx, "e8m0", lambda s: s.view(torch.float8_e4m3fn).float())
    rep = mxfp4_gate("bf16")
    assert failed(rep, "(r) mxfp4 decoded chosen tiles") and failed(rep, "(r) mxfp4 routed experts"), rep.lines


def test_fail_first_nibble_order_swapped(monkeypatch):
    monkeypatch.setattr(kmx, "unpack_codes", lambda c: torch.stack([c >> 4, c & 0x0F], dim=-1).flatten(-2))
    rep = mxfp4_gate("bf16")
    assert failed(rep, "(r) mxfp4 decoded chosen tiles") and failed(rep, "(r) mxfp4 routed experts"), rep.lines
