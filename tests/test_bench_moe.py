"""The MoE bench's counting (moe_bytes) on the tiny shapes, the planted worst case, and ``bloomery bench moe`` end
to end on the CPU (f32), with its checks shown failing on the defects they guard."""

from __future__ import annotations

import json
import random
from contextlib import contextmanager

import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli.bench import moe as bench_moe
from bloomery_cli.bench.moe_bytes import (
    disjoint_ids,
    distinct_of,
    distinct_uniform,
    distinct_worst,
    load_spread,
    moe_bytes,
)
from bloomery_cli.bench.moe_shapes import MOE_SHAPES, build_engine
from bloomery_cli.cli import app
from bloomery_gates.kernels.families.ffn import forced_routing
from bloomery_gates.kernels.ops.moe import Routing

CPU = torch.device("cpu")
FAST = ["--device", "cpu", "--dtype", "f32", "--prompt-len", "8", "-n", "8", "--rows", "6", "--reps", "1"]


def _engine(name: str):
    s = MOE_SHAPES[name]
    return s, *build_engine(s, CPU, torch.float32, s.layers, 64)


@pytest.mark.parametrize("name", ["qwen35moe-tiny", "mimo2-tiny"])
def test_bytes_count_active_experts_only(name):
    s, eng, spec = _engine(name)
    b = moe_bytes(eng.t, eng.head, eng.embed, s.top_k, s.experts)
    one_expert = 3 * s.hidden * s.expert_ff * 4                         # gate, up, down in f32
    moe_layers = [l for l in range(s.layers) if s.family == "qwen35moe" or l >= s.dense_layers]
    assert b.expert == {l: one_expert for l in moe_layers}
    layer_bytes = sum(x.numel() * x.element_size() for n, x in eng.t.items() if n.startswith("model.layers."))
    assert b.dense + s.experts * one_expert * len(moe_layers) == layer_bytes
    assert b.head == s.vocab * s.hidden * 4 and b.embed_row == s.hidden * 4
    assert b.plain() == b.dense + b.head + b.embed_row + s.top_k * one_expert * len(moe_layers)
    every = {l: s.experts for l in moe_layers}
    assert b.pass_bytes(3, every) == b.dense + b.head + 3 * b.embed_row + b.all_experts()
    assert b.pass_bytes(1, {l: s.top_k for l in moe_layers}) == b.plain()
    with pytest.raises(ValueError):
        b.pass_bytes(1, {0: 1} if 0 not in moe_layers else {99: 1})


def test_distinct_models():
    e, k = 8, 2
    assert [distinct_worst(e, k, r) for r in (1, 2, 4, 5, 16)] == [2, 4, 8, 8, 8]
    for r in (1, 3, 6):
        assert distinct_of(disjoint_ids(r, k, e)) == distinct_worst(e, k, r)
    assert distinct_uniform(e, k, 1) == pytest.approx(k)
    rng = random.Random(0)                     # Monte Carlo of independent uniform rows
    for r in (2, 3, 5):
        mean = sum(len({x for _ in range(r) for x in rng.sample(range(e), k)}) for _ in range(4000)) / 4000
        assert mean == pytest.approx(distinct_uniform(e, k, r), abs=0.08)
    even = load_spread((torch.arange(16) % 8).view(8, 2), 8)
    assert even["entropy"] == pytest.approx(1.0) and even["max_over_mean"] == pytest.approx(1.0)
    skew = load_spread(torch.zeros(8, 2, dtype=torch.long), 8)
    assert skew["entropy"] == pytest.approx(0.0) and skew["max_over_mean"] == pytest.approx(8.0)


