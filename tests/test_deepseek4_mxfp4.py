"""deepseek4 with MXFP4 routed experts (issue 26, part 2): DeepSeek V4's native FP4 experts read packed
(bloomery_cli/families/deepseek4/reader.py: transformers' FP8Experts(expert_dtype="fp4") layout), kept in 4 bits by
the engine (kernels/families/deepseek4/model.py through kernels/ops/mxfp4.py), the reference on the exact decoded
values; on a tiny checkpoint made here (tests/deepseek4_factory.py ``fp4=True``).

* The file's bytes decode, through transformers' own ``Fp8Dequantize`` (the outside oracle of the layout: nibble
  order, e8m0 scales, the [1, 32] block), to the values our reference uses, exactly.
* Every bad key or tensor of the FP4 layout is a one-line exit 2 naming it; a NaN scale byte a named error on read.
* Engine vs reference: check_target's (r) lines pass in f32 and bf16 on the packed checkpoint, and FAIL in bf16
  when a scale is read as e4m3 or the nibbles of a byte are swapped (FAIL-first).
"""

from __future__ import annotations

import json
from pathlib import Path

import deepseek4_factory as fac
import numpy as np
import pytest
import torch
from test_deepseek4_trunk import needs_hf, prompt, target_report
from test_deepseek4_trunk import test_engine_plain_and_drafted_passes_agree_bit_for_bit as plain_vs_drafted
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_gates.errors import InputError
from bloomery_gates.kernels.families.deepseek4 import model as kd
from bloomery_gates.kernels.ops import mxfp4 as kmx
from bloomery_gates.reference.ops import mxfp4 as rmx

runner = CliRunner()
GU = "model.layers.1.mlp.experts.gate_up_proj"


@pytest.fixture(scope="module")
def fp4(tmp_path_factory) -> Path:
    """The packed checkpoint; the rest of the trunk in bf16."""
    return fac.write(tmp_path_factory.mktemp("ds4fp4") / "fp4", dtype=torch.bfloat16, fp4=True)


def test_reads_packed_never_widened(fp4):
    s = deepseek4_from_hf(fp4)
    assert s.experts_mxfp4
    for layer in range(fac.L):
        p = f"model.layers.{layer}.mlp.experts."
        for name, rows, k in (("gate_up_proj", 2 * fac.FF, fac.H), ("down_proj", fac.H, fac.FF)):
            codes, scales = s.tensors[p + name], s.tensors[p + name + "_scale_inv"]
            assert codes.dtype == scales.dtype == torch.uint8
            assert codes.shape == (fac.E, rows, k // 2) and scales.shape == (fac.E, rows, k // 32)
    plain = deepseek4_from_hf(fac.write(fp4.parent / "plain", dtype=torch.bfloat16))
    assert not plain.experts_mxfp4 and plain.tensors[GU].dtype == torch.bfloat16


@needs_hf
def test_hf_fp8_dequantize_decodes_the_file_to_our_values(fp4):
    """transformers' Fp8Dequantize (integrations/finegrained_fp8.py, the loader of DeepSeek V4's FP4 experts) on the
    stored I8 codes and F8_E8M0 scales gives exactly reference.ops.mxfp4.dequantize of the bytes the spec hands out."""
    from safetensors.torch import load_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    raw = load_file(str(fp4 / "model.safetensors"))
    assert raw[GU].dtype == torch.int8 and raw[GU + "_scale_inv"].dtype == torch.float8_e8m0fnu
    s = deepseek4_from_hf(fp4)
    dq = Fp8Dequantize(None)
    for name in (GU, "model.layers.2.mlp.experts.down_proj"):
        hf = torch.stack([dq._dequantize_one(raw[name][e], raw[name + "_scale_inv"][e], torch.float32)
                          for e in range(fac.E)]).double().numpy()
        ours = rmx.dequantize(rmx.Mxfp4(s.tensors[name].numpy(), s.tensors[name + "_scale_inv"].numpy()))
        assert np.array_equal(hf, ours), name
        assert np.abs(ours).max() > 0 and len(np.unique(ours)) > 16


def test_top_level_expert_dtype_reads_the_same(tmp_path, fp4):
    """V4's own spelling (``expert_dtype`` at the top, no quantization_config) reads as the packed layout too."""
    cfg = {k: v for k, v in json.loads((fp4 / "config.json").read_text()).items() if k != "quantization_config"}
    d = tmp_path / "top"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg | {"expert_dtype": "fp4"}))
    (d / "model.safetensors").symlink_to(fp4 / "model.safetensors")
    assert deepseek4_from_hf(d).experts_mxfp4


