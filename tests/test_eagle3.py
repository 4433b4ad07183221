"""EAGLE-3: kernel vs f64 reference vs speculators' Eagle3DraftModel, the store's rollback, losslessness, the
speculators reader's named refusals (exit 2, one line), and the qwen3-eagle3 gate on the trained fixture with
its planted defects (FAIL-first: each must turn the gate red)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_target
from eagle3_factory import eagle3_config, make_eagle3, write_eagle3
from gate_run import failed, run_named
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.gate import GateOptions, run_gate
from bloomery_cli.loading import load_eagle3, load_target
from bloomery_cli.speculative import generate, kept_rows
from bloomery_gates.errors import BadConfig, BadTensor, Mismatch, Refused
from bloomery_gates.gates import GATES
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import eagle3 as keagle3
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target
from bloomery_gates.kernels.families.qwen3.model import forward_train as target_forward
from bloomery_gates.reference.drafts import eagle3 as ref_eagle3
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3
from bloomery_gates.spec import Eagle3Spec

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
VARIANTS = {"qwen3 layer": {}, "llama layer": {"qk_norm": False}, "draft vocab 40 (d2t)": {"draft_vocab": 40},
            "norm_before_residual + norm_output": {"norm_before_residual": True, "norm_output": True}}
HAVE_FIXTURE = (FIXTURES / "qwen3-tiny").is_dir() and (FIXTURES / "qwen3-tiny-eagle3").is_dir()
needs_fixture = pytest.mark.skipif(not HAVE_FIXTURE, reason="fixtures/qwen3-tiny-eagle3 not built "
                                   "(python -m bloomery_cli.families.qwen3.fixture_eagle3 --out fixtures)")


def engine_and_draft(t, d: Eagle3Spec, width: int = 3, dtype=torch.float64):
    eng = Qwen3Target(t, "cpu", dtype, 96, rows=width + 1)
    return eng, keagle3.Eagle3Draft(d, eng, 96, width)


def close(a: np.ndarray, b: np.ndarray, rel: float = 1e-5) -> None:
    np.testing.assert_allclose(a, b, atol=rel * np.abs(b).max())


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("width", [1, 3])
def test_kernel_matches_reference(variant, width):
    """(The kernel keeps float32 islands, norms / softmax / rope tables, hence 1e-5 and not 1e-12.)"""
    t = make_target()
    d = make_eagle3(t, **VARIANTS[variant])
    eng, dr = engine_and_draft(t, d, width)
    pre = eng.prefill(PROMPT)
    dr.prompt(pre.taps)
    got = dr.propose(pre.argmax[-1], detail=True)
    ref = ref_eagle3.draft(d, t, PROMPT, pre.taps.numpy(), pre.argmax[-1], width, chain_ids=got.ids)
    assert got.ids == ref.ids.tolist() and got.draft_ids == ref.draft_ids.tolist() and len(got.ids) == width
    close(got.logits.numpy(), ref.logits)
    close(got.layer_out[0].numpy(), ref.layer_out)


def test_d2t_maps_draft_ids_to_target_ids():
    t = make_target()
    d = make_eagle3(t, draft_vocab=40)
    eng, dr = engine_and_draft(t, d)
    pre = eng.prefill(PROMPT)
    dr.prompt(pre.taps)
    got = dr.propose(pre.argmax[-1], detail=True)
    assert got.ids == [1 + 2 * i for i in got.draft_ids]          # the factory picks the odd target ids


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_forward_is_the_engine_chain(variant):
    """forward_train's step s at position q is the engine's s-th draft after the anchor at q-s+1."""
    t = make_target()
    d = make_eagle3(t, width=4, **VARIANTS[variant])
    eng, dr = engine_and_draft(t, d, 4)
    pre = eng.prefill(PROMPT)
    dr.prompt(pre.taps)
    got = dr.propose(pre.argmax[-1], detail=True)
    ids = torch.tensor([PROMPT + [pre.argmax[-1]] + got.ids[:3]])
    p64 = {k: v.double() for k, v in t.tensors.items()}
    _, hidden = target_forward(p64, t, ids)
    outs = keagle3.forward_train({**{k: v.double() for k, v in d.tensors.items()},
                                  "model.embed_tokens.weight": p64["model.embed_tokens.weight"]}, d, hidden, ids, 4)
    for s in range(1, 5):
        q = len(PROMPT) + s - 1
        torch.testing.assert_close(outs[s - 1][0, q - 1], got.logits[s - 1], atol=1e-5, rtol=1e-5)


def test_store_after_verify_equals_a_fresh_prompt():
    """Windows that keep 1, 2, 3 and 4 rows (the rejected rows hold other tokens than the drafts) and a plain
    window (no propose): the next proposal then equals that of a fresh draft prompted on every committed id,
    i.e. the kept positions were rewritten from the target's rows and nothing made from the chain survived."""
    t = make_target()
    d = make_eagle3(t, draft_vocab=40)
    eng, dr = engine_and_draft(t, d)
    plain = generate(eng, None, PROMPT, 24).ids
    dr.prompt(eng.prefill(PROMPT).taps)
    pos = 0
    for j in (0, 1, 2, 3, None, 1):
        x = plain[pos]
        if j is None:
            rows = [x]
        else:
            dr.propose(x)
            rows = [x, *plain[pos + 1:pos + 1 + j]] + [(plain[pos + 1 + j] + 1) % t.vocab_size] * (3 - j)
        v = eng.verify(rows)
        kept = kept_rows(rows[1:], v.argmax)
        assert kept == (1 if j is None else j + 1)
        eng.commit(kept)
        dr.accept(kept, v.taps)
        pos += kept
    eng2, fresh = engine_and_draft(t, d)
    fresh.prompt(eng2.prefill(PROMPT + plain[:pos]).taps)
    a, b = dr.propose(plain[pos], detail=True), fresh.propose(plain[pos], detail=True)
    assert a.ids == b.ids
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_drafted_equals_plain(width):
    t = make_target(seed=3)
    d = make_eagle3(t, draft_vocab=60)
    eng, dr = engine_and_draft(t, d, width, torch.float32)
    plain = generate(eng, None, PROMPT, 40)
    drafted = generate(eng, dr, PROMPT, 40)
    assert drafted.ids == plain.ids
    assert drafted.tally.proposals == width * drafted.tally.windows


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_eagle3_model_agrees(variant):
    """Tier 3: speculators 0.9's own Eagle3DraftModel (float64, islands lifted) on the same weights."""
    pytest.importorskip("speculators.models.eagle3", reason="speculators (and its imports) not installed")
    from bloomery_gates.gates.eagle3_oracle import speculators_logits

    t = make_target()
    d = make_eagle3(t, **VARIANTS[variant])
    seq = PROMPT + [5, 6, 7, 8, 9]
    hidden = ref_qwen3.forward(t, seq).hidden
    theirs = speculators_logits(d, t, seq, hidden)
    ours = ref_eagle3.teacher_forced(d, t, seq, hidden, 3)
    for mine, other in zip(ours, theirs, strict=True):
        other = other[: len(mine.logits)]
        assert np.abs(mine.logits - other).max() <= 1e-12 * np.abs(other).max()
        assert (mine.draft_ids == other.argmax(-1)).all()


