"""`bloomery plan`: header-only plans of every fixture and bench shape, the ctx-first rule, the gate's load line,
the measurement against the engine (CPU: resident bytes), and bad input (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import fixture_path
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.plan import core as plan_mod
from bloomery_cli.plan.core import decide, make_plan, parse_bytes
from bloomery_cli.plan.model import read_draft, read_target

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PAIRS = [("qwen3-tiny", "qwen3-tiny-dflash-b8"), ("qwen3-tiny", "qwen3-tiny-dflash-b8-speculators"),
         ("qwen3-tiny", "qwen3-tiny-dflash2-b8"), ("qwen3-tiny", "qwen3-tiny-dspark-b7"),
         ("qwen3-tiny", "qwen3-tiny-eagle3"), ("qwen3-tiny.gguf", "qwen3-tiny-dflash-b8"),
         ("qwen38-tiny", "qwen38-tiny"), ("qwen38-tiny.gguf", "qwen38-tiny.gguf"),
         ("qwen38-tiny", "qwen38-tiny-dflash-b8"), ("qwen38-tiny", "qwen38-tiny-dflash2-b8"),
         ("qwen38-tiny", "qwen38-tiny-dspark-b7-speculators")]
runner = CliRunner()


def plan_json(*args: str) -> dict:
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.parametrize("target,draft", PAIRS)
def test_plan_runs_on_every_fixture(target, draft):
    p = plan_json(str(fixture_path(target)), "--draft", str(fixture_path(draft)), "--gpu-mem", "80G")
    assert p["draft_on"] and p["ctx_with"] == p["ctx_without"] == 1024
    assert p["terms"]["draft_weights"] > 0 and p["terms"]["target_weights"] > 0


@pytest.mark.parametrize("shape", ["qwen3-8b", "qwen38-27b"])
def test_plan_runs_on_the_bench_shapes(shape):
    p = plan_json("--shape", shape, "--gpu-mem", "141G", "--ctx", "32768")
    assert p["at_ctx"]["with"]["total"] > p["at_ctx"]["without"]["total"] > p["terms"]["target_weights"]


def test_hf_and_gguf_plan_alike():
    """The same weights in two formats: the same element counts and per-position bytes."""
    for hf, gg in (("qwen3-tiny", "qwen3-tiny.gguf"), ("qwen38-tiny", "qwen38-tiny.gguf")):
        a, b = read_target(fixture_path(hf)), read_target(fixture_path(gg))
        assert (a.weight_elems, a.attn, a.recurrent, a.rotary_dim) == (b.weight_elems, b.attn, b.recurrent,
                                                                        b.rotary_dim)


def test_deltanet_state_is_per_slot_not_per_position():
    t = read_target(FIX / "qwen38-tiny")
    p1 = make_plan(t, None, budget=10**12, budget_source="test", ctx=100)
    p2 = make_plan(t, None, budget=10**12, budget_source="test", ctx=200)
    assert p1.at_ctx["without"]["target_state"] == p2.at_ctx["without"]["target_state"] > 0
    p3 = make_plan(t, None, budget=10**12, budget_source="test", ctx=100, slots=3)
    assert p3.at_ctx["without"]["target_state"] == 3 * p1.at_ctx["without"]["target_state"]


def _garbage_copy(src: Path, dst: Path, truncate: bool) -> None:
    """``src`` copied with every byte after the safetensors header overwritten (or cut off)."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    raw = f.read_bytes()
    head = 8 + int.from_bytes(raw[:8], "little")
    f.write_bytes(raw[:head] + (b"" if truncate else b"\xff" * (len(raw) - head)))


