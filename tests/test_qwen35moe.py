"""qwen35moe (Qwen3.5/3.6-MoE): reference vs HF transformers (true f64), engine vs reference (f32), the target checks
with the tier-1 routing lines, the HF reader (fused and per-expert experts, named errors), the MTP head with a MoE
layer, and FAIL-first plants (shared-expert gate dropped)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_qwen38 import FULL, LIN, make_qwen38

from bloomery_cli import bands
from bloomery_cli.contract import Report
from bloomery_cli.loading import load_mtp, load_target
from bloomery_gates.errors import BadConfig, BadTensor
from bloomery_gates.gates.targets import check_target
from bloomery_gates.kernels.drafts.mtp import MTPDraft
from bloomery_gates.kernels.families.qwen35moe import model as kq
from bloomery_gates.kernels.ops import moe as kmoe
from bloomery_gates.reference.drafts import mtp as ref_mtp
from bloomery_gates.reference.families.qwen35moe import model as rq
from bloomery_gates.registry import FAMILIES
from bloomery_gates.spec import MoEShape, MTPSpec, Qwen35MoeSpec

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
MOE = MoEShape(num_experts=6, top_k=2, expert_ff=16, shared_ff=24, shared_gated=True)
IDS = [int(x) for x in np.random.default_rng(1).integers(0, 97, 40)]


def moe_tensors(gen: torch.Generator, prefix: str, hidden: int, moe: MoEShape = MOE) -> dict[str, torch.Tensor]:
    def r(*s, sc=0.3):
        return torch.randn(*s, generator=gen) * sc

    e, ff, sff, m = moe.num_experts, moe.expert_ff, moe.shared_ff, prefix + "mlp."
    return {m + "gate.weight": r(e, hidden, sc=0.5), m + "experts.gate_up_proj": r(e, 2 * ff, hidden),
            m + "experts.down_proj": r(e, hidden, ff), m + "shared_expert.gate_proj.weight": r(sff, hidden),
            m + "shared_expert.up_proj.weight": r(sff, hidden), m + "shared_expert.down_proj.weight": r(hidden, sff),
            m + "shared_expert_gate.weight": r(1, hidden)}


def make_qwen35moe(seed: int = 0, types=(LIN, FULL, LIN), tied: bool = True, mtp: bool = False) -> Qwen35MoeSpec:
    """make_qwen38's tiny hybrid with each dense MLP replaced by a 6-expert top-2 MoE (and an MTP head)."""
    base = make_qwen38(seed, types=types, tied=tied)
    gen = torch.Generator().manual_seed(seed + 100)
    t = {n: v for n, v in base.tensors.items() if ".mlp." not in n}
    for i in range(len(types)):
        t.update(moe_tensors(gen, f"model.layers.{i}.", base.hidden_size))
    if mtp:
        one = make_qwen38(seed + 1, types=(FULL,))
        t.update({n.replace("model.layers.0.", "mtp.layers.0."): v for n, v in one.tensors.items()
                  if n.startswith("model.layers.0.") and ".mlp." not in n})
        t.update(moe_tensors(gen, "mtp.layers.0.", base.hidden_size))
        h = base.hidden_size
        t.update({"mtp.fc.weight": torch.randn(h, 2 * h, generator=gen) * 0.2, "mtp.norm.weight": torch.randn(h) * 0.1,
                  "mtp.pre_fc_norm_embedding.weight": torch.randn(h) * 0.1,
                  "mtp.pre_fc_norm_hidden.weight": torch.randn(h) * 0.1})
    layer = dataclasses.replace(base.layer, intermediate_size=MOE.expert_ff)
    hy = dataclasses.replace(base.hybrid, mtp_num_hidden_layers=int(mtp))
    return Qwen35MoeSpec(family="qwen35moe", source=Path("memory"), source_format="hf", layer=layer,
                         num_layers=base.num_layers, vocab_size=base.vocab_size, tie_word_embeddings=tied,
                         max_position=4096, tensors=t, hybrid=hy, moe=MOE)


