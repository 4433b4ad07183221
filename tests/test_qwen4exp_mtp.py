"""qwen4exp's MTP head (issue 25): the device draft held to the f64 reference (``reference.families.qwen4exp.mtp``) on a
random tiny checkpoint with the HF ``mtp.*`` layout (tests/qwen4exp_factory.py), the reader's named errors, and the
gate qwen4exp-mtp on the trained fixture with its FAIL-first plants in bf16: the head fed the mean of the streams
instead of the 4 raw streams, or post-norm streams / the post-norm collapse instead of the raw (pre-norm) streams.

Bands: kernel against reference in float32 on a random checkpoint, 1e-5 relative (float32 rounding through 4 layers
and the head, measured about 5e-7); the gate's own lines use the bands of ``bloomery_cli.bands``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gate_run import failed, mtp_router_off, run_named
from qwen4exp_factory import make_qwen4exp, make_qwen4exp_mtp
from safetensors.torch import load_file, save_file

from bloomery_cli.families.qwen4exp.reader_mtp_hf import load_qwen4exp_mtp
from bloomery_gates.errors import BadTensor, InputError
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.families.qwen4exp import mtp as kmtp
from bloomery_gates.kernels.families.qwen4exp.model import Qwen4ExpTarget
from bloomery_gates.kernels.ops import gated_hc as khc
from bloomery_gates.reference.families.qwen4exp import model as rq
from bloomery_gates.reference.families.qwen4exp import mtp as rmtp

FIXTURE = (FIXTURES / "qwen4exp-tiny").is_dir()
F32_BAND = 1e-5


def token_ids(seed: int = 1, n: int = 24) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(2, 300, n)]


def rel(a, b) -> float:
    a = a.double().numpy() if torch.is_tensor(a) else a
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen4exp-mtp") / "ck"
    spec = make_qwen4exp_mtp(d)
    return spec, load_qwen4exp_mtp(d, spec)


def test_reader_reads_the_head_and_borrows_the_head_matrices(ckpt):
    spec, mtp = ckpt
    assert mtp.borrows and mtp.block == spec.num_layers and mtp.hc == spec.hc and mtp.moe == spec.moe
    assert mtp.tensors["mtp.pre_fc_norm_hidden.weight"].shape == (spec.hc.count * spec.hidden_size,)
    assert not any(n.startswith("model.") for n in mtp.tensors)


def test_reader_named_errors(tmp_path, ckpt):
    spec, _ = ckpt
    bare = make_qwen4exp(tmp_path / "bare")
    with pytest.raises(BadTensor, match="mtp"):
        load_qwen4exp_mtp(tmp_path / "bare", bare)
    d = tmp_path / "stray"
    make_qwen4exp_mtp(d)
    state = load_file(str(d / "model.safetensors"))
    state["mtp.layers.0.input_layernorm.weight"] = torch.zeros(spec.hidden_size)      # a block norm: not this head
    save_file(state, str(d / "model.safetensors"))
    from bloomery_cli.families.qwen4exp.reader import qwen4exp_from_hf
    with pytest.raises(BadTensor, match="input_layernorm"):
        load_qwen4exp_mtp(d, qwen4exp_from_hf(d))
    with pytest.raises(InputError, match="no such file"):
        load_qwen4exp_mtp(tmp_path / "absent", spec)


def test_cli_draft_without_a_head_is_exit_2(tmp_path):
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    make_qwen4exp(tmp_path / "bare", vocab_size=4096)
    r = CliRunner().invoke(app, ["gate", "run", "qwen4exp-mtp", "--target", str(tmp_path / "bare"), "--draft",
                                 str(tmp_path / "bare"), "-n", "4"])
    assert r.exit_code == 2 and "mtp" in r.output and "Traceback" not in r.output, r.output


def test_draft_and_store_match_reference_f32(ckpt):
    """The drafted rows (output streams, logits, ids) after a prompt and after a verify with a partial accept, and
    the store's real rows, against the reference on the engine's own streams."""
    spec, mtp = ckpt
    ids = token_ids()
    eng = Qwen4ExpTarget(spec, "cpu", torch.float32, 64)
    d = kmtp.Qwen4ExpMTPDraft(mtp, eng, 64)
    p = eng.prefill(ids[:16])
    d.prompt(p.taps)
    streams = p.taps[-1].double().numpy()
    got = d.propose(p.argmax[-1], detail=True)
    ref = rmtp.draft(mtp, spec, ids[:16], streams, p.argmax[-1], 3, chain_ids=got.ids)
    assert rel(got.layer_out[0], ref.layer_out) < F32_BAND and rel(got.logits, ref.logits) < F32_BAND
    assert got.ids == [int(i) for i in ref.ids]
    rows = [p.argmax[-1], got.ids[0], (got.ids[1] + 1) % spec.vocab_size, 5]          # a planted reject
    v = eng.verify(rows)
    kept = 1
    while kept < len(rows) and rows[kept] == v.argmax[kept - 1]:
        kept += 1
    eng.commit(kept)
    d.accept(kept, v.taps)
    seq = ids[:16] + rows[:kept]
    anchor = v.argmax[kept - 1]
    got2 = d.propose(anchor, detail=True)
    full = rq.forward(spec, seq + [anchor])
    ref2 = rmtp.draft(mtp, spec, seq, full.hidden[-1][:len(seq)], anchor, 3, chain_ids=got2.ids)
    assert rel(got2.logits, ref2.logits) < 1e-4                     # the engine's streams vs a fresh f64 run
    k, _ = d.store_rows()
    rk, _ = rmtp.store_rows(mtp, spec, seq + [anchor], full.hidden[-1])
    assert k.shape[1] == len(seq) and rel(k.transpose(0, 1), rk) < 1e-4


def test_teacher_forced_rows_are_the_draft_rows(ckpt):
    """Row T of a teacher-forced run over ids + [anchor] is the draft's first row (one definition of the head)."""
    spec, mtp = ckpt
    ids = token_ids(3, 12)
    full = rq.forward(spec, ids + [7])
    tf = rmtp.teacher_forced(mtp, spec, ids + [7], full.hidden[-1])
    dr = rmtp.draft(mtp, spec, ids, full.hidden[-1][:len(ids)], 7, 1)
    assert np.array_equal(tf.logits[-1], dr.logits[0])


