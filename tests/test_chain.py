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
    c = self.chain
    for j in range(k):
        self.forward(c.ids[j:j + 1], c.p0, None, self.logits_buf[:1], c.ids[j + 1:j + 2])
    c.ids[:1].copy_(c.ids[k:k + 1])


def _no_carry(self, k):                                    # planted: the last id is not carried to the next replay
    c = self.chain
    for j in range(k):
        self.forward(c.ids[j:j + 1], c.p0, None, self.logits_buf[:1], c.ids[j + 1:j + 2])
        c.p0.add_(1)


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


# ---- the hybrid engine (FastQwen38Target): a committed step also advances the DeltaNet state and the conv tail ----

def _hybrid():
    from test_qwen38 import FULL, LIN, make_qwen38

    from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

    spec = make_qwen38(types=(LIN, FULL, LIN, LIN, FULL), nk=2, nv=4, dk=8)
    return spec, lambda: FastQwen38Target(spec, CPU, torch.float32, 200, impl="torch")


def _hybrid_plain(make, prompt, n):
    t = make()
    last, ids = t.prefill(prompt).argmax[-1], []
    for _ in range(n):
        o = t.verify([last])
        t.commit(1)
        last = o.argmax[0]
        ids.append(last)
    return ids, t


def _same_state(a, b) -> bool:
    return torch.equal(a.state, b.state) and torch.equal(a.conv_tail, b.conv_tail) and a.length == b.length


@pytest.mark.parametrize("k", [1, 3, 8])
def test_hybrid_chain_equals_plain_loop(k):
    """17 + 13 ids in chains of k (n not a multiple of k: the last replay is shorter, so the recurrent state never
    runs past the n-th id): the plain loop's ids, its DeltaNet states and conv tails bit for bit, and the next
    ordinary pass equal."""
    spec, make = _hybrid()
    prompt = [i % spec.vocab_size for i in range(5, 25)]
    ref, tref = _hybrid_plain(make, prompt, 30)
    t = make()
    got = t.decode_plain(t.prefill(prompt).argmax[-1], 17, k)
    got += t.decode_plain(got[-1], 13, k)
    assert got == ref and _same_state(t, tref)
    assert torch.equal(t.verify([got[-1]]).taps, tref.verify([ref[-1]]).taps)


@pytest.mark.parametrize("plant", ["state", "tail"])
def test_fail_first_hybrid_chain_without_commit_diverges(monkeypatch, plant):
    """Planted: the chain's steps run the pass but do not commit it: the pass's recurrence does not write the state
    (state), or the conv tail is not shifted (tail)."""
    from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

    spec, make = _hybrid()
    prompt = [i % spec.vocab_size for i in range(5, 25)]
    ref, tref = _hybrid_plain(make, prompt, 12)
    t = make()
    if plant == "tail":
        monkeypatch.setattr(FastQwen38Target, "_commit_tail", lambda self, kept: None)
    else:
        real = t.recur
        t.recur = lambda *a, store=True, **k: real(*a[:6], store=False, **k)       # outputs only, always
    got = t.decode_plain(t.prefill(prompt).argmax[-1], 12, 4)
    assert not _same_state(t, tref)
    assert got != ref or not torch.equal(t.verify([got[-1]]).taps, tref.verify([ref[-1]]).taps)


def test_fail_first_hybrid_chain_overshoot_moves_the_state(monkeypatch):
    """Planted: every replay runs the full K steps (the last one past the n-th id), as the attention-only chain
    could afford: the committed recurrent state is then K - n % K steps ahead."""
    from bloomery_gates.kernels import chain as kchain

    spec, make = _hybrid()
    prompt = [i % spec.vocab_size for i in range(5, 25)]
    _, tref = _hybrid_plain(make, prompt, 10)
    real = kchain.decode_plain

    def overshoot(engine, first, n, k):
        out = real(engine, first, -(-n // k) * k, k)
        engine.length -= -(-n // k) * k - n
        return out[:n]

    monkeypatch.setattr("bloomery_gates.kernels.families.qwen38.fast.decode_plain", overshoot)
    t = make()
    t.decode_plain(t.prefill(prompt).argmax[-1], 10, 4)
    assert not _same_state(t, tref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("engine", ["qwen3", "qwen38"])
def test_chain_graphs_on_cuda_equal_plain_loop(engine):
    """On CUDA the chain is captured (its warm-ups advance the hybrid's state, which the capture puts back) and
    replayed: the ids, and the hybrid's state and tail, equal the graphed verify + commit loop's."""
    cuda = torch.device("cuda")
    if engine == "qwen3":
        spec = random_pair(SHAPES["tiny"], CPU, torch.float32)[0]

        def make():
            return FastQwen3Target(spec, cuda, torch.float32, 200)
    else:
        from test_qwen38 import FULL, LIN, make_qwen38

        from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target
        spec = make_qwen38(types=(LIN, FULL, LIN, LIN, FULL), nk=2, nv=4, dk=8)

        def make():
            return FastQwen38Target(spec, cuda, torch.float32, 200)
    prompt = [i % spec.vocab_size for i in range(5, 25)]
    ref, tref = _hybrid_plain(make, prompt, 30)
    t = make()
    got = t.decode_plain(t.prefill(prompt).argmax[-1], 17, 8)
    got += t.decode_plain(got[-1], 13, 8)
    assert got == ref and t.length == tref.length
    if engine == "qwen38":
        assert _same_state(t, tref)
