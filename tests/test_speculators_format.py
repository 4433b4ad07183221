"""The speculators layout (formats/speculators*.py): the converted fixtures read as the z-lab / DeepSpec ones,
speculators 0.9.0 itself accepts them (when importable), defaults are speculators', and every key or tensor
the harness cannot act on is refused through the real CLI: exit 2, one line naming it, no traceback, no
record, the engine never built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from never_built import never_built
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from bloomery_cli import loading
from bloomery_cli.cli import app
from bloomery_cli.fixturegen.speculators_layout import SOURCES, same_spec, speculators_dir
from bloomery_gates.errors import BadConfig, BadTensor, Mismatch
from bloomery_gates.gates.fixtures import FIXTURES

pytestmark = pytest.mark.skipif(not (FIXTURES / speculators_dir("dspark")).is_dir(),
                                reason="fixtures/ has no speculators-layout drafters")
runner = CliRunner()
LOAD = {"dflash": loading.load_dflash, "dflash2": loading.load_dflash2, "dspark": loading.load_dspark}
GATE = {"dflash": "qwen3-dflash", "dflash2": "qwen3-dflash2", "dspark": "qwen3-dspark"}


@pytest.fixture(scope="module")
def target():
    return loading.load_target(FIXTURES / "qwen3-tiny")


def copy(kind: str, tmp_path: Path, **edit) -> Path:
    """The kind's speculators fixture copied to tmp_path, config keys set (None: removed)."""
    d = tmp_path / speculators_dir(kind)
    shutil.copytree(FIXTURES / speculators_dir(kind), d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in edit.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def with_tensors(d: Path, **extra: torch.Tensor) -> Path:
    t = load_file(str(d / "model.safetensors"))
    t.update(extra)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.parametrize("kind", list(SOURCES))
def test_reads_as_the_source_layout(kind, target):
    a = LOAD[kind](FIXTURES / SOURCES[kind], target)
    b = LOAD[kind](FIXTURES / speculators_dir(kind), target)
    assert same_spec(a, b) == []
    assert b.target_layer_ids == (1, 2, 4)


@pytest.mark.parametrize("kind", list(SOURCES))
def test_speculators_package_accepts_the_fixtures(kind):
    """speculators' own config class parses the file and its model takes every tensor (only the verifier-filled
    ones missing), as speculators' DFlashConverter checks a conversion."""
    pytest.importorskip("speculators", reason="speculators is not installed (optional oracle extra)")
    from speculators import SpeculatorModelConfig
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.dflash2 import DFlash2DraftModel
    from speculators.models.dspark import DSparkDraftModel

    d = FIXTURES / speculators_dir(kind)
    cfg = SpeculatorModelConfig.from_pretrained(str(d))
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel, "dspark": DSparkDraftModel}[kind](cfg)
    missing, unexpected = model.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
    assert unexpected == []
    assert set(missing) <= {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


def test_enable_confidence_head_defaults_true(tmp_path, target):
    """speculators' DSparkSpeculatorConfig.enable_confidence_head defaults to True: a config without the key has
    the head (and its tensors must be there), never silently loses it."""
    d = copy("dspark", tmp_path, enable_confidence_head=None, confidence_head_with_markov=None,
             markov_head_type=None, sample_from_anchor=None)
    spec = loading.load_dspark(d, target)
    assert spec.confidence is True and spec.markov_head_type == "vanilla"
    assert "confidence_head.proj.weight" in spec.tensors
    t = load_file(str(d / "model.safetensors"))
    save_file({k: v for k, v in t.items() if not k.startswith("confidence_head.")}, str(d / "model.safetensors"))
    with pytest.raises(BadTensor, match="confidence_head.proj.weight.*missing"):
        loading.load_dspark(d, target)
    try:
        from speculators.models.dspark import DSparkSpeculatorConfig
    except ImportError:
        return
    assert DSparkSpeculatorConfig.model_fields["enable_confidence_head"].default is True


def test_markov_rank_defaults_to_speculators_256(tmp_path, target):
    with pytest.raises(BadTensor, match=r"markov_w1.*\[4096, 32\], expected \[4096, 256\]"):
        loading.load_dspark(copy("dspark", tmp_path, markov_rank=None), target)


def test_aux_id_zero_is_the_embedding_output(tmp_path, target):
    spec = loading.load_dflash(copy("dflash", tmp_path, aux_hidden_state_layer_ids=[0, 3, 5]), target)
    assert spec.target_layer_ids == (-1, 2, 4)


def test_identity_vocab_maps_and_equal_verifier_copies_are_read(tmp_path, target):
    d = with_tensors(copy("dspark", tmp_path), d2t=torch.zeros(4096, dtype=torch.long),
                     t2d=torch.ones(4096, dtype=torch.bool),
                     **{"lm_head.weight": target.head_weight().clone(),
                        "verifier_norm.weight": target.tensors["model.norm.weight"].clone()})
    spec = loading.load_dspark(d, target)
    assert not {"d2t", "t2d", "lm_head.weight", "verifier_norm.weight"} & set(spec.tensors)


# --- refusals: reader level (the exception class and what it names) --------------------------------------

REFUSED = [
    ("dspark", {"markov_head_type": "gated"}, BadConfig, ("markov_head_type", "'gated'", "not built")),
    ("dspark", {"markov_head_type": "rnn"}, BadConfig, ("markov_head_type", "'rnn'")),
    ("dspark", {"sample_from_anchor": False}, BadConfig, ("sample_from_anchor", "false")),
    ("dflash", {"sample_from_anchor": True}, BadConfig, ("sample_from_anchor", "true")),
    ("dspark", {"confidence_head_with_markov": False}, BadConfig, ("confidence_head_with_markov", "false")),
    ("dflash", {"draft_vocab_size": 2048}, BadConfig, ("draft_vocab_size", "2048", "reduced draft vocabulary")),
    ("dflash", {"draft_vocab_size": None}, BadConfig, ("draft_vocab_size", "missing")),
    ("dflash", {"aux_hidden_state_layer_ids": [2, 3, 6]}, Mismatch, ("aux_hidden_state_layer_ids", "last layer")),
    ("dflash", {"aux_hidden_state_layer_ids": [2, 3]}, Mismatch, ("fc.weight", "[128, 256]")),
    ("dflash", {"aux_hidden_state_layer_ids": None}, BadConfig, ("aux_hidden_state_layer_ids", "missing")),
    ("dflash", {"norm_before_residual": True}, BadConfig, ("norm_before_residual", "refused rather than ignored")),
    ("dflash2", {"output_multiplier": 2.0}, BadConfig, ("output_multiplier", "refused rather than ignored")),
    ("dflash", {"speculators_model_type": "dspark"}, BadConfig, ("speculators_model_type", "'dspark'", "'dflash'")),
    ("dflash", {"target_hidden_size": 256}, Mismatch, ("target_hidden_size 256",)),
    ("dflash", {"mask_token_id": None}, BadConfig, ("mask_token_id", "missing")),
]


def _speculators_config(kind: str, **proposal) -> dict:
    cfg = json.loads((FIXTURES / speculators_dir(kind) / "config.json").read_text())["speculators_config"]
    cfg["proposal_methods"][0].update(proposal)
    return cfg


@pytest.mark.parametrize(("kind", "edit", "exc", "needles"), REFUSED)
def test_refused(kind, edit, exc, needles, tmp_path, target):
    with pytest.raises(exc) as info:
        LOAD[kind](copy(kind, tmp_path, **edit), target)
    msg = str(info.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_refused_proposals_and_layer_config(tmp_path, target):
    cases = [
        ({"speculators_config": _speculators_config("dflash", verifier_accept_k=2)}, ("verifier_accept_k", "2")),
        ({"speculators_config": _speculators_config("dflash", speculative_tokens=8)},
         ("speculative_tokens", "8", "7 drafts")),
        ({"speculators_config": {**_speculators_config("dflash"), "algorithm": "eagle3"}}, ("algorithm", "eagle3")),
    ]
    tl = json.loads((FIXTURES / speculators_dir("dflash") / "config.json").read_text())["transformer_layer_config"]
    cases.append(({"transformer_layer_config": {**tl, "model_type": "llama"}}, ("model_type", "llama")))
    cases.append(({"transformer_layer_config": {**tl, "vocab_size": 4000}}, ("vocab_size 4000",)))
    for i, (edit, needles) in enumerate(cases):
        with pytest.raises((BadConfig, Mismatch)) as info:
            loading.load_dflash(copy("dflash", tmp_path / str(i), **edit), target)
        for n in needles:
            assert n in str(info.value), (n, str(info.value))


def test_refused_tensors(tmp_path, target):
    d = with_tensors(copy("dflash", tmp_path / "a"), **{"layers.0.self_attn.q_proj.bias": torch.zeros(128)})
    with pytest.raises(BadTensor, match="q_proj.bias.*refused rather than ignored"):
        loading.load_dflash(d, target)
    d = with_tensors(copy("dflash", tmp_path / "b"), **{"lm_head.weight": torch.zeros(4096, 128)})
    with pytest.raises(BadTensor, match="lm_head.weight.*differs from the target's"):
        loading.load_dflash(d, target)
    d2t = torch.zeros(4096, dtype=torch.long)
    d2t[5] = 3
    d = with_tensors(copy("dflash", tmp_path / "c"), d2t=d2t)
    with pytest.raises(BadTensor, match="d2t.*not the identity"):
        loading.load_dflash(d, target)


# --- refusals through the CLI ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "edit", "needle"), [
    ("dspark", {"markov_head_type": "gated"}, "markov_head_type"),
    ("dspark", {"draft_vocab_size": 1000}, "draft_vocab_size"),
    ("dflash2", {"sample_from_anchor": True}, "sample_from_anchor"),
    ("dflash", {"aux_hidden_state_layer_ids": [2, 3, 6]}, "aux_hidden_state_layer_ids"),
    ("dflash", {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}, "eagle_aux_hidden_state_layer_ids"),
])
def test_cli_exit_2_one_line(kind, edit, needle, tmp_path, monkeypatch):
    never_built(monkeypatch)
    d = copy(kind, tmp_path, **edit)
    rec = tmp_path / "rec.json"
    r = runner.invoke(app, ["gate", "run", GATE[kind], "--draft", str(d), "-n", "8", "--json", str(rec)],
                      catch_exceptions=False)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.output
    assert not rec.exists()


def test_cli_a_dspark_file_on_the_dflash_gate(tmp_path, monkeypatch):
    never_built(monkeypatch)
    r = runner.invoke(app, ["gate", "run", "qwen3-dflash", "--draft", str(FIXTURES / speculators_dir("dspark"))],
                      catch_exceptions=False)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "speculators_model_type" in r.output and "'dspark'" in r.output
