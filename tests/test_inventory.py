"""`bloomery inventory`: header-only groups, bytes, metadata and the draft-path verdict."""

from __future__ import annotations

import io
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from conftest import fixture_path
from rich.console import Console
from safetensors.torch import save_file

from bloomery_cli.inventory import (
    BLOCK_DRAFT,
    GROUPS,
    MTP_IN_FILE,
    MTP_SIDECAR,
    NONE,
    Inventory,
    inventory,
    inventory_command,
    render,
    to_markdown,
)
from bloomery_gates.errors import InputError, MissingFile, Refused

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H, I, V = 16, 32, 64


def z(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


def hf_layer(prefix: str) -> dict[str, torch.Tensor]:
    t = {f"{prefix}input_layernorm.weight": z(H), f"{prefix}post_attention_layernorm.weight": z(H)}
    for p in ("q", "k", "v", "o"):
        t[f"{prefix}self_attn.{p}_proj.weight"] = z(H, H)
    t[f"{prefix}mlp.gate_proj.weight"] = z(I, H)
    t[f"{prefix}mlp.up_proj.weight"] = z(I, H)
    t[f"{prefix}mlp.down_proj.weight"] = z(H, I)
    return t


def hf_qwen3(layers: int = 2) -> dict[str, torch.Tensor]:
    t = {"model.embed_tokens.weight": z(V, H), "model.norm.weight": z(H), "lm_head.weight": z(V, H)}
    for i in range(layers):
        t.update(hf_layer(f"model.layers.{i}."))
    return t


def write_dir(d: Path, tensors: dict[str, torch.Tensor], config: dict | None, shards: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"))
        return d
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(d / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def write_gguf(path: Path, arch: str, tensors: dict[str, np.ndarray], ints: dict[str, int]) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in ints.items():
        w.add_uint32(k, v)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def g_block(i: int, moe: bool = False, n_exp: int = 4) -> dict[str, np.ndarray]:
    f = np.zeros
    t = {f"blk.{i}.attn_norm.weight": f(H, np.float32), f"blk.{i}.attn_q.weight": f((H, H), np.float32),
         f"blk.{i}.attn_k.weight": f((H, H), np.float32), f"blk.{i}.attn_v.weight": f((H, H), np.float32),
         f"blk.{i}.attn_output.weight": f((H, H), np.float32), f"blk.{i}.ffn_norm.weight": f(H, np.float32)}
    if moe:
        t[f"blk.{i}.ffn_gate_inp.weight"] = f((n_exp, H), np.float32)
        t[f"blk.{i}.ffn_gate_exps.weight"] = f((n_exp, I, H), np.float32)
        t[f"blk.{i}.ffn_up_exps.weight"] = f((n_exp, I, H), np.float32)
        t[f"blk.{i}.ffn_down_exps.weight"] = f((n_exp, H, I), np.float32)
        t[f"blk.{i}.ffn_gate_shexp.weight"] = f((I, H), np.float32)
        t[f"blk.{i}.ffn_up_shexp.weight"] = f((I, H), np.float32)
        t[f"blk.{i}.ffn_down_shexp.weight"] = f((H, I), np.float32)
        t[f"blk.{i}.ffn_gate_inp_shexp.weight"] = f(H, np.float32)
    else:
        t[f"blk.{i}.ffn_gate.weight"] = f((I, H), np.float32)
        t[f"blk.{i}.ffn_up.weight"] = f((I, H), np.float32)
        t[f"blk.{i}.ffn_down.weight"] = f((H, I), np.float32)
    return t


def g_trunk(blocks: int, **kw) -> dict[str, np.ndarray]:
    t = {"token_embd.weight": np.zeros((V, H), np.float32), "output_norm.weight": np.zeros(H, np.float32),
         "output.weight": np.zeros((V, H), np.float32)}
    for i in range(blocks):
        t.update(g_block(i, **kw))
    return t


def by_name(m) -> dict[str, str]:
    return {t.name: t.group for t in m.tensors}


def text(inv: Inventory) -> str:
    buf = io.StringIO()
    render(inv, Console(file=buf, width=200, no_color=True))
    return buf.getvalue()


# -- verdicts -----------------------------------------------------------------------------------------


def test_qwen3_dense_hf_is_none(tmp_path):
    d = write_dir(tmp_path / "q3", hf_qwen3(), {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                                "num_hidden_layers": 2})
    m = inventory([d]).models[0]
    assert m.verdict == NONE
    g = by_name(m)
    assert g["model.embed_tokens.weight"] == "token_embd"
    assert g["lm_head.weight"] == g["model.norm.weight"] == "output"
    assert g["model.layers.0.self_attn.q_proj.weight"] == g["model.layers.0.input_layernorm.weight"] == "attn"
    assert g["model.layers.1.mlp.down_proj.weight"] == "ffn_dense"
    assert g["model.layers.1.post_attention_layernorm.weight"] == "ffn_dense"
    assert m.group_bytes("mtp_nextn") == 0 and m.moe_blocks == []
    assert sum(b for _, b in m.groups.values()) == m.total_bytes
    assert m.total_bytes == sum(t.numel() * 2 for t in hf_qwen3().values())
    # untied: token_embd is a row lookup, left out of the active bytes
    assert m.active_bytes == m.total_bytes - m.group_bytes("token_embd")
    assert "mtp" in " ".join(m.why)
    out = text(inventory([d]))
    assert "verdict: none" in out and "model.layers.0.self_attn.q_proj.weight" in out


def test_mtp_tensors_hf_in_file(tmp_path):
    t = hf_qwen3()
    t.update({"mtp.fc.weight": z(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": z(H),
              "mtp.pre_fc_norm_hidden.weight": z(H), "mtp.norm.weight": z(H)})
    t.update(hf_layer("mtp.layers.0."))
    cfg = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 2, "mtp_num_hidden_layers": 1}}
    m = inventory([write_dir(tmp_path / "q38", t, cfg)]).models[0]
    assert m.verdict == MTP_IN_FILE
    mtp = set(m.names("mtp_nextn"))
    assert mtp == {n for n in t if n.startswith("mtp.")}
    assert m.nextn_layers == 1 and m.block_count == 2
    assert "mtp.fc.weight" in " ".join(m.why)
    # the active bytes of the target leave the draft out
    assert m.active_bytes == m.total_bytes - m.group_bytes("token_embd") - m.group_bytes("mtp_nextn")


def test_mtp_in_file_without_a_drafter_says_so(tmp_path):
    t = hf_qwen3()
    t["model.mtp_layers.0.input_proj.weight"] = z(H, 2 * H)
    t["model.mtp_layers.0.token_layernorm.weight"] = z(H)
    m = inventory([write_dir(tmp_path / "mimo", t, {"model_type": "mimo", "num_hidden_layers": 2,
                                                     "num_nextn_predict_layers": 1})]).models[0]
    assert m.verdict == MTP_IN_FILE
    assert set(m.names("mtp_nextn")) == {"model.mtp_layers.0.input_proj.weight",
                                         "model.mtp_layers.0.token_layernorm.weight"}
    assert any("no MTP drafter here yet" in w for w in m.why)


def test_deepseek_glm_nextn_layer_past_num_hidden_layers(tmp_path):
    t = hf_qwen3(2)
    t.update(hf_layer("model.layers.2."))
    for n in ("enorm", "hnorm"):
        t[f"model.layers.2.{n}.weight"] = z(H)
    t["model.layers.2.eh_proj.weight"] = z(H, 2 * H)
    t["model.layers.2.shared_head.norm.weight"] = z(H)
    d = write_dir(tmp_path / "glm", t, {"model_type": "glm4_moe", "num_hidden_layers": 2,
                                         "num_nextn_predict_layers": 1})
    m = inventory([d]).models[0]
    assert m.verdict == MTP_IN_FILE and m.mtp_blocks == [2]
    assert set(m.names("mtp_nextn")) == {n for n in t if n.startswith("model.layers.2.")}
    assert any("num_hidden_layers 2" in w for w in m.why)
    # without config.json the enorm/hnorm/eh_proj markers decide the layer
    (d / "config.json").unlink()
    m = inventory([d]).models[0]
    assert m.verdict == MTP_IN_FILE and m.mtp_blocks == [2]
    assert any("config.json" in n for n in m.notes)


def test_gguf_nextn_blocks_in_file(tmp_path):
    t = g_trunk(3)
    t["blk.2.nextn.eh_proj.weight"] = np.zeros((H, 2 * H), np.float32)
    for n in ("enorm", "hnorm", "shared_head_norm"):
        t[f"blk.2.nextn.{n}.weight"] = np.zeros(H, np.float32)
    p = write_gguf(tmp_path / "q38.gguf", "qwen35", t, {"qwen35.block_count": 3, "qwen35.nextn_predict_layers": 1})
    m = inventory([p]).models[0]
    assert m.verdict == MTP_IN_FILE
    assert m.block_count == 3 and m.nextn_layers == 1 and m.mtp_blocks == [2]
    assert set(m.names("mtp_nextn")) == {n for n in t if n.startswith("blk.2.")}
    assert by_name(m)["blk.1.attn_q.weight"] == "attn"
    assert any("qwen35.nextn_predict_layers 1" in w for w in m.why)
    assert m.meta["qwen35.nextn_predict_layers"] == 1


def test_gguf_nextn_key_without_tensors_is_none(tmp_path):
    p = write_gguf(tmp_path / "x.gguf", "qwen35", g_trunk(2), {"qwen35.block_count": 3,
                                                                 "qwen35.nextn_predict_layers": 1})
    m = inventory([p]).models[0]
    assert m.verdict == NONE and "stripped" in " ".join(m.why)


def test_gguf_moe_groups_and_active_bytes(tmp_path):
    t = g_trunk(1)
    t.update(g_block(1, moe=True, n_exp=4))
    p = write_gguf(tmp_path / "moe.gguf", "qwen35moe", t,
                   {"qwen35moe.block_count": 2, "qwen35moe.expert_count": 4, "qwen35moe.expert_used_count": 2})
    m = inventory([p]).models[0]
    g = by_name(m)
    assert m.moe_blocks == [1]
    assert g["blk.0.ffn_gate.weight"] == g["blk.0.ffn_norm.weight"] == "ffn_dense"
    assert g["blk.1.ffn_gate_inp.weight"] == g["blk.1.ffn_norm.weight"] == "router"
    assert g["blk.1.ffn_up_exps.weight"] == "ffn_exps_routed"
    assert g["blk.1.ffn_up_shexp.weight"] == g["blk.1.ffn_gate_inp_shexp.weight"] == "ffn_shexp"
    assert g["output.weight"] == g["output_norm.weight"] == "output"
    routed = 3 * 4 * I * H * 4
    assert m.group_bytes("ffn_exps_routed") == routed
    shapes = {t.name: t.shape for t in m.tensors}
    assert shapes["blk.1.ffn_up_exps.weight"] == (4, I, H)
    assert (m.n_routed, m.n_used) == (4, 2)
    dense = m.total_bytes - routed - m.group_bytes("token_embd")
    assert m.active_bytes == dense + routed // 2
    assert m.verdict == NONE


def test_hf_moe_experts_and_missing_used_count(tmp_path):
    t = hf_qwen3(1)
    p = "model.layers.1."
    t.update({p + "input_layernorm.weight": z(H), p + "post_attention_layernorm.weight": z(H),
              p + "self_attn.q_proj.weight": z(H, H), p + "mlp.gate.weight": z(4, H),
              p + "mlp.shared_expert.up_proj.weight": z(I, H), p + "mlp.shared_expert_gate.weight": z(1, H)})
    for e in range(4):
        for w in ("gate_proj", "up_proj"):
            t[f"{p}mlp.experts.{e}.{w}.weight"] = z(I, H)
        t[f"{p}mlp.experts.{e}.down_proj.weight"] = z(H, I)
    d = write_dir(tmp_path / "moe", t, {"model_type": "qwen3_moe", "num_hidden_layers": 2,
                                         "num_experts": 4, "num_experts_per_tok": 1})
    m = inventory([d]).models[0]
    g = by_name(m)
    assert m.moe_blocks == [1]
    assert g[p + "mlp.gate.weight"] == g[p + "post_attention_layernorm.weight"] == "router"
    assert g[p + "mlp.experts.3.down_proj.weight"] == "ffn_exps_routed"
    assert g[p + "mlp.shared_expert.up_proj.weight"] == g[p + "mlp.shared_expert_gate.weight"] == "ffn_shexp"
    routed = m.group_bytes("ffn_exps_routed")
    assert routed == 4 * 3 * I * H * 2
    assert m.active_bytes == m.total_bytes - m.group_bytes("token_embd") - routed + routed // 4
    # no experts-per-token key: the active bytes are unknown, and say why; the count comes from the names
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_experts_per_tok"], cfg["num_experts"]
    (d / "config.json").write_text(json.dumps(cfg))
    m = inventory([d]).models[0]
    assert m.active_bytes is None and "experts-per-token" in m.active_why and m.n_routed == 4


def test_dflash_draft_dir_is_block_draft(tmp_path):
    t = {"fc.weight": z(H, 2 * H), "hidden_norm.weight": z(H), "norm.weight": z(H)}
    t.update(hf_layer("layers.0."))
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1,
           "block_size": 8, "dflash_config": {"mask_token_id": 1, "target_layer_ids": [0, 1]}}
    m = inventory([write_dir(tmp_path / "dflash", t, cfg)]).models[0]
    assert m.verdict == BLOCK_DRAFT and "DFlashDraftModel" in " ".join(m.why)
    assert by_name(m)["layers.0.self_attn.q_proj.weight"] == "attn"
    assert m.group_bytes("mtp_nextn") == 0


def test_gguf_dflash_arch_is_block_draft(tmp_path):
    p = write_gguf(tmp_path / "dspark.gguf", "dflash", g_trunk(1), {"dflash.block_count": 1})
    m = inventory([p]).models[0]
    assert m.verdict == BLOCK_DRAFT and "'dflash'" in " ".join(m.why)


def test_sidecar_known_type_and_mtp_only_file(tmp_path):
    trunk = write_gguf(tmp_path / "mimo.gguf", "mimo2", g_trunk(2), {"mimo2.block_count": 2})
    side = {f"blk.2.nextn.{n}.weight": np.zeros(H, np.float32) for n in ("enorm", "hnorm")}
    side["blk.2.nextn.eh_proj.weight"] = np.zeros((H, 2 * H), np.float32)
    side_p = write_gguf(tmp_path / "mimo-mtp.gguf", "mimo2", side, {"mimo2.block_count": 3,
                                                                    "mimo2.nextn_predict_layers": 1})
    inv = inventory([trunk, side_p])
    assert inv.verdicts == [MTP_SIDECAR, MTP_SIDECAR]
    assert "separate file" in " ".join(inv.models[0].why)
    assert "no trunk" in " ".join(inv.models[1].why)
    assert inv.models[1].group_bytes("mtp_nextn") == inv.models[1].total_bytes


# -- shards and inputs ------------------------------------------------------------------------------------


def test_shards_files_index_and_dir_agree(tmp_path):
    t = hf_qwen3(3)
    d = write_dir(tmp_path / "sh", t, {"model_type": "qwen3", "num_hidden_layers": 3}, shards=3)
    shards = sorted(d.glob("model-*.safetensors"))
    a = inventory([d]).models[0]
    b = inventory(shards).models[0]
    c = inventory([d / "model.safetensors.index.json"]).models[0]
    for m in (a, b, c):
        assert len(m.files) == 3 and len(m.tensors) == len(t)
        assert m.groups == a.groups and m.verdict == NONE
        assert m.block_count == 3
    part = inventory(shards[:2]).models[0]
    assert any("2 of 3 shards" in n for n in part.notes)
    assert "model-00002-of-00003.safetensors" in text(inventory(shards))


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(MissingFile, match="nope.gguf"):
        inventory([tmp_path / "nope.gguf"])
    pkl = tmp_path / "pytorch_model.bin"
    pkl.write_bytes(b"\x80\x04junk")
    with pytest.raises(Refused, match="pytorch_model.bin"):
        inventory([pkl])
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    with pytest.raises(InputError, match="notes.txt.*not a GGUF or safetensors"):
        inventory([txt])
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(InputError, match="broken.gguf"):
        inventory([bad])
    bad_st = tmp_path / "broken.safetensors"
    bad_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(InputError, match="broken.safetensors"):
        inventory([bad_st])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="empty"):
        inventory([empty])
    with pytest.raises(InputError):
        inventory([])
    with pytest.raises(InputError, match="missing.gguf"):
        inventory_command([tmp_path / "missing.gguf"], None, Console(file=io.StringIO()))


