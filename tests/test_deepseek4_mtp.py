"""deepseek4 (DeepSeek V4) in-file MTP block, issue 26: the device draft (kernels/families/deepseek4/mtp.py) held to
the float64 reference (reference/families/deepseek4/mtp.py) on a tiny random checkpoint made here
(tests/deepseek4_factory.py plus ``mtp.0.*``: a sliding, non-hash block, its own HC head), the reader's named
errors, and the gate ds4-mtp's FAIL-first plants in bf16 on the trained fixture (fixtures/ds4-tiny).

The draft runs after a 12-token prompt (the MTP window of 4 keys drops keys) and again after a verify that kept
only part of a window (the rollback: the chained rows' KV are rewritten from the target's streams)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import deepseek4_factory as fac
import numpy as np
import pytest
import torch

from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
from bloomery_cli.families.deepseek4.reader_mtp import deepseek4_mtp_from_file
from bloomery_gates.errors import BadTensor, Refused
from bloomery_gates.kernels.families.deepseek4.model import Deepseek4Target
from bloomery_gates.kernels.families.deepseek4.mtp import Deepseek4MTPDraft
from bloomery_gates.reference.families.deepseek4 import model as ref
from bloomery_gates.reference.families.deepseek4 import mtp as ref_mtp

WIDTH = 3


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def add_mtp(p: dict[str, torch.Tensor], seed: int = 7) -> None:
    """mtp.0.*: a sliding attention (layer 0's tensor kinds), a non-hash MoE (layer 1's), the mHC mixes and
    norms, its own HC head, enorm / hnorm / norm and e_proj / h_proj, all drawn fresh."""
    q = fac.params(seed)
    take = {"model.layers.0.": ("self_attn.", "attn_hc.", "ffn_hc.", "input_layernorm", "post_attention_layernorm"),
            "model.layers.1.": ("mlp.",)}
    for pre, keep in take.items():
        p.update({"mtp.0." + n[len(pre):]: v for n, v in q.items()
                  if n.startswith(pre) and n[len(pre):].startswith(keep) and ".compressor." not in n})
    p.update({"mtp.0.hc_head." + k: q["model.hc_head." + k] for k in ("hc_fn", "hc_base", "hc_scale")})
    g = torch.Generator().manual_seed(seed + 1)
    for n in ("enorm", "hnorm", "norm"):
        p[f"mtp.0.{n}.weight"] = 1.0 + 0.2 * torch.randn(fac.H, generator=g)
    for n in ("e_proj", "h_proj"):
        p[f"mtp.0.{n}.weight"] = torch.randn(fac.H, fac.H, generator=g) / fac.H ** 0.5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return fac.write(tmp_path_factory.mktemp("ds4mtp") / "f32", edit=add_mtp,
                     config={"num_nextn_predict_layers": 1})


def load(d: Path):
    target = deepseek4_from_hf(d)
    return target, deepseek4_mtp_from_file(d, target)


def test_reader_reads_the_block_and_names_its_errors(ckpt, tmp_path):
    target, mtp = load(ckpt)
    assert len(mtp.tensors) == len([n for n in target.tensors if n.startswith("mtp.")])
    bare = fac.write(tmp_path / "bare")
    t2 = deepseek4_from_hf(bare)
    with pytest.raises(BadTensor):
        deepseek4_mtp_from_file(bare, t2)

    def hashed(p):
        add_mtp(p)
        p["mtp.0.mlp.gate.tid2eid"] = p["model.layers.0.mlp.gate.tid2eid"].clone()
    d = fac.write(tmp_path / "hash", edit=hashed, config={"num_nextn_predict_layers": 1})
    with pytest.raises(Refused):
        deepseek4_mtp_from_file(d, deepseek4_from_hf(d))

    def short(p):
        add_mtp(p)
        p["mtp.0.e_proj.weight"] = p["mtp.0.e_proj.weight"][:, :-1].clone()
    d = fac.write(tmp_path / "short", edit=short, config={"num_nextn_predict_layers": 1})
    with pytest.raises(BadTensor, match="e_proj"):
        deepseek4_mtp_from_file(d, deepseek4_from_hf(d))


def test_draft_equals_reference_and_rolls_back(ckpt):
    """Two windows: the first after the prompt, the second after a verify that kept 2 of 4 rows; each drafted
    row's output streams and logits against the f64 reference on the engine's own streams, and the window KV of
    the real rows against the reference's."""
    target, mtp = load(ckpt)
    eng = Deepseek4Target(target, "cpu", torch.float32, 64, rows=WIDTH + 1)
    draft = Deepseek4MTPDraft(mtp, eng, 64, WIDTH)
    prompt = [int(i) for i in torch.randint(0, fac.V, (12,), generator=torch.Generator().manual_seed(3))]
    pre = eng.prefill(prompt)
    draft.prompt(pre.taps)
    got = draft.propose(pre.argmax[-1], detail=True)
    want = ref_mtp.draft(mtp, target, prompt, pre.taps[-1].double().numpy(), pre.argmax[-1], WIDTH, got.ids)
    assert rel(got.logits.numpy(), want.logits) < 1e-5
    assert rel(got.layer_out[0].numpy(), want.y) < 1e-5
    assert got.ids == list(want.ids)
    window = [pre.argmax[-1], *got.ids]
    v = eng.verify(window)
    eng.commit(2)
    draft.accept(2, v.taps)
    seq = prompt + window[:2]
    anchor = v.argmax[1]
    got2 = draft.propose(anchor, detail=True)
    streams = ref.forward(target, seq).hidden[-1]
    want2 = ref_mtp.draft(mtp, target, seq, streams, anchor, WIDTH, got2.ids)
    assert rel(got2.logits.numpy(), want2.logits) < 1e-4
    kv = ref_mtp.store_rows(mtp, target, seq + [anchor], streams)
    assert draft.store_rows().shape[0] == len(seq)
    assert rel(draft.store_rows().numpy(), kv) < 1e-4