def mtp_of(spec: Qwen35MoeSpec) -> MTPSpec:
    return MTPSpec(kind="mtp", source=spec.source, source_format="hf", layer=spec.layer,
                   rotary_dim=spec.hybrid.rotary_dim, num_layers=1, vocab_size=spec.vocab_size,
                   tensors={n: v for n, v in spec.tensors.items() if n.startswith("mtp.")})


# ------------------------------------------------------------------------------------------- tier 3 / reference

@needs_hf
@pytest.mark.parametrize("tied,types", [(True, (LIN, FULL, LIN)), (False, (FULL, LIN, LIN, FULL))])
def test_reference_equals_hf_qwen3_5_moe_f64(tied, types):
    from bloomery_cli.families.qwen35moe.oracle import hf_qwen35moe

    spec = make_qwen35moe(tied=tied, types=types)
    ref, hf = rq.forward(spec, IDS), hf_qwen35moe(spec, IDS)
    assert bands.worst_rel(ref.logits, hf.logits) < 1e-10
    assert bands.worst_rel(rq.hf_hidden_states(ref), hf.hidden_states) < 1e-10


@needs_hf
def test_mtp_reference_equals_hf_mtp_model_f64():
    from bloomery_gates.gates.qwen38_mtp import hf_mtp_logits

    spec = make_qwen35moe(mtp=True, types=(LIN, LIN, FULL))      # HF's MtpModel copies the last layer: a full one
    hf = hf_mtp_logits(spec, mtp_of(spec), IDS)
    if hf is None:
        pytest.skip("the installed transformers has no MtpModel for this layout")
    ours = ref_mtp.teacher_forced(mtp_of(spec), spec, IDS, rq.forward(spec, IDS).final)
    assert bands.worst_rel(ours.logits, hf) < 1e-10


# ------------------------------------------------------------------------------------------- kernels