def test_markdown_written_atomically(tmp_path):
    t = hf_qwen3()
    t["mtp.fc.weight"] = z(H, 2 * H)
    d = write_dir(tmp_path / "m", t, {"model_type": "qwen3_5", "num_hidden_layers": 2})
    out = tmp_path / "docs" / "inv.md"
    buf = io.StringIO()
    inv = inventory_command([d], out, Console(file=buf, width=200))
    md = out.read_text()
    assert md == to_markdown(inv)
    assert "**verdict: MTP in-file**" in md and "| `mtp.fc.weight` |" in md
    assert all(f"| {g} |" in md for g in GROUPS)
    assert list(out.parent.iterdir()) == [out]     # no temp file left behind
    assert "verdict:" in buf.getvalue()
    with pytest.raises(InputError, match="directory"):
        inventory_command([d], tmp_path, Console(file=io.StringIO()))


# -- the real fixtures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["qwen3-tiny.gguf", "qwen3-tiny/model.safetensors", "qwen3-tiny"])
def test_fixture_targets(rel):
    p = fixture_path(rel)
    if not p.exists():
        pytest.skip(f"{p} absent")
    m = inventory([p]).models[0]
    assert m.verdict == NONE
    assert m.block_count == 6 and m.moe_blocks == [] and m.group_bytes("mtp_nextn") == 0
    assert m.groups["attn"][1] > 0 and m.groups["ffn_dense"][1] > 0 and m.groups["token_embd"][1] > 0
    assert m.group_bytes("other") == 0
    # tied head: token_embd is read as the head, so it counts toward the active bytes
    assert m.active_bytes == m.total_bytes
    assert "verdict: none" in text(inventory([p]))