def test_fail_first_swapped_halves_moves_the_reference_check(ckpt, monkeypatch):
    """The kernel with eh_proj's halves swapped (hidden first) drifts from the reference far past f32's 1e-5."""
    from bloomery_gates.kernels.families.deepseek4 import mtp as km

    target, mtp = load(ckpt)

    def swapped(t, e, h, eps):
        en = km.rms_norm(e, t["enorm.weight"], eps)[:, None, :].expand(-1, h.shape[1], -1)
        hn = km.rms_norm(h, t["hnorm.weight"], eps)
        return km.F.linear(torch.cat([hn, en], -1), torch.cat([t["e_proj.weight"], t["h_proj.weight"]], 1))

    monkeypatch.setattr(km, "eh_input", swapped)
    eng = Deepseek4Target(target, "cpu", torch.float32, 64, rows=WIDTH + 1)
    draft = Deepseek4MTPDraft(mtp, eng, 64, WIDTH)
    prompt = list(range(5, 17))
    pre = eng.prefill(prompt)
    draft.prompt(pre.taps)
    got = draft.propose(pre.argmax[-1], detail=True)
    want = ref_mtp.draft(mtp, target, prompt, pre.taps[-1].double().numpy(), pre.argmax[-1], WIDTH, got.ids)
    assert rel(got.logits.numpy(), want.logits) > 1e-2


# ---------------------------------------------------------------------------------------------- the gate, bf16

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ds4-tiny"
needs_fixture = pytest.mark.skipif(not (FIXTURE / "model.safetensors").is_file(), reason="fixtures/ds4-tiny not built")


def gate_lines(tmp_path, n: int = 8) -> tuple[int, list[str]]:
    """``bloomery gate run ds4-mtp --dtype bf16`` on the first fixture prompt: (exit code, printed lines)."""
    import json

    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    first = (FIXTURE.parent / "prompts.jsonl").read_text().splitlines()[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": json.loads(first)["ids"]}) + "\n")
    r = CliRunner().invoke(app, ["gate", "run", "ds4-mtp", "-n", str(n), "--prompts", str(prompts), "--dtype", "bf16"])
    return r.exit_code, r.output.splitlines()


def mtp_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith("(r) mtp row")]


def collapsed_hidden(monkeypatch) -> None:
    """The MTP fed the target's HC-head collapse (S copies of hyper_head(streams)) instead of the raw streams."""
    from bloomery_gates.kernels.families.deepseek4 import mtp as km

    real_init = km.Deepseek4MTPDraft.__init__

    def init(self, spec, target, *a, **k):
        real_init(self, spec, target, *a, **k)
        self.planted_head = target.hc_head

    def collapse(self, h):
        x = km.kmhc.hyper_head(h, *self.planted_head, self.tspec.hc.eps, self.eps)
        return x[:, None, :].expand_as(h).contiguous()

    monkeypatch.setattr(km.Deepseek4MTPDraft, "__init__", init)
    monkeypatch.setattr(km.Deepseek4MTPDraft, "prompt",
                        lambda self, taps: self.start(taps[0][1:, 0], collapse(self, taps[-1])))
    monkeypatch.setattr(km.Deepseek4MTPDraft, "accept",
                        lambda self, kept, taps: self.queue(kept, taps[0][:, 0], collapse(self, taps[-1][:kept])))


def hidden_first(monkeypatch) -> None:
    """eh_proj's halves swapped: [hnorm(h) ; enorm(e)] into [e_proj | h_proj] (hidden first)."""
    from bloomery_gates.kernels.families.deepseek4 import mtp as km

    def swapped(t, e, h, eps):
        en = km.rms_norm(e, t["enorm.weight"], eps)[:, None, :].expand(-1, h.shape[1], -1)
        hn = km.rms_norm(h, t["hnorm.weight"], eps)
        return km.F.linear(torch.cat([hn, en], -1), torch.cat([t["e_proj.weight"], t["h_proj.weight"]], 1))

    monkeypatch.setattr(km, "eh_input", swapped)