def _bad(tmp_path: Path, config=None, packed_edit=None, fp4: bool = True) -> Path:
    return fac.write(tmp_path / "bad", dtype=torch.bfloat16, fp4=fp4, config=config, packed_edit=packed_edit)


Q = fac.FP4_CONFIG["quantization_config"]
BAD = {
    "scale shape": (None, lambda t: t.__setitem__(GU + "_scale_inv", t[GU + "_scale_inv"].repeat(1, 1, 2)),
                    GU + "_scale_inv"),
    "scales missing": (None, lambda t: t.pop(GU + "_scale_inv"), GU + "_scale_inv"),
    "codes shape": (None, lambda t: t.__setitem__(GU, t[GU][..., :-1]), GU),
    "codes widened": (None, lambda t: t.__setitem__(GU, t[GU].to(torch.bfloat16)), GU),
    "scales as f32": (None, lambda t: t.__setitem__(GU + "_scale_inv", t[GU + "_scale_inv"].float()),
                      GU + "_scale_inv"),
    "expert_dtype fp8": ({"quantization_config": Q | {"expert_dtype": "fp8"}}, None, "expert_dtype"),
    "scale_fmt float": ({"quantization_config": Q | {"scale_fmt": "float"}}, None, "scale_fmt"),
    "quant_method": ({"quantization_config": Q | {"quant_method": "mxfp4"}}, None, "quant_method"),
    "ff not a block": ({"moe_intermediate_size": 48}, None, "moe_intermediate_size"),
}


@pytest.mark.parametrize("defect", list(BAD))
def test_bad_fp4_layout_exits_2_naming_it(tmp_path, defect):
    config, edit, name = BAD[defect]
    if defect == "ff not a block":
        d = tmp_path / "bad"
        fac.write(d, dtype=torch.bfloat16)
        (d / "config.json").write_text(json.dumps(fac.CONFIG | fac.FP4_CONFIG | config))
    else:
        d = _bad(tmp_path, config, edit)
    with pytest.raises(InputError, match=name.replace(".", r"\.")):
        deepseek4_from_hf(d)
    r = runner.invoke(app, ["gate", "run", "qwen35moe-mtp", "--target", str(d)])
    assert r.exit_code == 2 and name in r.output and "Traceback" not in r.output, r.output


def test_packed_experts_without_the_declaration_are_named(tmp_path):
    """Packed bytes under a config that declares float experts: a named exit 2, not a silent int8 'weight'."""
    d = _bad(tmp_path, None, None)
    (d / "config.json").write_text(json.dumps(fac.CONFIG))
    with pytest.raises(InputError, match=r"model\.layers\.0\.mlp\.experts\.gate_up_proj.*dtype I8.*fp4"):
        deepseek4_from_hf(d)


def test_a_nan_scale_is_named_when_read(tmp_path):
    """e8m0 255 is NaN: the reader's read hook names the tensor (an InputError, exit 2) before anything runs on it."""
    def plant(t):
        t[GU + "_scale_inv"].view(torch.uint8)[3, 5, 0] = 255
    spec = deepseek4_from_hf(_bad(tmp_path, None, plant))
    with pytest.raises(InputError, match=r"gate_up_proj_scale_inv.*255"):
        spec.tensors[GU + "_scale_inv"]
    with pytest.raises(InputError, match="255"):
        kd.Deepseek4Target(spec, "cpu", torch.float32, max_len=32)


# ---------------------------------------------------------------------------------------------- the engine


def test_engine_keeps_the_experts_packed(fp4):
    """On the device the experts are the file's bytes (uint8, 4.25 bits a weight: a quarter of bf16 plus 1/16 for
    the scales), and a pass decodes only chunks of the chosen experts' tiles."""
    spec = deepseek4_from_hf(fp4)
    eng = kd.Deepseek4Target(spec, "cpu", torch.bfloat16, max_len=32, rows=4)
    packed = {n: x for n, x in eng.t.items() if ".experts." in n}
    assert packed and all(x.dtype == torch.uint8 for x in packed.values())
    n_weights = fac.L * fac.E * 3 * fac.H * fac.FF
    got = sum(x.nbytes for x in packed.values())
    assert got == kmx.mxfp4_bytes(n_weights) == (2 * n_weights) // 4 + n_weights // 32   # bf16's quarter + scales
    assert torch.equal(packed["layers.1.mlp.experts.gate_up_proj"], spec.tensors[GU])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_engine_target_lines_pass_on_packed_experts(fp4, dtype):
    spec = deepseek4_from_hf(fp4)
    report = target_report(spec, prompt(), dtype)
    assert report.failed == 0, report.lines
    assert sum(1 for line in report.lines if line.startswith("(r) target layer")) == fac.L, report.lines


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_packed_plain_and_drafted_passes_agree_bit_for_bit(fp4, dtype):
    """tests/test_deepseek4_trunk.py's check on the packed checkpoint: 24 one-row verifies and 6 four-row verifies
    give the same logits bits (what a gate's ``ids identical`` rests on)."""
    plain_vs_drafted(fp4, dtype)