def test_engine_and_train_forward_match_reference_and_target_checks_pass():
    spec = make_qwen35moe()
    ref = rq.forward(spec, IDS)
    logits, _ = kq.forward_train(spec.tensors, spec, torch.tensor([IDS]), chunk=16)
    assert bands.worst_rel(logits[0].double().numpy(), ref.logits) < 1e-5
    eng = kq.Qwen35MoeTarget(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(IDS[:20], logits=True)
    assert bands.worst_rel(p.logits.double().numpy(), ref.logits[:20]) < 1e-5
    assert sorted(p.routing) == [0, 1, 2] and p.routing[0].ids.shape == (20, 2)
    v = eng.verify(IDS[20:24], logits=True)
    assert bands.worst_rel(v.logits.double().numpy(), ref.logits[20:24]) < 1e-5
    report = Report("t", emit=lambda line: None)
    check_target(report, FAMILIES["qwen35moe"], spec, p, rq.forward(spec, IDS[:20]), "f32", IDS[:20])
    assert report.failed == 0, report.lines
    assert sum(1 for line in report.lines if "chosen experts [20x2]" in line) == 3
    load = report.facts["expert_load"]["target layer 0"]
    assert sum(load) == 40 and sum(1 for c in load if c) >= 3


def test_mtp_draft_with_moe_layer_matches_reference():
    spec = make_qwen35moe(mtp=True)
    mtp = mtp_of(spec)
    eng = kq.Qwen35MoeTarget(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(IDS[:20], logits=True)
    d = MTPDraft(mtp, eng, 64, 3)
    d.prompt(p.taps)
    got = d.propose(p.argmax[-1], detail=True)
    ref = ref_mtp.draft(mtp, spec, IDS[:20], rq.forward(spec, IDS[:20]).final, p.argmax[-1], 3, chain_ids=got.ids)
    # the f32 chain band of the MTP layer and head over the 20-row context (derived, not a hand-picked 1e-5: the
    # kernel's f32 sums change order with the thread count, and 1e-5 failed by 6% on 2 threads)
    band = bands.logits_band("f32", spec.layer, 1, 20)
    assert bands.worst_rel(got.logits.double().numpy(), ref.logits) < band.value


def test_fail_first_shared_expert_gate_dropped(monkeypatch):
    spec = make_qwen35moe()
    real = kmoe.shared_expert
    monkeypatch.setattr(kmoe, "shared_expert", lambda x, g, u, d, gate: real(x, g, u, d, None))
    eng = kq.Qwen35MoeTarget(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(IDS[:20], logits=True)
    report = Report("t", emit=lambda line: None)
    check_target(report, FAMILIES["qwen35moe"], spec, p, rq.forward(spec, IDS[:20]), "f32", IDS[:20])
    assert report.finish() == 1
    assert any(line.startswith("(r) target layer 0 out") and line.endswith("FAIL") for line in report.lines)


def test_fail_first_choice_order_swapped_is_caught_by_tier1():
    spec = make_qwen35moe()
    eng = kq.Qwen35MoeTarget(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(IDS[:20], logits=True)
    report = Report("t", emit=lambda line: None)
    from bloomery_gates.gates.moe_checks import chosen_experts, softmax_rule
    routing = p.routing[0]
    flipped = kmoe.Routing(routing.ids.flip(-1), routing.weights, routing.choice)   # order within the top-k swapped
    chosen_experts(report, "target layer 0", flipped, softmax_rule(2))
    assert report.finish() == 1


# ------------------------------------------------------------------------------------------- reader

def write_hf(tmp: Path, spec: Qwen35MoeSpec, per_expert: bool = False, **over) -> Path:
    s, hy, m = spec.layer, spec.hybrid, spec.moe
    cfg = {"model_type": "qwen3_5_moe_text", "hidden_size": s.hidden_size, "num_hidden_layers": spec.num_layers,
           "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
           "vocab_size": spec.vocab_size, "linear_num_key_heads": hy.linear_num_key_heads,
           "linear_num_value_heads": hy.linear_num_value_heads, "linear_key_head_dim": hy.linear_key_head_dim,
           "linear_value_head_dim": hy.linear_value_head_dim, "linear_conv_kernel_dim": hy.linear_conv_kernel_dim,
           "layer_types": list(hy.layer_types), "rms_norm_eps": s.rms_eps, "tie_word_embeddings": True,
           "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta,
                               "partial_rotary_factor": hy.partial_rotary_factor},
           "num_experts": m.num_experts, "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.expert_ff,
           "shared_expert_intermediate_size": m.shared_ff, "mtp_num_hidden_layers": hy.mtp_num_hidden_layers, **over}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg))
    t = {n: v.contiguous() for n, v in spec.tensors.items()}
    if per_expert:
        for n in [n for n in t if n.endswith("experts.gate_up_proj")]:
            base, gu, dn = n[:-len("gate_up_proj")], t.pop(n), t.pop(n[:-len("gate_up_proj")] + "down_proj")
            ff = dn.shape[-1]
            for e in range(gu.shape[0]):
                t[f"{base}{e}.gate_proj.weight"] = gu[e, :ff].contiguous()
                t[f"{base}{e}.up_proj.weight"] = gu[e, ff:].contiguous()
                t[f"{base}{e}.down_proj.weight"] = dn[e].contiguous()
    save_file(t, str(tmp / "model.safetensors"))
    return tmp


@pytest.mark.parametrize("per_expert", [False, True])
def test_reader_round_trip(tmp_path, per_expert):
    spec = make_qwen35moe(mtp=True)
    got = load_target(write_hf(tmp_path / "m", spec, per_expert))
    assert got.family == "qwen35moe" and got.moe == spec.moe
    for n, v in spec.tensors.items():
        if not n.startswith("mtp."):
            assert torch.equal(got.tensors[n], v), n
    mtp = load_mtp(got.source, got)
    assert torch.equal(mtp.tensors["mtp.layers.0.mlp.experts.gate_up_proj"],
                       spec.tensors["mtp.layers.0.mlp.experts.gate_up_proj"])


def test_reader_named_errors(tmp_path):
    spec = make_qwen35moe()
    with pytest.raises(BadConfig, match="norm_topk_prob"):
        load_target(write_hf(tmp_path / "a", spec, norm_topk_prob=False))
    with pytest.raises(BadConfig, match="num_experts_per_tok"):
        load_target(write_hf(tmp_path / "b", spec, num_experts_per_tok=9))
    with pytest.raises(BadTensor, match="experts.gate_up_proj"):
        load_target(write_hf(tmp_path / "c", spec, moe_intermediate_size=8))


# ------------------------------------------------------------------------------------------- GGUF layout

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures"
needs_fixture = pytest.mark.skipif(not (FIXTURE / "qwen35moe-tiny").is_dir(), reason="no fixtures/qwen35moe-tiny")


@pytest.fixture(scope="module")
def fixture_gguf(tmp_path_factory) -> Path:
    from bloomery_cli.families.qwen35moe.fixture import export_gguf
    return export_gguf(FIXTURE, tmp_path_factory.mktemp("gguf") / "qwen35moe-tiny.gguf")


@needs_fixture
def test_gguf_reads_back_and_drafts_like_hf(fixture_gguf):
    from bloomery_cli.formats.gguf_file import GGUFFile
    from bloomery_cli.speculative import generate

    f = GGUFFile(fixture_gguf)
    assert f.meta("general.architecture") == "qwen35moe" and f.meta("qwen35moe.nextn_predict_layers") == 1
    assert "blk.0.ffn_gate_exps.weight" in f.tensor_names() and "blk.4.nextn.eh_proj.weight" in f.tensor_names()
    hf, gg = load_target(FIXTURE / "qwen35moe-tiny"), load_target(fixture_gguf)
    assert gg.family == "qwen35moe" and gg.moe == hf.moe and gg.num_layers == hf.num_layers
    assert gg.hybrid.linear_num_value_heads > gg.hybrid.linear_num_key_heads      # the V-head regrouping ran
    for n in ("model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.0.mlp.experts.gate_up_proj",
              "model.layers.3.mlp.shared_expert_gate.weight"):
        assert torch.equal(gg.tensors[n], hf.tensors[n].float()), n
    prompt = json.loads((FIXTURE / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    runs = []
    for t in (hf, gg):
        eng = kq.Qwen35MoeTarget(t, "cpu", torch.float32, 200, rows=4)
        runs.append(generate(eng, MTPDraft(load_mtp(t.source, t), eng, 200, 3), prompt, 32).ids)
    assert runs[0] == runs[1]


@needs_fixture
def test_fail_first_gguf_value_heads_left_tiled(monkeypatch, fixture_gguf):
    """The reader skips undoing the converter's V-head tiling: kernel and reference agree on the wrong weights, so
    only llama.cpp on the same file (tier 3) can see it, and it must."""
    pytest.importorskip("llama_cpp")
    from bloomery_cli.families.qwen38 import reader as qwen38_reader
    from bloomery_cli.gate import GateOptions, run_gate
    from bloomery_gates.gates import GATES

    monkeypatch.setattr(qwen38_reader, "_untile_fn", lambda *a: (lambda x: x))
    lines: list[str] = []
    code, _ = run_gate(GATES["qwen35moe-mtp"], GateOptions(target=fixture_gguf, draft=fixture_gguf, n=16,
                                                           max_prompts=1, oracle=True), emit=lines.append)
    assert code == 1, "\n".join(lines)
    assert any(line.startswith("(o) host f64 logits") and "llama.cpp" in line and line.endswith("FAIL")
               for line in lines), "\n".join(lines)
