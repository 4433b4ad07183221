"""``bloomery bench moe``'s drafted runs (``bench.moe_drafted``) on the CPU at the tiny MoE shapes: the lines and the
record, the cost policy fed the draft's cost, and the checks shown failing on the defects they guard."""

from __future__ import annotations

import pytest
from test_bench_moe import _bench  # the tiny bench run and its record (one helper)
from typer.testing import CliRunner

from bloomery_cli import speculative
from bloomery_cli.bench import moe_drafted
from bloomery_cli.bench.moe_draft_shapes import DRAFTS, parse_drafts
from bloomery_cli.bench.moe_policy import ACCEPTS, policy_vs_best
from bloomery_cli.cli import app
from bloomery_gates.errors import InputError


@pytest.mark.parametrize("name", ["qwen35moe-tiny", "mimo2-tiny"])
def test_drafted_lines_and_record(tmp_path, name):
    res, rec = _bench(tmp_path, name)
    assert res.exit_code == 0, res.output
    kinds = list(DRAFTS[name])
    assert sorted(rec["drafted"]) == sorted(kinds) and rec["checks"]["drafted_ids_identical"]
    assert rec["checks"]["drafted_ran"] and rec["conditions"]["drafts"] == kinds
    for k in kinds:
        d, ds = rec["drafted"][k], DRAFTS[name][k]
        assert [r["a"] for r in d["sweep"]] == list(ACCEPTS) and {r["width"] for r in d["sweep"]} == {ds.width}
        assert all(r["ids_identical"] and r["windows"] > 0 and r["n"] == 8 for r in d["sweep"])
        assert {r["width"] for r in d["grid"]} >= set(ds.grid) - {ds.width}
        assert sum(f"drafted draft={k} width={ds.width} a={a} " in res.output for a in ACCEPTS) == len(ACCEPTS)
        rows = [p for p in rec["policy_drafted"] if p["draft"] == k]
        assert [p["accept"] for p in rows] == list(ACCEPTS)
        for p in rows:
            assert p["best_width"] in p["widths_run"] and p["policy_width"] in p["widths_run"]
            assert set(ds.grid) <= set(p["widths_run"]) and 0 < p["policy_over_best"] <= 1.0
    assert res.output.count("cost_policy_drafted draft=") == len(ACCEPTS) * len(kinds)
    assert "drafted ids identical 8 in every drafted run: True" in res.output
    assert "drafted_ids_identical=ok drafted_ran=ok" in res.output


def test_drafts_none_runs_no_draft(tmp_path):
    res, rec = _bench(tmp_path, "mimo2-tiny", "--drafts", "none")
    assert res.exit_code == 0, res.output
    assert "drafted" not in rec and "drafted_ran" not in rec["checks"] and "drafted draft=" not in res.output


def test_fail_first_drafted_loop_drops_an_id(tmp_path, monkeypatch):
    """Planted defect: the drafted loop drops the first id of every window that kept a proposal (the plain run is the
    bench's own loop, unpatched) -> drafted_ids_identical fails, exit 1."""
    def drop_one(argmax, kept):
        return argmax[1:kept] if kept > 1 else argmax[:kept]

    monkeypatch.setattr(speculative, "emitted_ids", drop_one)
    res, rec = _bench(tmp_path, "qwen35moe-tiny", "--drafts", "mtp")
    assert res.exit_code == 1, res.output
    assert not rec["checks"]["drafted_ids_identical"] and rec["checks"]["drafted_ran"]
    assert "drafted_ids_identical=FAILED" in res.output


def test_fail_first_nothing_drafted(tmp_path, monkeypatch):
    """Planted defect: every run goes out plain (width 1: the draft never proposes) -> drafted_ran fails, exit 1
    (the ids are the plain run's, so only this check can catch it)."""
    real = moe_drafted.timed_generate
    monkeypatch.setattr(moe_drafted, "timed_generate", lambda t, d, p, n, width=None: real(t, d, p, n, 1))
    res, rec = _bench(tmp_path, "mimo2-tiny")
    assert res.exit_code == 1, res.output
    assert not rec["checks"]["drafted_ran"] and rec["checks"]["drafted_ids_identical"]