@pytest.mark.parametrize("name", ["qwen35moe-tiny", "mimo2-tiny"])
def test_forced_routing_reaches_the_engine(name):
    s, eng, _ = _engine(name)
    eng.prefill(list(range(10)))

    def plant(r: Routing) -> Routing:
        return Routing(disjoint_ids(r.ids.shape[0], s.top_k, s.experts), r.weights, r.choice)

    with forced_routing(plant):
        forced = bench_moe.pass_routing(eng, eng.verify([1, 2, 3]))
    free = bench_moe.pass_routing(eng, eng.verify([1, 2, 3]))
    assert forced
    for r in forced.values():
        assert torch.equal(r.ids, disjoint_ids(3, s.top_k, s.experts))
    assert any(not torch.equal(r.ids, disjoint_ids(3, s.top_k, s.experts)) for r in free.values())


def _bench(tmp_path, shape, *extra):
    out = tmp_path / f"{shape}.json"
    res = CliRunner().invoke(app, ["bench", "moe", "--shape", shape, *FAST, *extra, "--json", str(out)])
    return res, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("name", ["qwen35moe-tiny", "mimo2-tiny"])
def test_bench_moe_record(tmp_path, name):
    res, rec = _bench(tmp_path, name, "--drafts", "none")      # the drafted runs: tests/test_bench_moe_drafted.py
    assert res.exit_code == 0, res.output
    assert rec["complete"] and all(rec["checks"].values())
    s = MOE_SHAPES[name]
    assert [r["rows"] for r in rec["verify"]] == list(range(1, 7))
    assert [r["distinct_mean"] for r in rec["verify_worst"]] == [distinct_worst(s.experts, s.top_k, r)
                                                                  for r in range(1, 7)]
    assert rec["verify"][0]["bytes"] == rec["bytes"]["plain"] and rec["verify"][0]["rel_plain"] == 1.0
    assert all(p["policy_width"] in range(1, 7) and p["best_width"] in range(1, 7) for p in rec["policy"])
    assert [r["distinct_mean"] for r in rec["stack_worst"]] == [distinct_worst(s.experts, s.top_k, r)
                                                                 for r in range(1, 7)]
    assert rec["stack"][0]["bytes_rel"] == 1.0 and len(rec["stack"]) == 6
    assert (tmp_path / f"plot-{name}.png").exists()


@contextmanager
def _not_forced(fn):
    yield


def test_fail_first_worst_case_not_planted(tmp_path, monkeypatch):
    """Planted defect: the worst case's routing never reaches the engine -> the check fails, exit 1."""
    monkeypatch.setattr(bench_moe, "forced_routing", _not_forced)
    res, rec = _bench(tmp_path, "qwen35moe-tiny", "--drafts", "none")
    assert res.exit_code == 1 and not rec["checks"]["worst_case_planted"]


def test_fail_first_stack_worst_not_planted(tmp_path, monkeypatch):
    """Planted defect: the graphed stack's worst case runs the router's routing -> its check fails, exit 1."""
    from bloomery_cli.bench import moe_stack as bench_moe_stack

    monkeypatch.setattr(bench_moe_stack, "forced_routing", _not_forced)
    res, rec = _bench(tmp_path, "mimo2-tiny", "--drafts", "none")
    assert res.exit_code == 1 and not rec["checks"]["stack_worst_planted"] and rec["checks"]["worst_case_planted"]


def test_fail_first_distinct_counted_as_pairs(tmp_path, monkeypatch):
    """Planted defect: 'distinct' counts (row, slot) pairs (R k, what the gather reads) -> exit 1."""
    monkeypatch.setattr(bench_moe, "distinct_of", lambda ids: int(ids.numel()))
    res, rec = _bench(tmp_path, "mimo2-tiny", "--drafts", "none")
    assert res.exit_code == 1 and not rec["checks"]["realistic_in_range"]


@pytest.mark.parametrize("args", [["--shape", "nope"], ["--shape", "mimo2-tiny", "--layers", "99"],
                                  ["--shape", "mimo2-tiny", "--rows", "0"]])
def test_bad_input_exit_2(tmp_path, args):
    out = tmp_path / "x.json"
    res = CliRunner().invoke(app, ["bench", "moe", *args, "--device", "cpu", "--json", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output and not out.exists()