# ------------------------------------------------------------------------------------------ readers

def test_reader_roundtrip(tmp_path):
    t = make_target()
    d = make_eagle3(t, draft_vocab=40, aux=(0, 2, 3))
    back = load_eagle3(write_eagle3(d, t, tmp_path / "d"), t)
    got = (back.draft_vocab_size, back.aux_layer_ids, back.speculative_tokens, back.qk_norm)
    assert got == (40, (0, 2, 3), 3, True)
    assert torch.equal(back.d2t, d.d2t) and set(back.tensors) == set(d.tensors)
    assert all(torch.equal(back.tensors[k], d.tensors[k]) for k in d.tensors)
    copy = write_eagle3(d, t, tmp_path / "copy", extra={"embed_tokens.weight": t.tensors["model.embed_tokens.weight"],
                                                        "verifier_norm.weight": torch.ones(t.hidden_size)})
    assert load_eagle3(copy, t).draft_vocab_size == 40
    llama = make_eagle3(t, qk_norm=False, llama_head_dim=None)
    cfg = eagle3_config(llama, t)
    del cfg["transformer_layer_config"]["head_dim"], cfg["speculators_config"]
    back = load_eagle3(write_eagle3(llama, t, tmp_path / "llama", config=cfg), t)
    assert not back.qk_norm and back.layer.head_dim == t.hidden_size // t.layer.num_heads
    assert back.speculative_tokens == 3 and back.d2t is None


