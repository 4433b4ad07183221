"""The qwen38 MTP draft: kernel vs f64 reference vs transformers' MtpModel, the store rewrite after a verify,
losslessness at widths 1..4, the readers' named refusals, and the two qwen38 gates on the trained fixtures
with their planted defects (FAIL-first: each must turn the gate red)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from gate_run import failed, run_named
from mtp_factory import make_qwen38, qwen38_config, write_qwen38

from bloomery_cli.loading import load_mtp, load_target
from bloomery_cli.speculative import generate, kept_rows
from bloomery_gates.errors import BadConfig, BadTensor, Mismatch, Refused
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import mtp as kmtp
from bloomery_gates.kernels.families.qwen38.model import Qwen38Target
from bloomery_gates.kernels.families.qwen38.model import forward_train as target_forward
from bloomery_gates.reference.drafts import mtp as ref_mtp
from bloomery_gates.reference.families.qwen38 import model as ref_qwen38
from bloomery_gates.spec import MTPSpec

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
HAVE_FIXTURE = (FIXTURES / "qwen38-tiny").is_dir() and (FIXTURES / "qwen38-tiny-dflash-b8").is_dir()
needs_fixture = pytest.mark.skipif(not HAVE_FIXTURE, reason="fixtures/qwen38-tiny not built "
                                   "(python -m bloomery_cli.families.qwen38.fixture_drafts --out fixtures)")


def mtp_of(t) -> MTPSpec:
    return MTPSpec("mtp", t.source, "hf", t.layer, t.hybrid.rotary_dim, 1, t.vocab_size,
                   {k: v for k, v in t.tensors.items() if k.startswith("mtp.")})


def engine_and_draft(t, width: int, dtype=torch.float64):
    eng = Qwen38Target(t, "cpu", dtype, 96, rows=width + 1)
    return eng, kmtp.MTPDraft(mtp_of(t), eng, 96, width)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_kernel_matches_reference(width):
    t = make_qwen38()
    eng, d = engine_and_draft(t, width)
    pre = eng.prefill(PROMPT)
    d.prompt(pre.taps)
    got = d.propose(pre.argmax[-1], detail=True)
    final = ref_qwen38.forward(t, PROMPT).final
    ref = ref_mtp.draft(mtp_of(t), t, PROMPT, final, pre.argmax[-1], width, chain_ids=got.ids)
    assert got.ids == ref.ids.tolist() and len(got.ids) == width
    np.testing.assert_allclose(got.logits.numpy(), ref.logits, atol=1e-5 * np.abs(ref.logits).max())
    np.testing.assert_allclose(got.layer_out[0].numpy(), ref.layer_out, atol=1e-5 * np.abs(ref.layer_out).max())


def test_training_forward_is_the_engine_chain():
    """forward_train's step s at position q is the engine's s-th draft after the anchor at q-s+1."""
    t = make_qwen38()
    eng, d = engine_and_draft(t, 4)
    pre = eng.prefill(PROMPT)
    d.prompt(pre.taps)
    got = d.propose(pre.argmax[-1], detail=True)
    ids = torch.tensor([PROMPT + [pre.argmax[-1]] + got.ids[:3]])
    p64 = {k: v.double() for k, v in t.tensors.items()}
    _, hidden = target_forward(p64, t, ids)
    final = kmtp.target_hidden(torch.stack(hidden)[:, 0], 1 + p64["model.norm.weight"].float(), 1e-6)[None]
    outs = kmtp.forward_train(p64, t, final.double(), ids, 4)
    for s in range(1, 5):
        q = len(PROMPT) + s - 1
        torch.testing.assert_close(outs[s - 1][0, q - 1], got.logits[s - 1], atol=1e-5, rtol=1e-5)


def test_store_after_verify_equals_a_fresh_prompt():
    """Windows that keep 1, 2, 3 and 4 rows (the verify is fed the target's own continuation for the kept part,
    so the draft's transient entries hold other tokens) and a plain window (no propose): the next proposal then
    equals that of a fresh draft prompted on every committed id, i.e. the kept positions were rewritten from
    the target's real hidden rows and nothing the draft wrote from its own g survived."""
    t = make_qwen38()
    eng, d = engine_and_draft(t, 3)
    plain = generate(eng, None, PROMPT, 24).ids
    d.prompt(eng.prefill(PROMPT).taps)
    pos = 0
    for j in (0, 1, 2, 3, None, 1):
        x = plain[pos]
        if j is None:
            rows = [x]
        else:
            d.propose(x)
            rows = [x, *plain[pos + 1:pos + 1 + j]] + [(plain[pos + 1 + j] + 1) % t.vocab_size] * (3 - j)
        v = eng.verify(rows)
        kept = kept_rows(rows[1:], v.argmax)
        assert kept == (1 if j is None else j + 1)
        eng.commit(kept)
        d.accept(kept, v.taps)
        pos += kept
    eng2, fresh = engine_and_draft(t, 3)
    fresh.prompt(eng2.prefill(PROMPT + plain[:pos]).taps)
    a, b = d.propose(plain[pos], detail=True), fresh.propose(plain[pos], detail=True)
    assert a.ids == b.ids
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_drafted_equals_plain(width):
    t = make_qwen38(seed=3)
    eng, d = engine_and_draft(t, width, torch.float32)
    plain = generate(eng, None, PROMPT, 40)
    drafted = generate(eng, d, PROMPT, 40)
    assert drafted.ids == plain.ids
    assert drafted.tally.proposals == width * drafted.tally.windows


def test_width_policy_with_plain_windows_stays_lossless():
    """A per-window width policy (bloomery_cli.width's interface) that sometimes runs a plain pass (k = 1: no
    propose, the draft still accepts) and sometimes verifies fewer ids than drafted."""

    class Cycle:
        def __init__(self):
            self.ks = [1, 4, 2, 1, 1, 3, 4]
            self.i = 0

        def choose(self) -> int:
            self.i += 1
            return self.ks[(self.i - 1) % len(self.ks)]

        def observe(self, k, kept, seconds) -> None:
            pass

    t = make_qwen38(seed=4)
    eng, d = engine_and_draft(t, 3, torch.float32)
    assert generate(eng, d, PROMPT, 40, width=Cycle()).ids == generate(eng, None, PROMPT, 40).ids


def test_transformers_mtp_model_agrees():
    pytest.importorskip("transformers")
    from bloomery_gates.gates.qwen38_mtp import hf_mtp_logits

    t = make_qwen38()
    ids = PROMPT + [32, 38, 46]
    hf = hf_mtp_logits(t, mtp_of(t), ids)
    if hf is None:
        pytest.skip("transformers has no MtpModel for this layout")
    ours = ref_mtp.teacher_forced(mtp_of(t), t, ids, ref_qwen38.forward(t, ids).final)
    assert np.abs(ours.logits - hf).max() <= 1e-10 * np.abs(hf).max()
    assert (ours.ids == hf.argmax(-1)).all()


# ------------------------------------------------------------------------------------------ readers

def test_reader_hf_roundtrip(tmp_path):
    t = make_qwen38()
    d = write_qwen38(t, tmp_path / "t")
    spec = load_target(d)
    m = load_mtp(d, spec)
    assert (m.kind, m.num_layers, m.rotary_dim, m.source_format) == ("mtp", 1, 4, "hf")
    assert set(m.tensors) == {k for k in t.tensors if k.startswith("mtp.")}
    assert all(torch.equal(m.tensors[k], t.tensors[k]) for k in m.tensors)


@pytest.mark.parametrize("drop,err,needle", [
    (("mtp.norm.weight",), BadTensor, "mtp.norm.weight"),
    (("mtp.layers.0.self_attn.k_norm.weight",), BadTensor, "cannot draft"),
    (tuple(f"mtp.{n}" for n in ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight",
                                "norm.weight")) + ("mtp.layers.0.input_layernorm.weight",), BadTensor, "mtp.fc.weight"),
])
def test_reader_refuses_undraftable(tmp_path, drop, err, needle):
    t = make_qwen38()
    d = write_qwen38(t, tmp_path / "t", drop=drop)
    with pytest.raises(err, match=needle.replace(".", r"\.")):
        load_mtp(d, load_target(d))


