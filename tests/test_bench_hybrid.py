"""``bloomery bench qwen38-dflash2 | qwen38-mtp --shape`` end to end on CPU (the qwen38-tiny shape): the record's
figures, the ids-identical assertion (exit 1 on a planted lossless defect), named exit-2 errors, the per-shape
plot; and the CPU thread rule."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli import speculative
from bloomery_cli.bench.hybrid import read_bytes
from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_dflash2, random_qwen38
from bloomery_cli.bench.shapes import weight_bytes
from bloomery_cli.cli import app
from bloomery_cli.threads import thread_count
from bloomery_gates.errors import InputError

FAST = ["--shape", "qwen38-tiny", "--device", "cpu", "-n", "10", "--prompt-len", "8"]


def _bench(tmp_path, *args):
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, ["bench", *args, *FAST, "--json", str(out)])
    return res, (json.loads(out.read_text()) if out.exists() else None)


def test_mtp_bench_record(tmp_path):
    res, rec = _bench(tmp_path, "qwen38-mtp", "--mtp-width", "2")
    assert res.exit_code == 0, res.output
    assert rec["complete"] and rec["ids_identical_all"] and rec["conditions"]["verify_rows"] == 3
    assert [v["rows"] for v in rec["verify"]] == list(range(1, 17))
    assert rec["plain"]["ratio_roofline_read"] > 0 and rec["bandwidth"]["roofline_read_tok_s"] > 0
    assert [round(s["a"], 2) for s in rec["sweep"]] == [0.5, 0.7, 0.8, 0.9, 1.0]
    assert rec["sweep"][-1]["accept_mean"] == 3.0                       # a = 1: every proposal kept
    assert rec["criterion"]["at"] == "a=0.8" and rec["draft"]["block_ms"] > 0
    host = rec["host"]                                                  # the chained plain decode (kernels.chain)
    assert host["ids_identical_all"] and host["device_step_ms"] > 0 and [c["k"] for c in host["chains"]] == [8, 16]


def test_fail_first_hybrid_chain_defect_exits_1(tmp_path, monkeypatch):
    """Plant: a replay's last id is not carried to the next replay: the chain's ids leave the plain run's and the
    bench exits 1 though every drafted run is lossless (a commit defect: tests/test_chain.py, on the state)."""
    from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

    real = FastQwen38Target._chain_pass

    def no_carry(self, k):
        first = self.chain.ids[:1].clone()
        real(self, k)
        self.chain.ids[:1].copy_(first)
    monkeypatch.setattr(FastQwen38Target, "_chain_pass", no_carry)
    res, rec = _bench(tmp_path, "qwen38-mtp", "--mtp-width", "2")
    assert res.exit_code == 1, res.output
    assert rec["ids_identical_all"] and not rec["host"]["ids_identical_all"]


def test_dflash2_bench_fewer_layers_and_block(tmp_path):
    res, rec = _bench(tmp_path, "qwen38-dflash2", "--layers", "3", "--block", "4")
    assert res.exit_code == 0, res.output
    assert rec["conditions"]["layers"] == 3 and rec["ids_identical_all"]
    assert [s["tau_nominal"] for s in rec["sweep"]] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert "criterion" not in rec                                        # tau 6 > B = 4: no criterion point


def test_fail_first_lossless_defect_exits_1(tmp_path, monkeypatch):
    """Plant: the loop keeps one proposal more than matched (emits a rejected draft): the assertion catches it."""
    real = speculative.kept_rows
    monkeypatch.setattr(speculative, "kept_rows", lambda p, a: min(real(p, a) + 1, len(p) + 1))
    res, rec = _bench(tmp_path, "qwen38-mtp")
    assert res.exit_code == 1, res.output
    assert rec["ids_identical_all"] is False and not all(s["ids_identical"] for s in rec["sweep"])


@pytest.mark.parametrize("args,needle", [
    (["qwen38-mtp", "--layers", "0"], "--layers 0"),
    (["qwen38-dflash2", "--block", "1"], "--block 1"),
    (["qwen3-dflash", "--shape", "qwen38-tiny"], "a hybrid shape runs"),
])
def test_named_errors_exit_2(tmp_path, args, needle):
    shape = [] if "--shape" in args else ["--shape", "qwen38-tiny"]
    res = CliRunner().invoke(app, ["bench", *args, *shape, "--device", "cpu"])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_hybrid_bench_needs_a_shape():
    res = CliRunner().invoke(app, ["bench", "qwen38-mtp", "--device", "cpu"])
    assert res.exit_code == 2 and "needs --shape" in res.output


def test_shape_numbers_and_read_bytes():
    s = HYBRID_SHAPES["qwen38-27b"]
    hy = s.hybrid()
    assert hy.layer_types.count("linear_attention") == 48 and hy.rotary_dim == 64 and hy.conv_dim == 10240
    t, mtp = random_qwen38(HYBRID_SHAPES["qwen38-tiny"], torch.device("cpu"), torch.bfloat16, layers=3)
    assert t.num_layers == 3 and t.hybrid.layer_types[-1] == "linear_attention"
    emb = t.tensors["model.embed_tokens.weight"]
    assert read_bytes(t) == weight_bytes(t.tensors) - emb.numel() * 2 + emb.shape[1] * 2
    d = random_dflash2(HYBRID_SHAPES["qwen38-tiny"], t, 4, torch.device("cpu"), torch.bfloat16)
    assert max(d.target_layer_ids) < 3 and "mtp.fc.weight" in mtp.tensors


def test_shape_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from bloomery_cli.results.plots import make_plots

    recs = []
    for name in ("qwen38-mtp", "qwen38-dflash2"):
        res, rec = _bench(tmp_path, name, *(["--block", "4"] if name == "qwen38-dflash2" else []))  # MTP: no block
        assert res.exit_code == 0, res.output
        recs.append((tmp_path / f"{name}.json", rec))
    names = make_plots(tmp_path, recs)
    shape = [n for n in names if n.startswith("plot-shape-qwen38-tiny")]
    assert len(shape) == 1 and (tmp_path / shape[0]).stat().st_size > 1000


def test_thread_rule():
    assert thread_count(None, {}) == 1
    assert thread_count(None, {"OMP_NUM_THREADS": "3"}) == 3
    assert thread_count(2, {"OMP_NUM_THREADS": "3"}) == 2
    for bad in ("0", "x"):
        with pytest.raises(InputError):
            thread_count(None, {"OMP_NUM_THREADS": bad})
    with pytest.raises(InputError):
        thread_count(0)


def test_threads_flag_bad_value_exits_2():
    res = CliRunner().invoke(app, ["gate", "run", "qwen38-mtp", "--threads", "0"])
    assert res.exit_code == 2 and "--threads" in res.output and "Traceback" not in res.output


def test_threads_flag_sets_torch(monkeypatch):
    from bloomery_cli.threads import apply_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert apply_threads(None) == 1 and torch.get_num_threads() == 1
        assert apply_threads(2) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_bench_runs_the_fast_hybrid_engine(tmp_path):
    res, rec = _bench(tmp_path, "qwen38-dflash2", "--block", "4")
    assert res.exit_code == 0, res.output
    assert rec["conditions"]["engine"] == "qwen38 fast ops=torch delta_rule=torch attention=torch graphs=off"
    assert rec["ids_identical_all"]


def test_engine_fallback_logs_each_failure_and_runs_the_next_path():
    from bloomery_cli.bench.hybrid_engines import build_hybrid_engines, engine_paths

    s, cpu = HYBRID_SHAPES["qwen38-tiny"], torch.device("cpu")
    t, mtp = random_qwen38(s, cpu, torch.float32, layers=2)
    assert engine_paths(torch.device("cuda")) == [("auto", "auto", True), ("auto", "torch", True),
                                                  ("torch", "torch", True), ("torch", "torch", False)]
    assert engine_paths(cpu) == [("torch", "torch", False)]
    lines = []
    target, draft, mode = build_hybrid_engines(t, None, mtp, cpu, torch.float32, 64, 4, 2, lines.append,
                                               paths=[("cupy", "auto", True), ("torch", "torch", False)])
    assert lines[0].startswith("engine impl=cupy attention=auto graphs=True failed: ValueError")
    assert "graphs=off" in mode and draft.width == 2
    with pytest.raises(RuntimeError, match="no hybrid engine path ran"):           # every path fails: named
        build_hybrid_engines(t, None, mtp, cpu, torch.float32, 64, 4, 2, lines.append, paths=[("cupy", "auto", False)])
