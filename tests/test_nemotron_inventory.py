"""The Nemotron-H fixture (HF checkpoint names and llama.cpp GGUF names): inventory groups, active bytes, the
draft-path verdict, and its plan (Mamba-2 state per slot, NoPE attention)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.families.nemotron import fixture as nemotron_h
from bloomery_cli.fixturegen.manifest import sha256_file
from bloomery_cli.inventory import MTP_IN_FILE, NONE, inventory
from bloomery_cli.plan.model import read_target

FIX = Path(__file__).resolve().parents[1] / "fixtures"
HF, GG = FIX / nemotron_h.HF_DIR, FIX / nemotron_h.GGUF_NAME


def test_groups_and_mtp_verdict_in_both_layouts():
    hf, gg = inventory([HF]).models[0], inventory([GG]).models[0]
    for m in (hf, gg):
        assert m.verdict == MTP_IN_FILE
        why = "; ".join(m.why)
        assert "draft-mtp" in why and "nemotron_h_moe" in why and "family nemotron" in why
        for g in ("attn", "ffn_dense", "router", "ffn_exps_routed", "ffn_shexp", "mtp_nextn", "token_embd", "output"):
            assert m.group_bytes(g) > 0, g
        assert m.group_bytes("other") == 0
    assert {g: b for g, (_, b) in hf.groups.items()} == {g: b for g, (_, b) in gg.groups.items()}
    assert hf.active_bytes == gg.active_bytes
    assert hf.moe_blocks == gg.moe_blocks == [1] and gg.mtp_blocks == [4]
    assert any(t.name == "backbone.layers.1.mixer.experts.7.up_proj.weight" for t in hf.tensors)
    assert any(t.name == "blk.4.nextn.eh_proj.weight" and t.group == "mtp_nextn" for t in gg.tensors)


def test_without_mtp_the_verdict_names_block_draft_or_lookup(tmp_path):
    d = tmp_path / "nomtp"
    shutil.copytree(HF, d)
    tensors = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if not k.startswith("mtp.")}
    save_file(tensors, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    m = inventory([d]).models[0]
    assert m.verdict == NONE
    assert "block draft" in "; ".join(m.why) and "n-gram lookup" in "; ".join(m.why)


def test_inventory_command_prints_groups_and_verdict():
    r = CliRunner().invoke(app, ["inventory", str(GG)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "ffn_exps_routed" in r.output and "verdict: MTP in-file" in r.output


def test_fixture_rebuilds_byte_for_byte(tmp_path):
    shutil.copy(FIX / "MANIFEST.json", tmp_path / "MANIFEST.json")
    for p in nemotron_h.build(tmp_path):
        assert sha256_file(p) == sha256_file(FIX / p.relative_to(tmp_path)), p.name


def test_plan_of_the_nemotron_fixture():
    for path in (HF, GG):
        t = read_target(path)
        assert t.family == "nemotron" and t.rotary_dim == 0 and t.attention_layers == 1
        (r,) = t.recurrent
        assert (r.kind, r.layers, r.state_f32, r.conv) == ("mamba2", 1, 4 * 16 * 16, 3 * (64 + 2 * 2 * 16))
        assert t.draft_elems > 0
    a, b = read_target(HF), read_target(GG)
    assert a.weight_elems == b.weight_elems and a.draft_elems == b.draft_elems