def test_fail_first_draft_fails_to_build(tmp_path, monkeypatch):
    """A draft that cannot be built is recorded, the bench goes on, and exits 1 (no silent skip)."""
    def broken(*a, **k):
        raise RuntimeError("planted: no draft")

    monkeypatch.setattr(moe_drafted, "build_draft", broken)
    res, rec = _bench(tmp_path, "mimo2-tiny")
    assert res.exit_code == 1 and "drafted mtp failed: RuntimeError: planted: no draft" in res.output
    assert not rec["checks"]["drafted_ran"] and not rec["checks"]["drafted_ids_identical"]
    assert rec["complete"] and rec["drafted"]["mtp"]["error"]


def test_policy_pays_for_the_draft():
    """Flat verify walls: a free draft makes the widest width best; a draft costing 10 plain steps a window makes
    drafting lose (width 1) at a = 0.5."""
    table = [{"rows": r, "ms": 1.0, "walls_ms": [1.0]} for r in range(1, 5)]
    free = policy_vs_best(table, accepts=(0.5,))[0]
    paid = policy_vs_best(table, accepts=(0.5,), draft_ms={k: 10.0 for k in range(2, 5)})[0]
    assert free["best_width"] == 4 and free["policy_width"] == 4
    assert paid["best_width"] == 1 and paid["policy_width"] == 1


def test_draft_cost_interpolates_measured_widths():
    def run(k, ms):
        return moe_drafted.DraftedRun("mtp", 0.5, k, 8, 1.0, 1.0, 1.0, 1.0, 0.1, ms, 2 if k > 1 else 0, 2, True, 0)

    cost = moe_drafted.draft_cost([run(1, 0.0), run(2, 1.0), run(4, 3.0), run(8, 5.0)], 9)
    assert cost == {1: 0.0, 2: 1.0, 3: 2.0, 4: 3.0, 5: 3.5, 6: 4.0, 7: 4.5, 8: 5.0, 9: 5.0}


def test_parse_drafts():
    assert parse_drafts(None, "qwen35moe-35b-a3b") == ("mtp", "dflash")
    assert parse_drafts("dflash", "qwen35moe-35b-a3b") == ("dflash",)
    assert parse_drafts("none", "mimo2-flash") == ()
    for bad, shape in (("dflash", "mimo2-flash"), ("eagle", "qwen35moe-tiny"), ("mtp,mtp", "qwen35moe-tiny"),
                       ("", "qwen35moe-tiny")):
        with pytest.raises(InputError, match="--drafts"):
            parse_drafts(bad, shape)


@pytest.mark.parametrize("args", [["--shape", "mimo2-tiny", "--drafts", "dflash"],
                                  ["--shape", "qwen35moe-tiny", "--drafts", "mtp,bogus"],
                                  ["--shape", "qwen35moe-tiny", "--drafted-n", "0", "--rows", "6"],
                                  ["--shape", "qwen35moe-tiny", "--drafted-n", "9", "--rows", "6"],
                                  ["--shape", "qwen35moe-tiny", "--rows", "3"]])
def test_bad_drafted_flags_exit_2(tmp_path, args):
    out = tmp_path / "x.json"
    res = CliRunner().invoke(app, ["bench", "moe", *args, "--device", "cpu", "-n", "8", "--prompt-len", "8",
                                   "--json", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output and not out.exists(), res.output
    assert "--drafts" in res.output or "--drafted-n" in res.output


def test_drafted_flags_refused_off_moe(tmp_path):
    res = CliRunner().invoke(app, ["bench", "qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--drafts", "mtp"])
    assert res.exit_code == 2 and "--drafts: does not act" in res.output
