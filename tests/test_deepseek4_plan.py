"""``bloomery plan`` counts deepseek4 (issue 26: bloomery_cli/families/deepseek4/plan.py, its registry ``plan_hf``):
on the tiny checkpoints of tests/deepseek4_factory.py, float and MXFP4 experts, the planned weight bytes equal the
bytes the engine holds on the host (the sum of its weight tensors' nbytes) in bf16 and f32, its caches equal the
planned per-position state, and the packed experts take a quarter of their bf16 bytes plus one e8m0 byte per 32."""

from __future__ import annotations

from pathlib import Path

import deepseek4_factory as fac
import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_cli.plan.core import ELEM, bytes_at, terms_of
from bloomery_cli.plan.measure import _resident
from bloomery_cli.plan.model import read_target
from bloomery_gates.kernels.families.deepseek4 import model as kd

runner = CliRunner()
TORCH = {"bf16": torch.bfloat16, "f32": torch.float32}
N_EXPERT = fac.L * fac.E * 3 * fac.H * fac.FF           # routed-expert weights of the checkpoint


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ds4plan")
    return {"fp4": fac.write(root / "fp4", dtype=torch.bfloat16, fp4=True),
            "float": fac.write(root / "float", dtype=torch.bfloat16)}


def engine_weight_bytes(eng: kd.Deepseek4Target) -> int:
    """The engine's weights as it holds them: every loaded trunk tensor, embed, head, final norm, HC head."""
    return (sum(x.nbytes for x in eng.t.values()) + eng.embed.nbytes + eng.head.nbytes + eng.final_w.nbytes
            + sum(x.nbytes for x in eng.hc_head))


@pytest.mark.parametrize("kind", ["fp4", "float"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_planned_weights_equal_the_engines_bytes(ckpts, kind, dtype):
    t = read_target(ckpts[kind])
    assert t.family == "deepseek4" and t.experts.mxfp4 == (kind == "fp4")
    terms = terms_of(t, None, dtype, "cpu")
    eng = kd.Deepseek4Target(deepseek4_from_hf(ckpts[kind]), "cpu", TORCH[dtype], max_len=40, rows=4)
    assert terms.target_weights == engine_weight_bytes(eng)
    caches = _resident(eng) - engine_weight_bytes(eng)
    assert caches > 0 and caches == eng.cap * (terms.per_position - 8)   # no int64 key positions in this engine
    planned = bytes_at(t, terms, 40 + 4 - 1, 1, False, ELEM[dtype])
    assert planned["target_kv"] == eng.cap * terms.per_position


def test_packed_experts_are_a_quarter_of_bf16_plus_scales(ckpts):
    fp4, flt = read_target(ckpts["fp4"]), read_target(ckpts["float"])
    packed = fp4.meta["packed_expert_bytes"]
    assert packed == N_EXPERT // 2 + N_EXPERT // 32 == (2 * N_EXPERT) // 4 + N_EXPERT // 32
    w4, w16 = (terms_of(m, None, "bf16", "cuda").target_weights for m in (fp4, flt))
    assert w16 - w4 == 2 * N_EXPERT - packed
    eng = kd.Deepseek4Target(deepseek4_from_hf(ckpts["fp4"]), "cpu", torch.bfloat16, max_len=8)
    assert sum(x.nbytes for n, x in eng.t.items() if ".experts." in n) == packed


def test_plan_command_prints_the_packed_experts(ckpts):
    r = runner.invoke(app, ["plan", str(ckpts["fp4"]), "--gpu-mem", "1G", "--ctx", "32"])
    assert r.exit_code == 0, r.output
    assert "(deepseek4)" in r.output and f"{N_EXPERT // 2 + N_EXPERT // 32:,} bytes" in r.output, r.output


def test_fail_first_packed_experts_counted_in_the_run_dtype(ckpts, monkeypatch):
    """Planted in the plan: the packed experts counted as run-dtype weights (as if widened); the equality fails."""
    from bloomery_cli.families.deepseek4 import plan as dplan

    monkeypatch.setattr(dplan, "PACKED", ("<none>",))
    t = read_target(ckpts["fp4"])
    eng = kd.Deepseek4Target(deepseek4_from_hf(ckpts["fp4"]), "cpu", torch.bfloat16, max_len=8)
    assert terms_of(t, None, "bf16", "cpu").target_weights != engine_weight_bytes(eng)