def test_reader_named_errors(tmp_path):
    t = make_qwen38()
    none = write_qwen38(make_qwen38(mtp=False), tmp_path / "none")
    with pytest.raises(BadTensor, match="ships no MTP head"):
        load_mtp(none, load_target(none))
    cfg = qwen38_config(t)
    cfg["mtp_num_hidden_layers"] = 2
    two = write_qwen38(t, tmp_path / "two", config=cfg)
    with pytest.raises(BadConfig, match="mtp_num_hidden_layers"):
        load_mtp(two, load_target(two))
    other = write_qwen38(make_qwen38(hidden=48), tmp_path / "other")
    with pytest.raises(Mismatch, match="hidden_size"):
        load_mtp(other, t)
    dedicated = replace(t, tensors={**t.tensors, "mtp.embed_tokens.weight": t.tensors["model.embed_tokens.weight"] + 0})
    extra = write_qwen38(dedicated, tmp_path / "extra")
    with pytest.raises(Refused, match="dedicated"):
        load_mtp(extra, load_target(extra))


def test_reader_gguf_names_and_refusal(tmp_path):
    from tokenizers import Tokenizer

    from bloomery_cli.families.qwen38.fixture import Qwen38Shape, write_qwen38_gguf

    tok_file = FIXTURES / "tokenizer.json"
    if not tok_file.is_file():
        pytest.skip("fixtures/tokenizer.json absent (a GGUF needs a vocab)")
    t = make_qwen38()
    s, hy = t.layer, t.hybrid
    shape = Qwen38Shape(s.hidden_size, hy.layer_types, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
                        t.vocab_size, hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_key_head_dim,
                        hy.linear_value_head_dim, hy.linear_conv_kernel_dim, hy.partial_rotary_factor)
    tok = Tokenizer.from_file(str(tok_file))
    good = write_qwen38_gguf(tmp_path / "good.gguf", shape, dict(t.tensors), tok, mtp_layers=1)
    spec = load_target(good)
    m = load_mtp(good, spec)
    assert m.source_format == "gguf" and spec.num_layers == 4
    for k, v in m.tensors.items():
        torch.testing.assert_close(v.float(), t.tensors[k].float(), atol=2e-7, rtol=2e-2 if v.ndim > 1 else 0)
    bad = write_qwen38_gguf(tmp_path / "bad.gguf", shape,
                            {k: v for k, v in t.tensors.items() if k != "mtp.norm.weight"}, tok, mtp_layers=1)
    with pytest.raises(BadTensor, match=r"blk\.4\.nextn\.shared_head_norm\.weight"):
        load_mtp(bad, load_target(bad))