@pytest.mark.parametrize("truncate", [False, True])
def test_plan_reads_no_weight_byte(tmp_path, truncate):
    _garbage_copy(FIX / "qwen3-tiny", tmp_path / "t", truncate)
    _garbage_copy(FIX / "qwen3-tiny-dflash-b8", tmp_path / "d", truncate)
    good = plan_json(str(FIX / "qwen3-tiny"), "--draft", str(FIX / "qwen3-tiny-dflash-b8"), "--gpu-mem", "30M")
    bad = plan_json(str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--gpu-mem", "30M")
    for k in ("target", "draft"):
        good.pop(k), bad.pop(k)
    assert good == bad


def test_rule_turns_an_unset_draft_off_and_a_named_one_stays():
    on, why = decide(246, 286, 4096, "auto", False, 1887808)
    assert not on and "1887808 bytes" in why and "246 positions" in why and "286" in why
    on, why = decide(3000, 8000, 4096, "auto", False, 10)
    assert not on and "under the rule's base of 4096" in why
    assert decide(5000, 8000, 4096, "auto", False, 10)[0]            # not under min(8000, 4096)
    assert not decide(8000, 8000, 4096, "auto", True, 10)[0]         # paged
    assert decide(246, 286, 4096, "on", True, 10)[0]                 # by name: never yields


def test_plan_cli_says_why_a_draft_is_dropped():
    p = plan_json(str(FIX / "qwen3-tiny"), "--draft", str(FIX / "qwen3-tiny-dflash-b8"), "--gpu-mem", "22M",
                  "--device", "cpu", "--dtype", "f32")
    assert not p["draft_on"] and p["ctx_with"] < p["ctx_without"] < 1024
    assert f"leave a slot {p['ctx_with']} positions" in p["reason"]


def _gate(*args: str):
    return runner.invoke(app, ["gate", "run", "qwen3-dflash", "-n", "4", *args])


def test_gate_load_line_names_the_reason_and_runs_plain_only():
    r = _gate("--gpu-mem", "22M")
    assert r.exit_code == 0, r.output
    load = next(line for line in r.output.splitlines() if line.startswith("load "))
    assert load.startswith("load draft=off (unset: the draft's ") and "positions" in load
    assert "draft off: plain-only checks" in r.output
    assert "ids identical" not in r.output and "accept_mean=" not in r.output and "(r) target logits" in r.output


def test_gate_named_draft_is_kept():
    r = _gate("--gpu-mem", "22M", "--draft", str(FIX / "qwen3-tiny-dflash-b8"))
    assert r.exit_code == 0, r.output
    assert "load draft=dflash" in r.output and "plan_ctx=" in r.output and "ids identical 4" in r.output


def test_gate_rule_defect_is_caught(monkeypatch):
    """Plant the defect (a rule that never turns a draft off): the off test's expectation fails."""
    monkeypatch.setattr(plan_mod, "decide", lambda *a, **k: (True, "kept"))
    r = _gate("--gpu-mem", "22M")
    assert "load draft=off" not in r.output


def test_measure_on_the_host_passes_and_a_dropped_term_fails(monkeypatch):
    args = ["plan", str(FIX / "qwen3-tiny"), "--draft", str(FIX / "qwen3-tiny-dflash-b8"), "--device", "cpu",
            "--dtype", "f32", "--ctx", "600", "--gpu-mem", "1G", "--measure"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output
    real = plan_mod.terms_of

    def no_kv(*a, **k):                       # the planted defect: the target's KV per position forgotten
        t = real(*a, **k)
        t.per_position = 0
        return t
    monkeypatch.setattr(plan_mod, "terms_of", no_kv)
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "FAIL" in r.output


@pytest.mark.parametrize("args,what", [
    (["--gpu-mem", "lots"], "--gpu-mem"), (["--gpu-mem", "0"], "--gpu-mem"), (["--slots", "0"], "--slots"),
    (["--dtype", "f8"], "--dtype"), (["--draft-policy", "maybe"], "--draft-policy"), (["--ctx", "0"], "--ctx"),
    (["--device", "tpu"], "--device"), (["--shape", "qwen3-8b"], "plan"), (["--measure"], "--measure"),
])
def test_bad_input_exit_2(args, what):
    r = runner.invoke(app, ["plan", str(FIX / "qwen3-tiny"), "--gpu-mem", "80G", *args] if "--gpu-mem" not in args
                      else ["plan", str(FIX / "qwen3-tiny"), *args])
    assert r.exit_code == 2, r.output
    assert what in r.output and "Traceback" not in r.output


def test_bad_paths_exit_2(tmp_path):
    r = runner.invoke(app, ["plan", str(tmp_path / "nope"), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and "no such file" in r.output
    r = runner.invoke(app, ["plan", str(tmp_path / "nope")])      # the path named first, not a missing budget
    assert r.exit_code == 2 and "no such file" in r.output and "--gpu-mem" not in r.output
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{")
    r = runner.invoke(app, ["plan", str(FIX / "qwen3-tiny"), "--draft", str(tmp_path / "d"), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = runner.invoke(app, ["plan", str(FIX / "qwen3-tiny"), "--draft", str(FIX / "qwen3-tiny"), "--gpu-mem", "1G"])
    assert r.exit_code == 2 and "no MTP" in r.output


def test_parse_bytes():
    assert parse_bytes("80G") == 80 * 10**9 and parse_bytes("24GiB") == 24 << 30 and parse_bytes("1e3") == 1000


def test_read_draft_kinds():
    t = read_target(FIX / "qwen3-tiny")
    kinds = {d: read_draft(FIX / d, t).kind for d in ("qwen3-tiny-dflash-b8", "qwen3-tiny-dflash2-b8",
                                                       "qwen3-tiny-dspark-b7", "qwen3-tiny-eagle3")}
    assert kinds == {"qwen3-tiny-dflash-b8": "dflash", "qwen3-tiny-dflash2-b8": "dflash2",
                     "qwen3-tiny-dspark-b7": "dspark", "qwen3-tiny-eagle3": "eagle3"}
    assert read_draft(FIX / "qwen3-tiny-eagle3", t).verify_rows == 4
    assert read_draft(FIX / "qwen3-tiny-dspark-b7", t).verify_rows == 8


def test_measure_of_the_qwen38_shape_builder_at_tiny_widths(monkeypatch):
    """The qwen38-27b table and its random builder (plan_random) agree with the engine they feed, at tiny widths."""
    from bloomery_cli.families.qwen38 import plan_shape as q
    from bloomery_cli.plan.measure import measure
    from bloomery_cli.plan.shapes import plan_shape

    for k, v in dict(H=64, LAYERS=4, INTER=96, VOCAB=512, HEADS=4, KV=2, HD=32, NK=2, NV=4, DK=16, DV=16).items():
        monkeypatch.setattr(q, k, v)
    t, d = plan_shape("qwen38-27b")
    res = make_plan(t, d, dtype="f32", device="cpu", budget=10**9, budget_source="test", ctx=300)
    r = measure(res, None, None, "qwen38-27b", "cpu", "f32", 300)
    assert r["within"], r


def test_plan_peak_counts_what_is_alive_at_once():
    import torch

    from bloomery_cli.plan.peak import peak_of

    def run():
        a = torch.zeros(1000, 1000)                # 4 MB
        b = torch.ones(2000, 1000)                 # 8 MB: 12 MB alive
        c = b[:10]                                 # a view: no new bytes
        del b, c
        d = torch.zeros(500, 1000) + 1             # 2 MB temporary + 2 MB: 8 MB alive at most
        return a, d
    assert peak_of(run)[1] == 12_000_000
