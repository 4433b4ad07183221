"""--tp 2 on the CPU: two gloo processes (this one as rank 0 and one worker). The split target's logits equal the
one-process engine's within the derived f32 band; the gate stays lossless; a dropped o_proj all-reduce fails it;
bad splits are refused (exit 2); workers never outlive their gate, and a dead peer raises instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from gate_run import run_named
from typer.testing import CliRunner

from bloomery_cli.bands import logits_band, worst_rel
from bloomery_cli.cli import app
from bloomery_cli.loading import load_target
from bloomery_cli.parallel.tp import TPQwen3Target, closing
from bloomery_cli.prompts import read_prompts
from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS
from bloomery_gates.kernels.families.qwen3 import tp as qwen3_tp
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target

TARGET = FIXTURES / "qwen3-tiny"
pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch has no gloo backend")


def np64(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def gone(proc: subprocess.Popen | int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if isinstance(proc, int):
            try:
                os.kill(proc, 0)
            except ProcessLookupError:
                return True
            # a zombie of a dead parent is reaped by init; treat a zombie as gone
            try:
                with open(f"/proc/{proc}/stat") as f:
                    if f.read().split()[2] == "Z":
                        return True
            except FileNotFoundError:
                return True
        elif proc.poll() is not None:
            return True
        time.sleep(0.2)
    return False


def test_logits_and_kv_equal_the_one_process_engine_within_the_f32_band():
    spec = load_target(TARGET)
    prompts = read_prompts(PROMPTS, None, 3, vocab=spec.vocab_size)
    max_len = max(len(p) for p in prompts) + 16
    one = Qwen3Target(spec, "cpu", torch.float32, max_len, rows=8)
    with closing():
        tp = TPQwen3Target(spec, torch.device("cpu"), torch.float32, max_len, 8, 2, TARGET)
        for p in prompts:
            want, got = one.prefill(p, logits=True), tp.prefill(p, logits=True)
            band = logits_band("f32", spec.layer, spec.num_layers, len(p))
            assert worst_rel(np64(got.logits), np64(want.logits)) <= band.value
            ids = [want.argmax[-1], *range(5, 12)]
            want, got = one.verify(ids, logits=True), tp.verify(ids, logits=True)
            assert worst_rel(np64(got.logits), np64(want.logits)) <= band.value
            assert got.argmax == want.argmax
            one.commit(3)
            tp.commit(3)
            for layer in (0, spec.num_layers - 1):
                for a, b in zip(tp.kv_rows(layer), one.kv_rows(layer), strict=True):
                    assert a.shape == b.shape
                    assert worst_rel(np64(a), np64(b)) <= band.value
        workers = list(tp.workers)
    assert all(gone(w, 30) for w in workers)
    assert not torch.distributed.is_initialized()


def test_gate_passes_split_over_two_processes():
    code, lines = run_named("qwen3-dflash", n=32, prompts=2, tp=2)
    assert code == 0, "\n".join(lines)
    assert any(line.startswith("load ") and "tp=2 backend=gloo" in line for line in lines)
    assert "ids identical 32" in lines
    assert any(line.startswith("(b)") and line.endswith("PASS") for line in lines)


def test_a_dropped_o_proj_all_reduce_fails_the_gate(monkeypatch):
    """FAIL-first: rank 0 still joins o_proj's all-reduce but keeps its own partial (the other heads' share lost)."""
    def dropped(x, group=None):
        qwen3_tp.all_reduce_f32(x.clone(), group)
        return x
    monkeypatch.setattr(qwen3_tp, "reduce_attn", dropped)
    seen = recorded_workers(monkeypatch)
    code, lines = run_named("qwen3-dflash", n=16, prompts=1, tp=2)
    assert code == 1
    assert any(line.startswith("(r) target layer 0 out") and line.endswith("FAIL") for line in lines)
    assert seen and all(gone(w, 30) for w in seen)            # a failed gate leaves no worker behind


@pytest.mark.parametrize("gate,tp,needle", [("qwen3-dflash", 3, "num_key_value_heads=2 does not divide by --tp 3"),
                                            ("qwen38-mtp", 2, "tensor parallel runs the qwen3 family only"),
                                            ("qwen3-dflash", 0, "expected a process count >= 1")])
def test_bad_tp_is_refused(gate, tp, needle):
    r = CliRunner().invoke(app, ["gate", "run", gate, "--tp", str(tp), "-n", "8"], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output and needle in r.output and "Traceback" not in r.output


def test_a_dead_worker_raises_instead_of_hanging(monkeypatch):
    monkeypatch.setenv("BLOOMERY_TP_TIMEOUT", "20")
    spec = load_target(TARGET)
    with closing():
        tp = TPQwen3Target(spec, torch.device("cpu"), torch.float32, 64, 8, 2, TARGET)
        tp.prefill([1, 2, 3])
        tp.workers[0].kill()
        tp.workers[0].wait()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            tp.verify([4, 5])
        assert time.monotonic() - t0 < 25


DRIVER = """
import os, sys, torch
from pathlib import Path
from bloomery_cli.loading import load_target
from bloomery_cli.parallel.tp import TPQwen3Target
t = Path(sys.argv[1])
tp = TPQwen3Target(load_target(t), torch.device("cpu"), torch.float32, 64, 8, 2, t)
tp.prefill([1, 2, 3])
print(tp.workers[0].pid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_workers_exit_when_rank_0_dies():
    """Rank 0 killed (no close, no exit handler): the worker sees its command pipe end and exits."""
    p = subprocess.run([sys.executable, "-c", DRIVER, str(TARGET)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert gone(int(p.stdout.split()[0]), 30)


def recorded_workers(monkeypatch) -> list[subprocess.Popen]:
    """Every worker process a TP engine starts during the test."""
    seen: list[subprocess.Popen] = []
    real = TPQwen3Target.close

    def close(self):
        seen.extend(self.workers)
        real(self)
    monkeypatch.setattr(TPQwen3Target, "close", close)
    return seen


def test_workers_exit_when_the_gate_raises(monkeypatch):
    import bloomery_cli.gate as gate

    seen = recorded_workers(monkeypatch)

    def broken(*a, **k):
        raise KeyError("planted: the gate raised after the runs")
    monkeypatch.setattr(gate, "check_state", broken)
    with pytest.raises(KeyError):
        run_named("qwen3-dflash", n=8, prompts=1, tp=2)
    assert seen and all(gone(w, 30) for w in seen)
    assert not torch.distributed.is_initialized()


def test_plain_only_states_the_split():
    code, lines = run_named("qwen3-dflash", n=8, prompts=1, tp=2, draft_policy="off")
    assert code == 0
    assert any(line.startswith("load draft=off") and "tp=2 backend=gloo" in line for line in lines)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="TP over NCCL needs 2 CUDA devices")
def test_gate_passes_split_over_two_cards():
    code, lines = run_named("qwen3-dflash", n=32, prompts=2, device="cuda", dtype="bf16", tp=2)
    assert code == 0, "\n".join(lines)
    assert any(line.startswith("load ") and "tp=2 backend=nccl" in line for line in lines)
    assert "ids identical 32" in lines


def test_a_stalled_worker_hits_the_process_group_timeout(monkeypatch):
    """A worker alive but silent (SIGSTOP): rank 0's next collective ends at the process group's timeout."""
    monkeypatch.setenv("BLOOMERY_TP_TIMEOUT", "5")
    spec = load_target(TARGET)
    with closing():
        tp = TPQwen3Target(spec, torch.device("cpu"), torch.float32, 64, 8, 2, TARGET)
        tp.prefill([1, 2, 3])
        w = tp.workers[0]
        os.kill(w.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            tp.verify([4, 5])
        assert 4 < time.monotonic() - t0 < 30
    assert gone(w, 30)                        # close killed it past the timeout


def test_a_worker_that_cannot_start_is_a_named_error(tmp_path):
    from bloomery_gates.errors import InputError

    spec = load_target(TARGET)
    t0 = time.monotonic()
    with closing(), pytest.raises(InputError, match="worker rank 1 did not start"):
        TPQwen3Target(spec, torch.device("cpu"), torch.float32, 64, 8, 2, tmp_path / "missing")
    assert time.monotonic() - t0 < 60
    assert not torch.distributed.is_initialized()