@needs_fixture
def test_gate_mtp_lines_pass_in_bf16(tmp_path):
    code, lines = gate_lines(tmp_path)
    rows = mtp_lines(lines)
    assert len(rows) == 2 * WIDTH and all(x.endswith("PASS") for x in rows), "\n".join(lines)
    assert any(x.startswith("(r) state after") and "mtp store k = v" in x and x.endswith("PASS") for x in lines)
    routers = [x for x in lines if x.startswith("(r) mtp: draft routing of chained row ")]
    assert len(routers) == WIDTH and all(x.endswith("PASS") for x in routers), "\n".join(lines)


@needs_fixture
def test_fail_first_the_mtp_router_off_fails_its_choice_lines_in_bf16(tmp_path, monkeypatch):
    """The MTP's own router is checked as the target's are (gates/routing_flips.py): every row sent to the experts
    next to the ones it ranked is a FAIL on each chained row's choice line, and the gate exits 1. (Later chained rows
    excuse a few: their emulation continues with the wrong experts, so its scores, and the band, move far.)"""
    from dataclasses import replace

    from bloomery_gates.kernels.families.deepseek4 import mtp as km

    real = km.route_at
    monkeypatch.setattr(km, "route_at", lambda spec, t, m, kind, b, ids: (lambda r: replace(
        r, ids=(r.ids + 1) % spec.moe.num_experts))(real(spec, t, m, kind, b, ids)))
    code, lines = gate_lines(tmp_path)
    assert code == 1, "\n".join(lines)
    routers = [x for x in lines if x.startswith("(r) mtp: draft routing of chained row ")]
    assert len(routers) == WIDTH and all(x.endswith("FAIL") for x in routers), routers
    assert "56 checked, 56 differ, 0 excused" in routers[0], routers[0]     # the prompt's rows: none excused


@needs_fixture
@pytest.mark.parametrize("plant", [collapsed_hidden, hidden_first], ids=["hc-head-collapsed", "hidden-first"])
def test_fail_first_gate_exits_1_in_bf16(tmp_path, monkeypatch, plant):
    plant(monkeypatch)
    code, lines = gate_lines(tmp_path)
    assert code == 1, "\n".join(lines)
    assert any(x.endswith("FAIL") for x in mtp_lines(lines)), "\n".join(lines)


def test_a_deepseek4_gguf_without_its_keys_is_exit_2(tmp_path):
    """The registry reads arch deepseek4 as this family; a file with none of its keys: a named error, exit 2."""
    import gguf
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    path = tmp_path / "v4.gguf"
    w = gguf.GGUFWriter(str(path), "deepseek4")
    w.add_uint32("deepseek4.block_count", 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = CliRunner().invoke(app, ["gate", "run", "ds4-mtp", "--target", str(path), "--draft", str(path), "-n", "4"])
    assert r.exit_code == 2 and "deepseek4" in r.output and "Traceback" not in r.output, r.output


@needs_fixture
def test_fixture_length_uses_the_hash_layer_and_the_compressors():
    """On the first gate prompt (56 tokens: 14 CSA entries of which the indexer keeps 4, 3 HCA entries) the f64
    logits move by more than 1e-2 relative when a CSA / HCA layer is made sliding-only, when the indexer keeps every
    entry, or when the hash table is shifted by one token: every path carries weight at the fixture's length."""
    import dataclasses
    import json

    spec = deepseek4_from_hf(FIXTURE)
    ids = json.loads((FIXTURE.parent / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    base = ref.forward(spec, ids).logits
    variants = [dataclasses.replace(spec, layer_types=tuple("sliding" if j == l else t
                                                            for j, t in enumerate(spec.layer_types)))
                for l, k in enumerate(spec.layer_types) if k != "sliding"]
    variants.append(dataclasses.replace(spec, attn=dataclasses.replace(spec.attn, index_topk=10 ** 6)))
    t = {k: spec.tensors[k] for k in spec.tensors}
    t["model.layers.0.mlp.gate.tid2eid"] = torch.roll(t["model.layers.0.mlp.gate.tid2eid"], 1, 0)
    variants.append(dataclasses.replace(spec, tensors=t))
    assert len(ids) // spec.attn.csa_rate > spec.attn.index_topk and len(ids) // spec.attn.hca_rate >= 2
    assert all(rel(ref.forward(v, ids).logits, base) > 1e-2 for v in variants)


@needs_fixture
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_fixture_trunk_equals_hf_on_the_first_prompt():
    """The trained trunk's f64 reference against transformers' true-float64 forward (the gate's --oracle line) on
    the first prompt, band 1e-12 as tests/test_deepseek4_trunk.py. The indexer's ReLU scores can tie at exactly 0;
    with the fixture's 16 indexer heads no tie sits at a top-k boundary here (with 2 heads one did at 23 tokens and
    moved the logits 1.6e-2: transformers breaks ties in another order than ``topk_stable``)."""
    import json

    from bloomery_cli.families.deepseek4.oracle import hf_deepseek4_logits

    spec = deepseek4_from_hf(FIXTURE)
    ids = json.loads((FIXTURE.parent / "prompts.jsonl").read_text().splitlines()[0])["ids"]
    assert rel(ref.forward(spec, ids).logits, hf_deepseek4_logits(spec, ids)) < 1e-12
