"""``bloomery bench``'s device-accept rows (``bloomery_cli.bench.accept``): one beside every drafted host row, with
the reference's ids; a planted defect in the device loop (kept off by one) makes the bench exit 1, as does a device
loop that did not run; the cost policy skips it and says so."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bloomery_cli.bench import accept as bench_accept
from bloomery_cli.cli import app
from bloomery_gates.kernels import accept as kaccept

QWEN3 = ["qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--dtype", "bf16", "--prompt-len", "16", "-n", "24"]
MTP = ["qwen38-mtp", "--shape", "qwen38-tiny", "--device", "cpu", "--dtype", "bf16", "--prompt-len", "8", "-n", "16"]


def _bench(tmp_path, args):
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, ["bench", *args, "--json", str(out)])
    return res, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("args", [QWEN3, MTP], ids=["qwen3-dflash", "qwen38-mtp"])
def test_device_rows_beside_the_host_rows(tmp_path, args):
    res, rec = _bench(tmp_path, args)
    assert res.exit_code == 0, res.output
    dev, host = rec["device_accept"], rec["sweep"]
    assert len(dev) == len(host) > 0 and all(d["ids_identical"] for d in dev)
    assert all(d["windows_identical"] and d["accept_mean"] == h["accept_mean"] for d, h in zip(dev, host, strict=True))
    assert all(d["tok_s"] > 0 and d["frac_of_bound"] > 0 for d in dev)
    assert sum("device_accept a=" in line for line in rec["lines"]) == len(host)


def test_fail_first_kept_off_by_one_exits_1(tmp_path, monkeypatch):
    real = kaccept.DeviceAccept._kept
    monkeypatch.setattr(kaccept.DeviceAccept, "_kept", lambda self, a, r: (real(self, a, r) + 1).clamp(max=r))
    res, rec = _bench(tmp_path, MTP)
    assert res.exit_code == 1, res.output
    assert "device-accept" in res.output and rec["ids_identical_all"]          # the host loop is untouched


def test_fail_first_device_loop_that_cannot_run_exits_1(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_accept, "device_hooks", lambda draft: (_ for _ in ()).throw(ValueError("no hooks")))
    res, rec = _bench(tmp_path, QWEN3)
    assert res.exit_code == 1, res.output
    assert rec["device_accept"] == [] and "no hooks" in rec["device_accept_error"]


def test_cost_policy_skips_the_device_loop(tmp_path):
    res, rec = _bench(tmp_path, [*QWEN3, "--width", "cost"])
    assert res.exit_code == 0, res.output
    assert rec["device_accept"] == [] and "fixed width only" in rec["device_accept_skipped"]


def test_measured_real_draft_on_the_device():
    """The gate's checkpoints (qwen3-tiny fixtures): the real DFlash draft in the device loop, its windows the host
    loop's (the same acceptance), its ids the plain run's; planted wrong ids fail the verdict."""
    from bloomery_cli.bench.command import bench

    rec = bench("qwen3-dflash", None, "cpu", "f32", n=32, hf_tokens=4, taus=(8.0,), emit=lambda line: None,
                quiet=True)
    dm, m = rec["device_measured"], rec["measured"]
    assert dm["ids_identical"] and dm["accept_mean"] == m["accept_mean"] > 1 and dm["tok_s"] > 0
    assert bench_accept.device_ok(rec)
    rec["device_measured"]["ids_identical"] = False
    assert not bench_accept.device_ok(rec)


def test_the_criterion_is_judged_over_the_chained_plain_decode():
    """With the chain's tok/s known, ``met`` is judged on frac_of_bound_chain (both sides without the host's round
    trip); over the plain loop alone a row 5% past the chain-basis threshold's miss would read as met."""
    sweep = bench_accept.DeviceSweep.__new__(bench_accept.DeviceSweep)
    sweep.synth, sweep.warm, sweep.rows = type("S", (), {"load": lambda *a: None})(), True, 4

    class Run:
        ids, windows = [1, 2, 3, 4], [([2, 3, 4], 4)]
        emitted = ids
    sweep.timed = lambda prompt, n: (Run(), 400.0, 0.0, {})      # accept_mean 4, 400 tok/s, no first propose
    host = {"tok_s": 380.0, "tau_x_plain_frac": 0.9}
    args = ([0], [1, 2, 3, 4], 4, 0.9, 0, 100.0, host, Run.windows, {"frac_max": 1.0})
    sweep.chain_tok_s = None
    plain = sweep.row(*args, log=lambda s: None)                 # 400 / (4 x 100) = 1.0 of the bound
    sweep.chain_tok_s = 110.0
    chained = sweep.row(*args, log=lambda s: None)               # 400 / (4 x 110) = 0.909 of the bound
    assert plain["met"] and plain["frac_of_bound"] == 1.0
    assert chained["frac_of_bound_chain"] == pytest.approx(400 / 440) and not chained["met"]
    # the first propose's share is reported, and the windows-only ratio beside it; ``met`` stays the whole run's
    sweep.timed = lambda prompt, n: (Run(), 400.0, 0.1, {})
    shared = sweep.row(*args, log=lambda s: None)
    assert shared["first_propose_share"] == 0.1
    assert shared["windows_frac_of_bound_chain"] == pytest.approx(400 / 440 / 0.9)
    assert shared["windows_frac_of_bound_chain"] > 1.0
    assert shared["frac_of_bound_chain"] == pytest.approx(400 / 440) and not shared["met"]