# ------------------------------------------------------------------------------------------ gates on the fixture

def gate(name: str, n: int = 64, prompts: int = 2):
    return run_named(name, n, prompts)




@needs_fixture
@pytest.mark.parametrize("name", ["qwen38-mtp", "qwen38-dflash"])
def test_gate_control_passes(name):
    code, lines = gate(name)
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines
    assert any(line.startswith("accept_mean=") for line in lines)


@needs_fixture
@pytest.mark.parametrize("name", ["qwen38-mtp", "qwen38-dflash"])
def test_fail_first_state_not_rolled_back(monkeypatch, name):
    """commit keeps the recurrent state after the LAST verify row, not after row kept-1."""
    monkeypatch.setattr(Qwen38Target, "_rollback_row", lambda self, kept, first, n: n - 1)
    code, lines = gate(name)
    assert code == 1 and failed(lines, "(w) prompt"), "\n".join(lines)


PLANTS = {
    "concat order swapped": ("concat_inputs", lambda e, h: torch.cat([h, e], dim=-1)),
    "(1+w) read as w": ("norm_gain", lambda w: w.float()),
    "hidden before the final norm": ("target_hidden", lambda taps, gain, eps: taps[-1]),
}


@needs_fixture
@pytest.mark.parametrize("plant", list(PLANTS))
def test_fail_first_mtp_defects(monkeypatch, plant):
    attr, fn = PLANTS[plant]
    monkeypatch.setattr(kmtp, attr, fn)
    code, lines = gate("qwen38-mtp")
    assert code == 1 and failed(lines, "(r) mtp row 1"), "\n".join(lines)


