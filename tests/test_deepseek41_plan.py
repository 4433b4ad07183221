"""``bloomery plan`` counts deepseek41 (issue 26 leftover: bloomery_cli/families/deepseek41/plan.py, registry
``plan_gguf`` / ``plan_gguf_draft``): on fixtures/ds41-tiny (GGUF-only) with its V4.1 DSpark draft, the planned
weights, KV (window caches at every layer, stream caches at the kv sources only) and the draft's weights and store
equal the bytes the engines hold on the host at two contexts; each modelled detail planted wrong misses them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.deepseek41 import plan as plan41
from bloomery_cli.gatekit import DTYPES
from bloomery_cli.plan.core import ELEM, bytes_at, terms_of
from bloomery_cli.plan.measure import _build, _resident
from bloomery_cli.plan.model import read_draft, read_target
from bloomery_cli.plan.types import AttnGroup

FIX = Path(__file__).resolve().parents[1] / "fixtures"
T, D = FIX / "ds41-tiny" / "ds41-tiny.gguf", FIX / "ds41-tiny-dspark-b7.gguf"
runner = CliRunner()


def _engine(dtype: str, ctx: int) -> dict[str, int]:
    """What the engines hold after the build (CPU): the target's weights, its caches, the draft's own storages."""
    eng, drf, _, _ = _build(T, D, None, torch.device("cpu"), DTYPES[dtype], ctx)
    caches = (sum(c.kv.nbytes for c in eng.cache.values())
              + sum(c.k.nbytes + (0 if c.z is None else c.z.nbytes) for c in eng.stream_cache.values()))
    return {"target_weights": _resident(eng) - caches, "target_kv": caches,
            "draft": _resident(eng, drf) - _resident(eng), "all": _resident(eng, drf)}


def _planned(dtype: str, ctx: int) -> dict[str, int]:
    t = read_target(T)
    b = bytes_at(t, terms_of(t, read_draft(D, t, T), dtype, "cpu"), ctx, 1, True, ELEM[dtype])
    return {"target_weights": b["target_weights"], "target_kv": b["target_kv"],
            "draft": b["draft_weights"] + b["draft_kv"],
            "all": b["target_weights"] + b["target_kv"] + b["draft_weights"] + b["draft_kv"]}


@pytest.mark.parametrize("dtype,ctx", [("bf16", 300), ("bf16", 700), ("f32", 700)])
def test_plan_equals_what_the_engines_allocate(dtype, ctx):
    eng = _engine(dtype, ctx)
    assert eng["target_kv"] > 0 and eng["draft"] > 0
    assert _planned(dtype, ctx) == eng


def test_the_terms_are_the_engines_lines():
    """ds41-tiny: 5 layers of d 32, kv sources 1 (gated: k, z) and 4 (k only); the engram site's tables counted."""
    t = read_target(T)
    assert t.family == "deepseek41" and t.attn == (AttnGroup(5, 1, 32, None, 0),)
    assert t.meta["kv_sources"] == [1, 4] and t.position_elems == 3 * 32 and t.residual_streams == 4 + 1
    assert t.meta["engram_elems"] == 152 * 16 + 320 * 64 + 2 * 4 * 64
    assert terms_of(t, None, "bf16", "cpu").per_position == 2 * (5 * 32 + 3 * 32)


def _wrapped(monkeypatch, change) -> None:
    real = plan41.deepseek41_gguf_target
    monkeypatch.setattr(plan41, "deepseek41_gguf_target", lambda *a, **k: change(real(*a, **k)))