def _set(cfg: dict, path: str, value) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        cfg = cfg[k][0] if k == "proposal_methods" else cfg[k]
    if value is KeyError:
        cfg.pop(keys[-1], None)
    else:
        cfg[keys[-1]] = value


CONFIG_REFUSALS = [          # (config path, value, error, needle): value KeyError deletes the key
    ("speculators_model_type", "dflash", BadConfig, "speculators_model_type"),
    ("speculators_model_type", KeyError, BadConfig, "speculators_model_type"),
    ("transformer_layer_config.model_type", "mistral", BadConfig, "model_type"),
    ("transformer_layer_config.num_hidden_layers", 2, Refused, "num_hidden_layers = 2"),
    ("transformer_layer_config.hidden_size", 64, Mismatch, "hidden_size 64"),
    ("transformer_layer_config.vocab_size", 100, Mismatch, "vocab_size 100"),
    ("transformer_layer_config.rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4}, BadConfig, "llama3"),
    ("transformer_layer_config.attention_bias", True, BadConfig, "attention_bias"),
    ("draft_vocab_size", 5000, Mismatch, "draft_vocab_size 5000"),
    ("draft_vocab_size", KeyError, BadConfig, "draft_vocab_size"),
    ("eagle_aux_hidden_state_layer_ids", [1, 2, 9], Mismatch, "outside 0..4"),
    ("eagle_aux_hidden_state_layer_ids", KeyError, Mismatch, "distinct"),   # the default for L = 4: [2, 2, 1]
    ("eagle_aux_hidden_state_layer_ids", [1, 2], Mismatch, "fc.weight shape"),
    ("norm_before_fc", True, Refused, "norm_before_fc"),
    ("fc_norm", True, Refused, "fc_norm"),
    ("target_hidden_size", 64, BadConfig, "target_hidden_size"),
    ("norm_output", "yes", BadConfig, "norm_output"),
    ("speculators_config.default_proposal_method", "tree", BadConfig, "default_proposal_method"),
    ("speculators_config", {"default_proposal_method": "tree", "proposal_methods": [
        {"proposal_type": "tree", "speculative_tokens": 3}]}, Refused, "greedy"),
    ("speculators_config.proposal_methods.speculative_tokens", 0, BadConfig, "speculative_tokens"),
    ("speculators_config.algorithm", "mtp", BadConfig, "algorithm"),
]


@pytest.mark.parametrize("path,value,err,needle", CONFIG_REFUSALS, ids=[f"{p}={v}" for p, v, *_ in CONFIG_REFUSALS])
def test_reader_refuses_config(tmp_path, path, value, err, needle):
    t = make_target(layers=4)         # default aux ids for L = 4: [2, 2, 1], not distinct
    d = make_eagle3(t, draft_vocab=40)
    cfg = eagle3_config(d, t)
    _set(cfg, path, value)
    with pytest.raises(err, match=needle):
        load_eagle3(write_eagle3(d, t, tmp_path / "d", config=cfg), t)


def _odd(t, d):
    return {"d2t": torch.zeros(d.draft_vocab_size, dtype=torch.long) + t.vocab_size}


TENSOR_REFUSALS = {          # name -> (write_eagle3 kwargs from (target, draft), error, needle)
    "no d2t": (lambda t, d: {"drop": ("d2t", "t2d")}, BadTensor, "tensor d2t"),
    "d2t out of range": (lambda t, d: {"extra": _odd(t, d)}, BadTensor, "outside"),
    "d2t duplicates": (lambda t, d: {"extra": {"d2t": -torch.arange(d.draft_vocab_size)}}, BadTensor, "two draft"),
    "d2t float": (lambda t, d: {"extra": {"d2t": d.d2t.float()}}, BadTensor, "dtype F32"),
    "t2d inconsistent": (lambda t, d: {"extra": {"t2d": torch.ones(t.vocab_size, dtype=torch.bool)}}, BadTensor, "t2d"),
    "own embedding": (lambda t, d: {"extra": {"embed_tokens.weight": t.tensors["model.embed_tokens.weight"] + 1}},
                      Refused, "embed_tokens.weight: differs"),
    "lm_head shape": (lambda t, d: {"extra": {"lm_head.weight": torch.zeros(t.vocab_size, t.hidden_size)}},
                      BadTensor, "lm_head.weight"),
    "no hidden_norm": (lambda t, d: {"drop": ("layers.0.hidden_norm.weight",)}, BadTensor, "hidden_norm"),
    "q_proj 1H": (lambda t, d: {"extra": {"layers.0.self_attn.q_proj.weight": torch.zeros(32, t.hidden_size)}},
                  BadTensor, "2\\*hidden_size"),
    "second layer": (lambda t, d: {"extra": {"layers.1.norm.weight": torch.ones(t.hidden_size)}}, BadTensor,
                     "layers.1|layer indices"),
}


@pytest.mark.parametrize("case", list(TENSOR_REFUSALS))
def test_reader_refuses_tensors(tmp_path, case):
    t = make_target()
    d = make_eagle3(t, draft_vocab=40)
    kw, err, needle = TENSOR_REFUSALS[case]
    with pytest.raises(err, match=needle):
        load_eagle3(write_eagle3(d, t, tmp_path / "d", **kw(t, d)), t)


def test_reader_llama_config_with_qk_norms(tmp_path):
    t = make_target()
    d = make_eagle3(t)
    cfg = eagle3_config(d, t)
    cfg["transformer_layer_config"]["model_type"] = "llama"
    with pytest.raises(BadConfig, match="q_norm"):
        load_eagle3(write_eagle3(d, t, tmp_path / "d", config=cfg), t)


@needs_fixture
@pytest.mark.parametrize("case", ["speculators_model_type", "num_hidden_layers", "no d2t", "own embedding",
                                  "aux ids", "pickle"])
def test_cli_refusal_is_one_line_exit_2(tmp_path, case):
    """Through the real CLI on the fixture target: exit 2, one named line, no traceback."""
    target = load_target(FIXTURES / "qwen3-tiny")
    d = make_eagle3(target, draft_vocab=2048, aux=(2, 3, 5))
    cfg, kw = eagle3_config(d, target), {}
    needle = {"speculators_model_type": "speculators_model_type", "num_hidden_layers": "num_hidden_layers",
              "no d2t": "tensor d2t", "own embedding": "embed_tokens.weight", "aux ids": "outside 0..6",
              "pickle": "never unpickle"}[case]
    if case == "speculators_model_type":
        cfg["speculators_model_type"] = "mtp"
    elif case == "num_hidden_layers":
        cfg["transformer_layer_config"]["num_hidden_layers"] = 3
    elif case == "no d2t":
        kw = {"drop": ("d2t", "t2d")}
    elif case == "own embedding":
        kw = {"extra": {"embed_tokens.weight": torch.zeros(target.vocab_size, target.hidden_size)}}
    elif case == "aux ids":
        cfg["eagle_aux_hidden_state_layer_ids"] = [2, 3, 7]
    draft = write_eagle3(d, target, tmp_path / "d", config=cfg, **kw)
    if case == "pickle":
        (draft / "model.safetensors").unlink()
        (draft / "pytorch_model.bin").write_bytes(b"\x80\x04")
    r = CliRunner().invoke(app, ["gate", "run", "qwen3-eagle3", "--draft", str(draft)], catch_exceptions=False)
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.output


# ------------------------------------------------------------------------------------------ the gate on the fixture

def gate(n: int = 64, prompts: int = 2):
    return run_named("qwen3-eagle3", n, prompts)




@needs_fixture
def test_gate_control_passes():
    code, lines = gate()
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines and any(line.startswith("(r) state after") for line in lines)
    assert any(line.startswith("(b) accepts") and line.endswith("PASS") for line in lines)


def _stale_accept(self, kept, taps):
    """The defect: the kept positions keep the entries the chain wrote from the draft's own output (never
    rewritten from the target's rows), and the slot pointer moves past them as if they were real."""
    u = self.features(taps[:, :kept])
    self.next_slot += kept - 1
    self.last_h, self.anchor_written = u[kept - 1:kept], False


PLANTS = {   # name -> (object, attribute, replacement, the line head that must FAIL)
    "aux layer ids off by one": (keagle3, "aux_features",
                                 lambda taps, ids, fc, real=keagle3.aux_features: real(taps, [l + 1 for l in ids], fc),
                                 "(r) eagle3 row 1"),
    "[embed ; hidden] swapped": (keagle3, "concat_inputs", lambda e, h: torch.cat([h, e], dim=-1), "(r) eagle3 row 1"),
    "chain fed the target hidden": (keagle3.Eagle3Draft, "chain_input", lambda self, y, n: self.last_h,
                                    "(r) eagle3 row 2"),
    "store not rolled back on a reject": (keagle3.Eagle3Draft, "accept", _stale_accept, "(r) state after"),
    "draft ids not mapped through d2t": (Eagle3Spec, "target_ids",
                                         lambda self: torch.arange(self.draft_vocab_size), "(r) eagle3 draft ids"),
}


@needs_fixture
@pytest.mark.parametrize("plant", list(PLANTS))
def test_fail_first(monkeypatch, plant):
    obj, attr, fn, head = PLANTS[plant]
    monkeypatch.setattr(obj, attr, fn)
    code, lines = gate()
    assert code == 1 and failed(lines, head), "\n".join(lines)


@needs_fixture
def test_fixture_reads_back_and_oracle_line_passes():
    """The fixture loads in the speculators layout (d2t / t2d, 2048 of 4096 ids) and the (o) lines against
    speculators' Eagle3DraftModel pass on it (skipped where speculators does not import)."""
    from types import SimpleNamespace

    from bloomery_cli.contract import Report
    from bloomery_gates.gates.eagle3_oracle import check_oracle

    t = load_target(FIXTURES / "qwen3-tiny")
    d = load_eagle3(FIXTURES / "qwen3-tiny-eagle3", t)
    assert d.draft_vocab_size < t.vocab_size and d.d2t is not None and d.speculative_tokens == 3
    pytest.importorskip("speculators.models.eagle3", reason="speculators (and its imports) not installed")
    prompt = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    lines: list[str] = []
    report = Report("qwen3-eagle3", emit=lines.append)
    check_oracle(report, SimpleNamespace(prompt=prompt, target_spec=t, draft_spec=d), [])
    assert report.failed == 0 and any(line.startswith("(o) eagle3 ttt step 3 logits") for line in lines), \
        "\n".join(lines)


@needs_fixture
def test_tiny_eagle3_build(tmp_path):
    """The fixture pipeline end to end on a few steps, into a copy of the fixtures: rows, training, the
    speculators-layout files read back, the manifest entry, every other entry untouched and verified."""
    import shutil

    from bloomery_cli.families.qwen3.fixture_eagle3 import EAGLE3, Eagle3BuildConfig, build_qwen3_eagle3
    from bloomery_cli.fixturegen.manifest import Manifest, verify
    from bloomery_cli.fixturegen.train import TrainConfig

    out = tmp_path / "fixtures"
    shutil.copytree(FIXTURES, out)
    before = Manifest.read(out)
    cfg = Eagle3BuildConfig(greedy_rows=2, real_rows=2, eval_rows=1, seq=80,
                            train=TrainConfig(steps=2, batch=2, seq=80, warmup=1, log_every=1))
    man = build_qwen3_eagle3(out, "cpu", cfg)
    assert verify(out) == []
    assert {k: v for k, v in man.files.items() if not k.startswith(EAGLE3)} == \
        {k: v for k, v in before.files.items() if not k.startswith(EAGLE3)}
    d = load_eagle3(out / EAGLE3, load_target(out / "qwen3-tiny"))
    assert d.d2t is not None and d.speculative_tokens == 3 and man.models[EAGLE3]["eval"]["width"] == 3
    cfg_json = json.loads((out / EAGLE3 / "config.json").read_text())
    assert cfg_json["speculators_model_type"] == "eagle3" and "auto_map" not in cfg_json


@pytest.mark.skipif(not (FIXTURES / "qwen3-tiny-eagle3").is_dir(), reason="no EAGLE-3 fixture")
def test_short_n_sizes_the_engines_for_the_state_run():
    """-n below the state run's 48 ids: the engines are sized for the gate's own checks too (was a traceback,
    'EAGLE-3 KV store of 90 positions is full')."""
    code, rep = run_gate(GATES["qwen3-eagle3"], GateOptions(n=8), emit=lambda _line: None)
    assert code == 0, "\n".join(rep.lines)