@pytest.mark.parametrize("rel", ["qwen3-tiny-dflash-b8", "qwen3-tiny-dflash2-b8", "qwen3-tiny-dspark-b7"])
def test_fixture_drafts(rel):
    p = FIXTURES / rel
    if not p.exists():
        pytest.skip(f"{p} absent")
    assert inventory([p]).verdicts == [BLOCK_DRAFT]


def test_fixture_mtp_files_if_present():
    """Any qwen38 fixture with MTP tensors (issue 4 item 5) puts them under mtp_nextn, verdict MTP in-file."""
    found = [p for p in sorted(FIXTURES.glob("qwen38*")) if p.is_dir() or p.suffix == ".gguf"]
    found = [p for p in found if p.suffix == ".gguf" or (p / "config.json").is_file()]
    targets = []
    for p in found:
        inv = inventory([p])
        if inv.models[0].group_bytes("mtp_nextn"):
            targets.append(p)
            assert inv.verdicts == [MTP_IN_FILE]
    if not targets:
        pytest.skip("no qwen38 fixture with MTP tensors yet")


def test_mimo2_three_mtp_layers_in_file(tmp_path):
    """MiMo-V2's model.mtp.layers.{0,1,2}: MTP in-file, 3 layers, drafted by gate mimo2-mtp."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from mimo2_factory import write as write_mimo2

    m = inventory([write_mimo2(tmp_path / "mimo2")]).models[0]
    assert m.verdict == MTP_IN_FILE
    why = " ".join(m.why)
    assert "3 MTP layers" in why and "gate mimo2-mtp" in why
    assert all(n.startswith("model.mtp.layers.") for n in m.names("mtp_nextn"))