@pytest.mark.parametrize("defect", ["stream_cache_every_layer", "window_capped", "key_positions", "norms_in_bf16"])
def test_planted_defects_miss_the_engine(monkeypatch, defect):
    """FAIL-first: each detail planted wrong, the planned bytes (bf16) no longer equal the engine's."""
    if defect == "stream_cache_every_layer":
        monkeypatch.setattr(plan41, "stream_cache_elems", lambda s: 2 * s.attn.head_dim * s.num_layers)
    elif defect == "window_capped":
        _wrapped(monkeypatch, lambda t: replace(t, attn=tuple(AttnGroup(g.layers, 1, g.head_dim, 16, 0)
                                                              for g in t.attn)))
    elif defect == "key_positions":
        _wrapped(monkeypatch, lambda t: replace(t, key_position_bytes=8))
    else:
        _wrapped(monkeypatch, lambda t: replace(t, f32_elems=0))
    assert _planned("bf16", 300) != _engine("bf16", 300)


def test_plan_command_plans_the_pair_and_measures_on_the_host(tmp_path):
    r = runner.invoke(app, ["plan", str(T), "--draft", str(D), "--device", "cpu", "--dtype", "bf16", "--ctx", "1000",
                            "--gpu-mem", "1G", "--measure", "--record", str(tmp_path / "m.json")])
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    rec = json.loads((tmp_path / "m.json").read_text())
    assert rec["within"] and rec["verify_rows"] == 8
    assert rec["resident_after_build"] == rec["resident_planned"] - rec["planned"]["draft_arena"]


@pytest.mark.parametrize("draft,why", [(FIX / "ds4-tiny-dspark-b7.gguf", "V4.1 DSpark"), (T, "no MTP")])
def test_a_draft_that_is_not_the_v41_dspark_is_a_named_error(draft, why):
    r = runner.invoke(app, ["plan", str(T), "--draft", str(draft), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and why in r.output and "Traceback" not in r.output, r.output


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> Path:
    """ds41's tiny layout with no ``output.weight``: the head is the embedding."""
    from bloomery_cli.families.deepseek41.fixture_gguf import tiny_tensors, write_deepseek41_gguf

    return write_deepseek41_gguf(tmp_path_factory.mktemp("ds41tied") / "tied.gguf", tiny_tensors(),
                                 drop=("output.weight",))


def _tied_bytes(path: Path, dtype: str) -> tuple[int, int]:
    """(the engine's resident bytes, the plan's weights + KV) for a tied file, target alone, rows 8, max_len 40."""
    from bloomery_cli.families.deepseek41.reader_gguf import deepseek41_from_gguf
    from bloomery_gates.kernels.families.deepseek41.model import Deepseek41Target

    eng = Deepseek41Target(deepseek41_from_gguf(path), "cpu", DTYPES[dtype], 40, rows=8)
    t = read_target(path)
    terms = terms_of(t, None, dtype, "cpu")
    return _resident(eng), terms.target_weights + eng.cap * terms.per_position


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_a_tied_head_is_counted_as_the_engine_holds_it(tied, dtype):
    """The reader hands float32: an f32 run on the host shares the embedding's storage, a bf16 run casts two."""
    assert read_target(tied).tied
    engine, planned = _tied_bytes(tied, dtype)
    assert planned == engine


def test_fail_first_a_tied_head_read_as_stored_bf16(tied, monkeypatch):
    _wrapped(monkeypatch, lambda t: replace(t, embed_dtype="bf16"))      # the stored dtype, not the reader's f32
    engine, planned = _tied_bytes(tied, "bf16")
    assert planned != engine


def test_fail_first_the_stream_entry_slots_forgotten(monkeypatch):
    """A stream layer's keys are the window cache [cap] and its entry slots [cap / m]: planted away (entry_rate 0),
    the host measurement at ctx 1000 fails (exit 1)."""
    _wrapped(monkeypatch, lambda t: replace(t, entry_rate=0))
    r = runner.invoke(app, ["plan", str(T), "--draft", str(D), "--device", "cpu", "--dtype", "bf16", "--ctx", "1000",
                            "--gpu-mem", "1G", "--measure"])
    assert r.exit_code == 1 and "FAIL" in r.output, r.output
