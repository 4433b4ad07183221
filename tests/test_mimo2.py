"""The mimo2 family (MiMo-V2-Flash) and its 3-layer MTP head: the reader's two spellings of the config and its named
refusals, kernel vs f64 reference (sinks, sliding window, value scale, routed experts, the MTP chain and its stores,
both hidden conventions), tier 3 against transformers where it imports, and the gate on the trained fixture with
planted defects (FAIL-first: each must turn it red)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from gate_run import failed, run_named
from mimo2_factory import SHAPE, write
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.loading import load_mimo2_mtp, load_target
from bloomery_gates.errors import BadConfig, BadTensor, Refused
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.families.mimo2 import model as kfam
from bloomery_gates.kernels.families.mimo2 import mtp as kmtp
from bloomery_gates.reference.families.mimo2 import model as rfam
from bloomery_gates.reference.families.mimo2 import mtp as rmtp

PROMPT = [int(x) for x in np.random.default_rng(0).integers(0, 512, 20)]
HF = importlib.util.find_spec("transformers") is not None
FIXTURE = (FIXTURES / "mimo2-tiny").is_dir()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = write(tmp_path_factory.mktemp("mimo2") / "m")
    t = load_target(d)
    return t, load_mimo2_mtp(d, t)


# ------------------------------------------------------------------------------------------------ reader


def test_reader_reads_both_spellings_alike(tmp_path, ckpt):
    hf_only = ("hybrid_layer_pattern", "moe_layer_freq", "sliding_window_size", "layernorm_epsilon", "rope_theta",
               "swa_rope_theta", "partial_rotary_factor", "swa_num_attention_heads", "swa_num_key_value_heads",
               "swa_head_dim", "swa_v_head_dim", "add_swa_attention_sink_bias", "add_full_attention_sink_bias")
    native_only = ("layer_types", "mlp_layer_types", "sliding_window", "rms_norm_eps", "rope_parameters")
    for drop in (hf_only, native_only):
        t = load_target(write(tmp_path / str(len(drop)), edit=lambda c, drop=drop: [c.pop(k) for k in drop]))
        assert (t.layer, t.mimo) == (ckpt[0].layer, ckpt[0].mimo)
    m = ckpt[0].mimo
    assert m.swa.window == SHAPE.window and m.swa.num_kv_heads == 2 * m.full.num_kv_heads and m.swa.sinks
    assert not m.full.sinks and m.mtp_layers == 3 and m.swa.rope_theta != m.full.rope_theta


@pytest.mark.parametrize("edit,key", [
    (lambda c: c.update(sliding_window_size=c["sliding_window"]), "sliding_window"),    # off by one: HF = own + 1
    (lambda c: c.update(hybrid_layer_pattern=[0, 0, 1, 0]), "hybrid_layer_pattern"),
    (lambda c: [c.pop("layer_types"), c.pop("hybrid_layer_pattern")], "layer_types"),   # no silent default
    (lambda c: [c.pop("mlp_layer_types"), c.pop("moe_layer_freq")], "mlp_layer_types"),
    (lambda c: [c.pop("sliding_window"), c.pop("sliding_window_size")], "sliding_window_size"),
    (lambda c: c.update(swa_num_key_value_heads=1), "swa_num_key_value_heads"),
    (lambda c: c.update(swa_rope_theta=1.0), "swa_rope_theta"),
    (lambda c: c.update(layernorm_epsilon=1e-3), "layernorm_epsilon"),
])
def test_reader_refuses_disagreeing_or_missing_keys(tmp_path, edit, key):
    with pytest.raises(BadConfig, match=f"key {key}"):
        load_target(write(tmp_path / "m", edit=edit))


def test_reader_named_tensor_errors(tmp_path):
    with pytest.raises(BadTensor, match="attention_sink_bias"):
        load_target(write(tmp_path / "a", drop=("model.layers.1.self_attn.attention_sink_bias",)))
    d = write(tmp_path / "b", drop=tuple(f"model.mtp.layers.{k}.{n}" for k in range(3) for n in
                                         ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight",
                                          "input_layernorm.weight", "pre_mlp_layernorm.weight",
                                          "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                          "self_attn.attention_sink_bias", "mlp.gate_proj.weight",
                                          "mlp.up_proj.weight", "mlp.down_proj.weight")))
    with pytest.raises(BadTensor, match="no MTP layers"):
        load_mimo2_mtp(d, load_target(d))
    d = write(tmp_path / "c", drop=("model.mtp.layers.2.final_layernorm.weight",))
    with pytest.raises(BadTensor, match="model.mtp.layers.2.final_layernorm.weight"):
        load_mimo2_mtp(d, load_target(d))


def test_cli_bad_key_is_exit_2(tmp_path):
    d = write(tmp_path / "m", edit=lambda c: c.update(sliding_window_size=c["sliding_window"]))
    r = CliRunner().invoke(app, ["gate", "run", "mimo2-mtp", "--target", str(d), "--draft", str(d), "-n", "4"])
    assert r.exit_code == 2 and "sliding_window" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["gate", "run", "mimo2-mtp", "--target", str(d), "--mtp-hidden", "middle"])
    assert r.exit_code == 2 and "--mtp-hidden" in r.output


# ---------------------------------------------------------------------------------------- kernel vs reference


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - b).max() / np.abs(b).max())


def test_engine_matches_reference(ckpt):
    t, _ = ckpt
    eng = kfam.Mimo2Target(t, "cpu", torch.float64, 64, rows=4)
    got = eng.prefill(PROMPT, logits=True)
    ref = rfam.forward(t, PROMPT)
    assert rel(got.logits.numpy(), ref.logits) < 1e-5
    assert sorted(eng.routings) == [1, 2, 3]


@pytest.mark.parametrize("plant", ["sinks", "window", "value_scale"])
def test_reference_sees_each_attention_part(ckpt, plant, monkeypatch):
    """Each part changes the logits: a reference that dropped it could not agree with the engine."""
    t, _ = ckpt
    want = rfam.forward(t, PROMPT).logits
    orig = kfam.sink_attention
    if plant == "sinks":
        monkeypatch.setattr(kfam, "sink_attention", lambda q, k, v, a, z: orig(q, k, v, a, None))
    elif plant == "window":
        w = kfam.window_mask
        monkeypatch.setattr(kfam, "window_mask", lambda pq, pk, win: w(pq, pk, None if win is None else win + 1))
    else:
        m = kfam.attention_mixer
        monkeypatch.setattr(kfam, "attention_mixer", lambda a, s, *rest: m(a, 1.0, *rest))
    got = kfam.Mimo2Target(t, "cpu", torch.float64, 64).prefill(PROMPT, logits=True)
    assert rel(got.logits.numpy(), want) > 1e-4


@pytest.mark.parametrize("hidden", ["post", "pre"])
def test_mtp_draft_and_stores_match_reference(ckpt, hidden):
    t, m = ckpt
    eng = kfam.Mimo2Target(t, "cpu", torch.float64, 64, rows=4)
    d = kmtp.Mimo2MTPDraft(m, eng, 64, hidden=hidden)
    pre = eng.prefill(PROMPT[:12])
    d.prompt(pre.taps)
    got = d.propose(pre.argmax[-1], detail=True)
    r = rfam.forward(t, PROMPT)
    rows = r.final if hidden == "post" else r.hidden[-1]
    want = rmtp.draft(m, t, PROMPT[:12], rows[:12], pre.argmax[-1], hidden, chain_ids=got.ids)
    assert got.ids == want.ids.tolist()
    assert rel(got.logits.numpy(), want.logits) < 1e-5 and rel(got.layer_out[0].numpy(), want.y) < 1e-5
    v = eng.verify([pre.argmax[-1], *got.ids])               # keep 2: anchor + a forced continuation
    eng.commit(2)
    d.accept(2, v.taps)
    d.propose(v.argmax[1])
    seq = PROMPT[:12] + [pre.argmax[-1], got.ids[0], v.argmax[1]]
    r = rfam.forward(t, seq)
    rows = r.final if hidden == "post" else r.hidden[-1]
    st = rmtp.store_rows(m, t, seq, rows[:-1], hidden)
    for k in range(3):
        kk, vv = d.store_rows(k)
        assert rel(kk.transpose(0, 1).numpy(), st[k][0]) < 1e-5 and rel(vv.transpose(0, 1).numpy(), st[k][1]) < 1e-5


def test_mtp_chain_reads_the_previous_layer(ckpt, monkeypatch):
    """Planted: every layer fed the target's hidden instead of the previous layer's output -> layers 1, 2 differ."""
    t, m = ckpt
    eng = kfam.Mimo2Target(t, "cpu", torch.float64, 64)
    pre = eng.prefill(PROMPT)
    monkeypatch.setattr(kmtp.Mimo2MTPDraft, "chain_source", lambda self, k: self.x)
    d = kmtp.Mimo2MTPDraft(m, eng, 64)
    d.prompt(pre.taps)
    got = d.propose(pre.argmax[-1], detail=True)
    want = rmtp.draft(m, t, PROMPT, rfam.forward(t, PROMPT).final, pre.argmax[-1], "post", chain_ids=got.ids)
    assert rel(got.logits[0].numpy(), want.logits[0]) < 1e-5
    assert rel(got.logits[1].numpy(), want.logits[1]) > 1e-4


@pytest.mark.skipif(not HF, reason="transformers not installed")
def test_tier3_transformers(ckpt):
    from bloomery_cli.families.mimo2.oracle import hf_mimo2_logits, hf_mtp_chain

    t, m = ckpt
    assert rel(rfam.forward(t, PROMPT).logits, hf_mimo2_logits(t, PROMPT)) < 1e-12
    ours = rmtp.chain(m, t, PROMPT, rfam.forward(t, PROMPT).final, "post")
    for k, want in enumerate(hf_mtp_chain(t, PROMPT, 3)):
        assert want.shape == ours.logits[k].shape and rel(ours.logits[k], want) < 1e-12


def test_tier3_chain_on_an_mtp_model_without_its_layer_step_is_none(ckpt, monkeypatch):
    """transformers 5.17's MtpModel has no forward_layer / _project_to_logits (the H200 image): no chain, so the
    gate notes the missing (o) line instead of ending in an AttributeError (bloomery gates on the H200 did)."""
    layers = pytest.importorskip("transformers.modeling_layers")
    from bloomery_cli.families.mimo2.oracle import hf_mtp_chain

    class Bare(torch.nn.Module):
        def __init__(self, *a, **k):
            super().__init__()

    monkeypatch.setattr(layers, "MtpModel", Bare, raising=False)
    assert hf_mtp_chain(ckpt[0], PROMPT, 3) is None


# --------------------------------------------------------------------------------- the gate, FAIL-first

needs_fixture = pytest.mark.skipif(not FIXTURE, reason="fixtures/mimo2-tiny not built "
                                   "(python -m bloomery_cli.families.mimo2.fixture --out fixtures)")


def gate(**kw):
    return run_named("mimo2-mtp", 32, 2, **kw)




@needs_fixture
def test_gate_control_passes():
    code, lines = gate()
    assert code == 0, "\n".join(lines)
    assert "ids identical 32" in lines and any("chosen experts" in line for line in lines)


@needs_fixture
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gate_fails_routed_scale_before_the_renormalisation(monkeypatch, dtype):
    """Issue 29 part 5: the routed scaling factor applied before the renormalisation cancels out at the fixture's
    factor 1.0, so every run line passes; the router probe at factor 2.5 (gates.moe_checks) fails."""
    from bloomery_gates.kernels.ops import moe as kmoe

    def scale_first(logits, bias, k, n_group=1, topk_group=1, norm=True, scale=1.0):
        s = torch.sigmoid(logits)
        c = s + bias.float()
        ids = kmoe.group_limited_choice(c, k, n_group, topk_group)
        w = s.gather(-1, ids) * scale                                        # the defect: scaled, then
        w = w / (w.sum(-1, keepdim=True) + 1e-20) if norm else w             # renormalised (the scale cancels)
        return kmoe.Routing(ids, w, c)

    monkeypatch.setattr(kmoe, "sigmoid_group_topk", scale_first)
    code, lines = gate(dtype=dtype)
    assert code == 1 and failed(lines, "(r) router weights at routed_scaling_factor 2.5"), "\n".join(lines)
    assert not any(line.endswith(" FAIL") for line in lines if "probe" not in line), "\n".join(lines)


@needs_fixture
def test_gate_fails_sinks_dropped(monkeypatch):
    orig = kfam.sink_attention
    monkeypatch.setattr(kfam, "sink_attention", lambda q, k, v, a, z: orig(q, k, v, a, None))
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) target layer 1 out"), "\n".join(lines)


@needs_fixture
def test_gate_fails_window_off_by_one(monkeypatch):
    w = kfam.window_mask
    monkeypatch.setattr(kfam, "window_mask", lambda pq, pk, win: w(pq, pk, None if win is None else win + 1))
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) target layer 1 out"), "\n".join(lines)


@needs_fixture
def test_gate_fails_mtp_chain_fed_the_wrong_hidden(monkeypatch):
    monkeypatch.setattr(kmtp.Mimo2MTPDraft, "chain_source", lambda self, k: self.x)
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) mtp layer 1 row 2 out"), "\n".join(lines)


@needs_fixture
def test_gate_fails_pre_norm_hidden_read_as_post(monkeypatch):
    monkeypatch.setattr(kmtp.Mimo2MTPDraft, "target_rows", lambda self, taps: taps[-1])
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) mtp layer 0 row 1 out"), "\n".join(lines)


def test_refuses_sparse_mtp(tmp_path):
    from bloomery_cli.fixturegen.export_hf import read_safetensors, write_safetensors

    d = write(tmp_path / "m")
    st = read_safetensors(d / "model.safetensors")
    st["model.mtp.layers.0.mlp.gate.weight"] = torch.zeros(8, SHAPE.hidden_size)
    write_safetensors(d / "model.safetensors", st)
    with pytest.raises(Refused, match="sparse MTP MLP"):
        load_mimo2_mtp(d, load_target(d))


@needs_fixture
def test_state_fails_kept_rows_hidden_not_recorded(monkeypatch):
    """accept records the kept rows' tokens but not their target hidden rows: the prefill-time lines cannot see it
    (they check the first window), the state lines of every MTP layer's store must."""
    def accept(self, kept, taps):
        c = self.committed
        self.e[c:c + kept] = taps[0][:kept]
        self.committed += kept

    monkeypatch.setattr(kmtp.Mimo2MTPDraft, "accept", accept)
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) state after") and any(
        "mtp store k layer 0" in line and line.endswith(" FAIL") for line in lines), "\n".join(lines)
    assert not any(line.startswith("(r) mtp layer") and line.endswith(" FAIL") for line in lines)
