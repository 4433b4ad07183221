"""`bloomery plan` on every fixture in fixtures/ (each target alone, with each of its drafts, and with its in-file
MTP), and the mimo2 terms against what its engine allocates (CPU: the resident storages, as plan_measure counts
them), with planted defects that the checks catch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.mimo2 import plan as plan_mimo2
from bloomery_cli.plan import core as plan_mod
from bloomery_cli.plan.core import ELEM, bytes_at, make_plan, terms_of
from bloomery_cli.plan.headers import header_model
from bloomery_cli.plan.model import AttnGroup, read_draft, read_target
from bloomery_gates.gates.fixtures import FIXTURES

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MIMO = FIX / "mimo2-tiny"
runner = CliRunner()


NOT_PLANNED: dict[str, str] = {}       # fixture name -> why plan does not count it (none now)


def _entries() -> tuple[list[Path], list[Path]]:
    """(targets, drafts) in fixtures/: a target is a *.gguf or a directory whose architecture is a *ForCausalLM
    (or a *TextModel: glm5next-tiny is GLM-5.3's text model, Glm5NextTextModel), or a directory X holding only
    X.gguf (a GGUF-only family: ds41-tiny); an mtp-X.gguf is X.gguf's draft, a dflash-arch GGUF a block draft."""
    targets, drafts = [], []
    for p in sorted(FIX.iterdir()):
        if p.name in NOT_PLANNED:
            continue
        if p.suffix == ".gguf" and (p.name.startswith("mtp-") or header_model(p).arch == "dflash"):
            drafts.append(p)             # a separate MTP GGUF (deepseek4's converter sidecar) or a DSpark draft
        elif p.suffix == ".gguf":
            targets.append(p)
        elif p.is_dir() and not (p / "config.json").is_file() and (p / f"{p.name}.gguf").is_file():
            targets.append(p / f"{p.name}.gguf")
        elif p.is_dir() and (p / "config.json").is_file():
            archs = json.loads((p / "config.json").read_text()).get("architectures") or []
            (targets if any(a.endswith(("ForCausalLM", "TextModel")) for a in archs) else drafts).append(p)
    return targets, drafts


def _target_of(draft: Path, targets: list[Path]) -> Path:
    """A draft fixture's target: the HF target whose name is the longest prefix of the draft's (mtp-X.gguf: X.gguf)."""
    if draft.name.startswith("mtp-") and draft.suffix == ".gguf":
        return draft.with_name(draft.name.removeprefix("mtp-"))
    named = [t for t in targets if (t.is_dir() or t.parent != FIX) and draft.name.startswith(_home(t).name + "-")]
    assert named, f"no target fixture for draft {draft.name}"
    return max(named, key=lambda t: len(_home(t).name))


def _home(t: Path) -> Path:
    """A target's fixture entry: the directory of an HF target or of a GGUF-only one (ds41-tiny/ds41-tiny.gguf)."""
    return t if t.is_dir() else t.parent


def _rel(p: Path) -> str:
    return str(p.relative_to(FIX))


def _pairs() -> list[tuple[str, str | None]]:
    targets, drafts = _entries()
    out: list[tuple[str, str | None]] = []
    for t in targets:
        out.append((_rel(t), None))
        if read_target(t).draft_elems:
            out.append((_rel(t), _rel(t)))                       # its in-file MTP / NextN layers
        twin = FIX / t.name.removesuffix(".gguf")                # a GGUF plans with its HF twin's drafts
        out += [(_rel(t), _rel(d)) for d in drafts if _target_of(d, targets) in (t, twin)]
    return out


PAIRS = _pairs()


def test_the_loop_covers_every_fixture():
    targets, drafts = _entries()
    named = {n for pair in PAIRS for n in pair if n}
    assert named == {_rel(p) for p in targets + drafts}
    assert ("ds41-tiny/ds41-tiny.gguf", "ds41-tiny-dspark-b7.gguf") in PAIRS
    assert {p.name for p in FIX.iterdir() if p.suffix == ".gguf"} - named - {"nemotron-h-tiny.gguf"} <= set(NOT_PLANNED)
    assert ("mimo2-tiny", "mimo2-tiny") in PAIRS and ("nemotron-h-tiny.gguf", None) in PAIRS
    assert len(drafts) >= 12 and len(targets) >= 9


@pytest.mark.parametrize("target,draft", PAIRS, ids=[f"{t}+{d}" for t, d in PAIRS])
def test_plan_runs_on_every_fixture(target, draft):
    args = ["plan", str(FIX / target), "--gpu-mem", "80G", "--ctx", "256", "--json"]
    r = runner.invoke(app, args + (["--draft", str(FIX / draft)] if draft else []))
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["ctx_without"] == p["max_position"] and p["terms"]["target_weights"] > 0
    assert p["at_ctx"]["without"]["target_kv"] > 0 or p["terms"]["per_slot"] > 0
    if draft:
        assert p["draft_on"] and p["ctx_with"] == p["max_position"] and p["terms"]["draft_weights"] > 0
        assert p["at_ctx"]["with"]["total"] > p["at_ctx"]["without"]["total"]


@pytest.mark.parametrize("shape", ["qwen3-8b", "qwen3-4b", "qwen38-27b", "tiny"])
def test_plan_runs_on_every_bench_shape(shape):
    r = runner.invoke(app, ["plan", "--shape", shape, "--gpu-mem", "141G", "--ctx", "4096", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["draft_on"] and p["at_ctx"]["with"]["total"] > p["at_ctx"]["without"]["total"] > 0


def test_mimo2_terms_from_its_config():
    """K and V widths differ (d 32, dv 16), SWA layers carry 2 kv heads to the full layers' 1, two RoPE tables."""
    t = read_target(MIMO)
    assert t.family == "mimo2" and t.attn == (AttnGroup(2, 1, 32, None, 16), AttnGroup(2, 2, 32, None, 16))
    d = read_draft(MIMO, t, MIMO)
    assert (d.kind, d.layers, d.verify_rows, d.kv_heads, d.head_dim, d.v_head_dim) == ("mtp", 3, 4, 2, 32, 16)
    terms = terms_of(t, d, "bf16", "cuda")
    rope = 2 * 2 * 4 * t.rotary_dim + 8
    assert terms.per_position == 2 * (2 * 1 * 48 + 2 * 2 * 48) + rope
    assert terms.draft_per_position == 2 * 3 * 2 * 48 + 2 * 5 * 64 + 2 * 4 * t.rotary_dim + 8
    assert terms.windows == []                                  # the engine does not cap its SWA KV


def _engine_resident(dtype: str, ctx: int) -> int:
    import torch

    from bloomery_cli.gate import DTYPES
    from bloomery_cli.plan.measure import _build, _resident
    eng, drf, _, _ = _build(MIMO, MIMO, None, torch.device("cpu"), DTYPES[dtype], ctx)
    return _resident(eng, drf)


def _planned_resident(dtype: str, ctx: int) -> int:
    """The plan's resident terms: weights and stores (not the transient workspace, not the draft's arena)."""
    t = read_target(MIMO)
    b = bytes_at(t, terms_of(t, read_draft(MIMO, t, MIMO), dtype, "cpu"), ctx, 1, True, ELEM[dtype])
    return b["target_weights"] + b["target_kv"] + b["target_state"] + b["draft_weights"] + b["draft_kv"]


@pytest.mark.parametrize("dtype,ctx", [("bf16", 300), ("f32", 700)])
def test_mimo2_plan_equals_what_the_engine_allocates(dtype, ctx):
    assert _planned_resident(dtype, ctx) == _engine_resident(dtype, ctx)


@pytest.mark.parametrize("defect", ["k_equals_v", "swa_capped", "router_in_run_dtype"])
def test_mimo2_planted_defects_miss_the_engine(monkeypatch, defect):
    """Each modelled detail matters: planted wrong, the planned bytes no longer equal the engine's."""
    if defect == "k_equals_v":
        monkeypatch.setattr(AttnGroup, "kv_width", property(lambda g: 2 * g.head_dim))
    elif defect == "swa_capped":
        real = plan_mimo2.mimo2_target

        def capped(*a, **k):
            t = real(*a, **k)
            t.attn = tuple(AttnGroup(g.layers, g.kv_heads, g.head_dim, 17 if g.kv_heads == 2 else None, g.v_head_dim)
                           for g in t.attn)
            return t
        monkeypatch.setattr(plan_mimo2, "mimo2_target", capped)
    else:
        monkeypatch.setattr(plan_mimo2, "_f32_elems", lambda inv, fmt="hf": 0)
    assert _planned_resident("bf16", 300) != _engine_resident("bf16", 300)


def _measure(ctx: int, *extra: str, target: Path = MIMO, draft: Path = MIMO):
    return runner.invoke(app, ["plan", str(target), "--draft", str(draft), "--device", "cpu", "--dtype", "bf16",
                               "--ctx", str(ctx), "--gpu-mem", "1G", "--measure", *extra])


@pytest.mark.parametrize("ctx,defect", [(1000, "scores"), (200, "experts")])
def test_mimo2_measure_on_the_host_passes_and_a_dropped_term_fails(monkeypatch, tmp_path, ctx, defect):
    """At ctx 1000 sink attention's scores are the peak, at 200 the routed experts' gathered weights: each planted
    away, the measurement fails (exit 1)."""
    r = _measure(ctx, "--record", str(tmp_path / "m.json"))
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    rec = json.loads((tmp_path / "m.json").read_text())
    assert rec["within"] and rec["draft"] == "mimo2-tiny" and rec["verify_rows"] == 4
    if defect == "scores":
        monkeypatch.setattr(plan_mimo2, "SCORE_BYTES", 4)       # only one f32 copy of the scores counted
    else:
        monkeypatch.setattr(plan_mod, "gathered", lambda *a: 0)   # the gathered expert weights forgotten
    r = _measure(ctx)
    assert r.exit_code == 1 and "FAIL" in r.output, r.output


def test_qwen35moe_measure_counts_the_gathered_experts(monkeypatch):
    """qwen35moe's routed experts run through the same gather: its prefill peak is there (planted away: exit 1)."""
    q = FIX / "qwen35moe-tiny"
    r = _measure(1000, target=q, draft=q)
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    monkeypatch.setattr(plan_mod, "gathered", lambda *a: 0)
    r = _measure(1000, target=q, draft=q)
    assert r.exit_code == 1 and "FAIL" in r.output, r.output


def test_mimo2_plan_says_the_swa_window_is_not_capped():
    r = runner.invoke(app, ["plan", str(MIMO), "--gpu-mem", "1G"])
    assert r.exit_code == 0, r.output
    assert "note: mimo2: the engine keeps every position of its SWA layers" in r.output.replace("\n", " ")
    res = make_plan(read_target(MIMO), None, budget=10**9, budget_source="test")
    assert any("not capped at the window of 17" in n for n in res.notes)


def test_mimo2_draft_from_a_non_mimo2_file_is_a_named_error():
    r = runner.invoke(app, ["plan", str(MIMO), "--draft", str(FIX / "qwen3-tiny"), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and "mimo2" in r.output and "Traceback" not in r.output


def test_gather_budget_is_the_kernels():
    from bloomery_gates.kernels.ops import moe
    assert plan_mod.gathered(read_target(MIMO), 10**6, 2) > 0 and moe.GATHER_BUDGET == 1 << 28


@pytest.mark.skipif(not (FIXTURES / "mimo2-tiny.gguf").is_file(), reason="fixtures/mimo2-tiny.gguf not bundled")
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_mimo2_gguf_plans_as_its_hf_twin(dtype):
    """The bundled GGUF is the HF fixture in llama.cpp's layout: its plan equals the HF one's term for term (the
    router, its score bias and the final norm found under their GGUF names, the 3 MTP blocks as the draft)."""
    from dataclasses import asdict

    def plan(t: Path) -> dict:
        target = read_target(t)
        res = make_plan(target, read_draft(t, target), dtype=dtype, budget=1 << 30, budget_source="test", ctx=1000)
        return {k: v for k, v in asdict(res).items() if k not in ("target", "draft")}

    hf, gguf = plan(FIXTURES / "mimo2-tiny"), plan(FIXTURES / "mimo2-tiny.gguf")
    assert gguf == hf and read_target(FIXTURES / "mimo2-tiny.gguf").draft_layers == 3