PLANTS = {
    # the e8m0 byte decoded as an e4m3 float (the FP8 weights' scale format)
    "scale read as e4m3": lambda mp: mp.setattr(kmx, "e8m0", lambda s: s.view(torch.float8_e4m3fn).float()),
    # the two codes of a byte taken high nibble first (GGML's order is another one again)
    "nibbles swapped": lambda mp: mp.setattr(
        kmx, "unpack_codes", lambda c: torch.stack([c >> 4, c & 0x0F], dim=-1).flatten(-2)),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_fail_first_bf16(fp4, monkeypatch, plant):
    spec = deepseek4_from_hf(fp4)
    PLANTS[plant](monkeypatch)
    report = target_report(spec, prompt(), "bf16")
    assert report.finish() == 1
    failed = [line for line in report.lines if line.endswith("FAIL")]
    assert any(line.startswith("(r) target layer") for line in failed), report.lines


def tie_free(spec, ids, monkeypatch) -> bool:
    """Whether every CSA indexer row's top-k is strict in the reference: no visible score ties the k-th one (the relu
    makes exact zeros, and a tie at the boundary is broken by index here and however torch.topk breaks it in HF:
    on tests/deepseek4_factory.py's trunk, float experts too, a tie flips HF's choice on some prompts)."""
    from bloomery_gates.reference.families.deepseek4 import model as ref
    from bloomery_gates.reference.ops import v4_attention as rv4

    seen, real = [], rv4.indexer_scores
    with monkeypatch.context() as mp:
        mp.setattr(rv4, "indexer_scores", lambda *a: seen.append(real(*a)) or seen[-1])
        ref.forward(spec, ids)
    k = spec.attn.index_topk
    for sc in seen:
        vis = rv4.visible(np.arange(len(ids)), sc.shape[1], spec.attn.csa_rate)
        for row, v in zip(sc, vis, strict=True):
            top = np.sort(row[v])[::-1]
            if len(top) > k and top[k - 1] == top[k]:
                return False
    return len(seen) > 0


@needs_hf
def test_reference_equals_hf_on_packed_experts(fp4, monkeypatch):
    """The reference on the packed checkpoint against transformers (true float64, lifted), whose experts come from
    transformers' own FP4 decode (oracle.py): logits within 1e-12 relative, argmax equal; on the first 12-id prompt
    (seeds 0, 1, ...) whose indexer top-k has no tie (``tie_free``)."""
    from bloomery_cli.families.deepseek4.oracle import hf_deepseek4_taps
    from bloomery_gates.reference.families.deepseek4 import model as ref

    spec = deepseek4_from_hf(fp4)
    prompts = ([int(i) for i in np.random.default_rng(seed).integers(0, fac.V, 12)] for seed in range(20))
    ids = next(p for p in prompts if tie_free(spec, p, monkeypatch))
    out, hf = ref.forward(spec, ids), hf_deepseek4_taps(spec, ids)
    worst = float(np.abs(out.logits - hf.logits).max() / np.abs(hf.logits).max())
    print(f"deepseek4 MXFP4 reference vs HF lifted f64: {worst:.3e}")
    assert worst < 1e-12 and (out.logits.argmax(-1) == hf.logits.argmax(-1)).all()


def test_reference_on_packed_experts_runs_on_the_strict_device_bit_for_bit(fp4):
    from fake_xp import fake_device

    from bloomery_gates.reference import xp as rxp
    from bloomery_gates.reference.families.deepseek4 import model as ref

    spec = deepseek4_from_hf(fp4)
    ids = prompt()[:8]
    host = ref.forward(spec, ids)
    with rxp.on(fake_device()):
        dev = ref.forward(spec, ids)
        assert np.array_equal(rxp.to_host(dev.logits), host.logits)