# --------------------------------------------------------------------------------- the gate, FAIL-first (bf16)

needs_fixture = pytest.mark.skipif(not FIXTURE, reason="fixtures/qwen4exp-tiny not built "
                                   "(python -m bloomery_cli.families.qwen4exp.fixture --out fixtures)")


def gate(**kw):
    return run_named("qwen4exp-mtp", 32, 2, **kw)


def _wrong_hidden(kind: str, spec):
    """What a defective engine hands the head instead of the raw streams taps[L] [R, S*H]."""
    t, s, h, eps = spec.tensors, spec.hc.count, spec.hidden_size, spec.layer.rms_eps
    mixer = "model.hyper_connection_mixer."

    def plant(taps):
        x = taps[-1]
        if kind == "mean":                                          # the streams mean-pooled first
            return x.unflatten(-1, (s, h)).float().mean(-2).to(x.dtype).repeat(1, s)
        w = t[mixer + "hc_norm.weight"].to(x.dtype)
        if kind == "post-norm streams":                             # after the final (mixer's) grouped norm
            return khc.grouped_norm(x, w, h, eps)
        f = khc.gated_residual(x, w, t[mixer + "input_mix_weight_down.weight"].to(x.dtype),
                               t[mixer + "input_mix_weight_up.weight"].to(x.dtype), None, s, eps).block_in
        return f.repeat(1, s)                                       # the head's input (post-norm), as Qwen3.5's MTP
    return plant


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A random checkpoint over the fixtures' 4096-id vocabulary (the gate's prompts), streams kept apart by the
    factory's draws: the gate's MTP lines are sensitive to the hidden the head is fed without any trained fixture."""
    d = tmp_path_factory.mktemp("qwen4exp-wide") / "ck"
    return make_qwen4exp_mtp(d, vocab_size=4096, indexer_budget=16, indexer_compress_ratio=4), d


@pytest.mark.parametrize("kind", [None, "mean", "post-norm streams", "post-norm collapse"])
def test_mtp_lines_fail_the_wrong_hidden_on_a_random_checkpoint_bf16(monkeypatch, wide, kind):
    """Random weights accept nothing, so the verdict is FAIL for every run ((b)); the line under test is the first
    drafted row's output streams: PASS with the raw streams, FAIL with each planted hidden."""
    spec, d = wide
    if kind is not None:
        monkeypatch.setattr(kmtp, "target_streams", _wrong_hidden(kind, spec))
    code, lines = run_named("qwen4exp-mtp", 8, 1, target=d, draft=d, dtype="bf16")
    row = [line for line in lines if line.startswith("(r) mtp row 1 output streams")]
    assert code == 1 and len(row) == 1, "\n".join(lines)
    assert row[0].endswith(" PASS" if kind is None else " FAIL"), "\n".join(lines)


@needs_fixture
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gate_control_passes(dtype):
    code, lines = gate(dtype=dtype)
    assert code == 0, "\n".join(lines)
    assert "ids identical 32" in lines and any("chosen experts" in line for line in lines)
    routers = [line for line in lines if line.startswith("(r) mtp: draft routing of chained row ")]
    assert len(routers) == 3 and all(line.endswith(" PASS") for line in routers), "\n".join(lines)


@needs_fixture
def test_gate_fails_the_mtp_router_off_bf16(monkeypatch):
    """The MTP block's own router one expert off: its choice lines FAIL in bf16, no target line does."""
    mtp_router_off(monkeypatch)
    code, lines = gate(dtype="bf16")
    assert code == 1 and failed(lines, "(r) mtp: draft routing of chained row 0"), "\n".join(lines)
    assert not any(line.startswith("(r) target") and line.endswith(" FAIL") for line in lines), "\n".join(lines)


@needs_fixture
@pytest.mark.parametrize("kind", ["mean", "post-norm streams", "post-norm collapse"])
def test_gate_fails_head_fed_the_wrong_hidden_bf16(monkeypatch, kind):
    from bloomery_cli.loading import load_target

    monkeypatch.setattr(kmtp, "target_streams", _wrong_hidden(kind, load_target(FIXTURES / "qwen4exp-tiny")))
    code, lines = gate(dtype="bf16")
    assert code == 1 and failed(lines, "(r) mtp row 1 output streams"), "\n".join(lines)
    assert failed(lines, "(r) state after"), "\n".join(lines)                 # the store's rows too
