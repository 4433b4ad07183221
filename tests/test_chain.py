"""Plain decode with the host off the critical path (FastQwen3Target.decode_plain: K chained one-row steps, the
argmax fed forward on the device) gives the plain loop's ids; the bench's host-share line and its fail-closed exit."""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from bloomery_cli.bench import chain as bench_chain
from bloomery_cli.bench.command import bench_command
from bloomery_cli.bench.shapes import SHAPES, random_pair
from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target

CPU = torch.device("cpu")
PROMPT = list(range(5, 25))


@pytest.fixture(scope="module")
def spec():
    return random_pair(SHAPES["tiny"], CPU, torch.float32)[0]


def _plain(spec, n):
    t = FastQwen3Target(spec, CPU, torch.float32, 200)
    last, ids = t.prefill(PROMPT).argmax[-1], []
    for _ in range(n):
        o = t.verify([last])
        t.commit(1)
        last = o.argmax[0]
        ids.append(last)
    return ids, t


@pytest.mark.parametrize("k", [1, 3, 8])
def test_chain_equals_plain_loop(spec, k):
    ref, tref = _plain(spec, 30)
    t = FastQwen3Target(spec, CPU, torch.float32, 200)
    first = t.prefill(PROMPT).argmax[-1]
    got = t.decode_plain(first, 17, k)
    got += t.decode_plain(got[-1], 13, k)                  # a second call continues from the committed length
    assert got == ref and t.length == tref.length == len(PROMPT) + 30
    nxt = t.verify([got[-1]])                              # and the ordinary passes continue bit-equal
    assert torch.equal(nxt.taps, tref.verify([ref[-1]]).taps)


def test_chain_bad_input(spec):
    t = FastQwen3Target(spec, CPU, torch.float32, 40)
    first = t.prefill(PROMPT).argmax[-1]
    for n, k in ((4, 0), (4, 65), (500, 4)):
        with pytest.raises(ValueError):
            t.decode_plain(first, n, k)


def _skip_advance(self, k):                                # planted: the position never advances
    for j in range(k):
        self.forward(self.chain_ids[j:j + 1], self.chain_p0, None, self.logits_buf[:1], self.chain_ids[j + 1:j + 2])
    self.chain_ids[:1].copy_(self.chain_ids[k:k + 1])


def _no_carry(self, k):                                    # planted: the last id is not carried to the next replay
    for j in range(k):
        self.forward(self.chain_ids[j:j + 1], self.chain_p0, None, self.logits_buf[:1], self.chain_ids[j + 1:j + 2])
        self.chain_p0.add_(1)


def test_fail_first_position_defect_breaks_the_continuation(spec, monkeypatch):
    """The tiny shape's ids follow the token alone, so a position defect shows in the KV the next pass reads."""
    ref, tref = _plain(spec, 8)
    monkeypatch.setattr(FastQwen3Target, "_chain_pass", _skip_advance)
    t = FastQwen3Target(spec, CPU, torch.float32, 200)
    got = t.decode_plain(t.prefill(PROMPT).argmax[-1], 8, 4)
    assert not torch.equal(t.verify([got[-1]]).taps, tref.verify([ref[-1]]).taps)


def test_fail_first_chain_main_exits_1(tmp_path, monkeypatch):
    args = ["--shape", "tiny", "--device", "cpu", "--dtype", "f32", "--prompt-len", "16", "-n", "12", "--k", "4"]
    out = tmp_path / "c.json"
    assert bench_chain.main([*args, "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["host"]["ids_identical_all"] and rec["host"]["device_step_ms"] > 0
    monkeypatch.setattr(FastQwen3Target, "_chain_pass", _no_carry)
    assert bench_chain.main(args) == 1


def test_fail_first_bench_exits_1_when_chain_differs(tmp_path, monkeypatch):
    app = typer.Typer()
    app.command()(bench_command)
    monkeypatch.setattr(FastQwen3Target, "_chain_pass", _no_carry)
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--dtype", "f32",
                                   "--prompt-len", "16", "-n", "24", "--json", str(out)])
    assert res.exit_code == 1, res.output
    rec = json.loads(out.read_text())
    assert not rec["host"]["ids_identical_all"] and rec["host"]["host_share_plain"] < 1