def test_the_ratio_counts_the_last_window_as_accept_mean_does():
    """A run of n ids drops its last window's ids past n; accept_mean counts them, so the judged ratio takes the rate
    the windows emitted ids at (``bench.common.window_tok_s``), not the n kept ids' (which measured the cut)."""
    from bloomery_cli.bench.common import window_tok_s
    sweep = bench_accept.DeviceSweep.__new__(bench_accept.DeviceSweep)
    sweep.synth, sweep.warm, sweep.rows, sweep.chain_tok_s = type("S", (), {"load": lambda *a: None})(), True, 4, 100.0

    class Run:                          # n = 6: the first id and 5 of the two windows' 8 (3 dropped)
        ids, emitted = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9]
        windows = [([2, 3, 4], 4), ([6, 7, 8], 4)]
    sweep.timed = lambda prompt, n: (Run(), 300.0, 0.0, {})      # 5 kept ids at 300 tok/s: the windows' 8 at 480
    host = {"tok_s": 280.0, "tau_x_plain_frac": 0.7}
    row = sweep.row([0], Run.ids, 6, 0.9, 0, 100.0, host, Run.windows, {"frac_max": 1.0}, log=lambda s: None)
    assert window_tok_s(300.0, Run) == pytest.approx(480.0) and row["tok_s_windows"] == pytest.approx(480.0)
    assert row["tok_s"] == 300.0                                   # what the user waited for, reported as it was
    assert row["frac_of_bound_chain"] == pytest.approx(480 / (4 * 100))   # 0.75 over the kept ids: the cut


def test_timeline_splits_a_run_into_windows_start_bubbles_and_the_tail():
    """The device run's timeline from its events (fakes at known device times): ends 7, 13, 19, 25.5 ms after the
    start, the host clock 26.2 ms -> windows of 6 ms, the first 1 ms late, 0.5 ms of bubbles, 0.7 ms after the last."""
    class Ev:
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, other):
            return other.t - self.t

    t = bench_accept.timeline(Ev(0.0), [Ev(x) for x in (7.0, 13.0, 19.0, 25.5)], 26.2)
    assert t == pytest.approx({"window_ms": 6.0, "start_extra_ms": 1.0, "bubbles_ms": 0.5, "after_last_ms": 0.7})
    t = bench_accept.timeline(Ev(0.0), [Ev(x) for x in (7.0, 13.0, 19.0, 25.5)], 26.2, Ev(0.4), Ev(25.9))
    assert t["setup_ms"] == pytest.approx(0.4) and t["host_tail_ms"] == pytest.approx(0.4)