@needs_fixture
def test_fixture_gguf_drafts_like_hf():
    hf = load_target(FIXTURES / "qwen38-tiny")
    gg = load_target(FIXTURES / "qwen38-tiny.gguf")
    m_hf, m_gg = load_mtp(FIXTURES / "qwen38-tiny", hf), load_mtp(FIXTURES / "qwen38-tiny.gguf", gg)
    assert m_gg.source_format == "gguf" and gg.num_layers == hf.num_layers
    prompt = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    runs = []
    for t, m in ((hf, m_hf), (gg, m_gg)):
        eng = Qwen38Target(t, "cpu", torch.float32, 200, rows=4)
        runs.append(generate(eng, kmtp.MTPDraft(m, eng, 200, 3), prompt, 48))
    assert runs[0].ids == runs[1].ids


@needs_fixture
def test_fixture_oracle_line_passes():
    """The (o) line against transformers' MtpModel on the trained fixture (gates.qwen38_mtp.check_oracle)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from bloomery_cli.contract import Report
    from bloomery_gates.gates.qwen38_mtp import check_oracle

    t = load_target(FIXTURES / "qwen38-tiny")
    prompt = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    lines: list[str] = []
    report = Report("qwen38-mtp", emit=lines.append)
    check_oracle(report, SimpleNamespace(prompt=prompt, target_spec=t, draft_spec=load_mtp(t.source, t)), [])
    assert report.failed == 0 and any(line.startswith("(o) mtp logits") for line in lines), "\n".join(lines)


def test_tiny_qwen38_build(tmp_path):
    """The fixture pipeline end to end on a few steps: files, read-back, manifest, and the gates load them."""
    import shutil

    from bloomery_cli.families.qwen38.fixture_drafts import Qwen38DraftsConfig, build_qwen38
    from bloomery_cli.fixturegen.manifest import verify
    from bloomery_cli.fixturegen.train import TrainConfig

    if not (FIXTURES / "tokenizer.json").is_file():
        pytest.skip("fixtures/tokenizer.json absent (the qwen38 fixtures share the qwen3 tokenizer)")
    out = tmp_path / "fixtures"
    out.mkdir()
    shutil.copy(FIXTURES / "tokenizer.json", out / "tokenizer.json")
    small = TrainConfig(steps=2, batch=2, seq=32, warmup=1, log_every=1)
    cfg = Qwen38DraftsConfig(target_steps=2, target_batch=2, seq=32, pool_size=2, pool_prefixes=(16,),
                             greedy_repeat=1, real_rows=2, mtp=small, dflash=small, dflash_layers=1,
                             anchors_per_row=2, eval_rows=2, eval_windows=2, quick=True)
    man = build_qwen38(out, "cpu", config=cfg)
    assert verify(out) == [] and "tokenizer.json" in man.files
    assert {"qwen38-tiny/model.safetensors", "qwen38-tiny.gguf", "qwen38-tiny-dflash-b8/model.safetensors"} <= set(
        man.files)
    assert len(man.models["qwen38-tiny/mtp"]["held_out_greedy"]["top1_agreement_per_step"]) == 3
    gg = load_target(out / "qwen38-tiny.gguf")
    assert load_mtp(out / "qwen38-tiny.gguf", gg).source_format == "gguf"
    from gguf import GGUFReader

    r = GGUFReader(str(out / "qwen38-tiny.gguf"))
    assert r.fields["qwen35.block_count"].contents() == 5 and r.fields["qwen35.nextn_predict_layers"].contents() == 1
    assert "blk.4.nextn.eh_proj.weight" in {t.name for t in r.tensors}
