"""DSpark (DRAFTERS.md section 4): kernel vs f64 reference, engine vs forward_train, the Markov head's
reductions, FAIL-first planted defects (DFlash's infill rows, Markov prev off by one), lossless
drafted runs with and without the confidence cut, the reader's named errors, the fixture trainer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_target, qwen3_config, random_layer, write_hf

from bloomery_cli.contract import Report
from bloomery_cli.fixturegen.train_dspark import DSparkShape, dspark_config, train_dspark, write_dspark
from bloomery_cli.gate import DraftCheck, GateOptions, run_gate
from bloomery_cli.loading import load_dspark
from bloomery_cli.speculative import generate
from bloomery_gates.errors import BadConfig, BadTensor, InputError, Mismatch
from bloomery_gates.gates import GATES, qwen3_dspark
from bloomery_gates.kernels.drafts.dspark import DSparkDraft, forward_train, keep_count, teacher_prev
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target
from bloomery_gates.kernels.families.qwen3.model import forward_train as target_train
from bloomery_gates.reference.drafts import dspark as ref_dspark
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3
from bloomery_gates.spec import DSparkSpec

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


def make_dspark(target, seed: int = 2, block: int = 5, rank: int = 6, confidence: bool = True,
                copies: bool = False, layer_ids=(0, 1), markov_scale: float = 0.6) -> DSparkSpec:
    gen = torch.Generator().manual_seed(seed)
    h, V = target.hidden_size, target.vocab_size
    t = {"fc.weight": torch.randn(h, len(layer_ids) * h, generator=gen) * 0.1, "hidden_norm.weight": torch.ones(h),
         "norm.weight": 1.0 + 0.1 * torch.randn(h, generator=gen)}
    random_layer(t, "layers.0.", target.layer, gen)
    if copies:
        t["embed_tokens.weight"] = torch.randn(V, h, generator=gen) * 0.5
        t["lm_head.weight"] = torch.randn(V, h, generator=gen) * 0.5
    if rank:
        t["markov_head.markov_w1.weight"] = torch.randn(V, rank, generator=gen) * markov_scale
        t["markov_head.markov_w2.weight"] = torch.randn(V, rank, generator=gen) * markov_scale
    if confidence:
        t["confidence_head.proj.weight"] = torch.randn(1, h + rank, generator=gen) * 0.3
        t["confidence_head.proj.bias"] = torch.full((1,), 0.5)
    return DSparkSpec(kind="dspark", source=Path("memory"), layer=target.layer, num_layers=1, block_size=block,
                      mask_token_id=V - 1, target_layer_ids=tuple(layer_ids), vocab_size=V, tensors=t,
                      markov_rank=rank, markov_head_type="vanilla", confidence=confidence)


def with_tensors(d: DSparkSpec, **changes) -> DSparkSpec:
    t = dict(d.tensors)
    t.update(changes)
    return DSparkSpec(**{**d.__dict__, "tensors": t})


def first_block(target, d, cls=DSparkDraft, cut: float = 0.0):
    eng = Qwen3Target(target, "cpu", torch.float32, 128, rows=d.block_size + 1)
    draft = cls(d, eng, 128, confidence_cut=cut)
    p = eng.prefill(PROMPT, logits=True)
    draft.prompt(p.taps)
    return eng, draft, p, draft.propose(p.argmax[-1], detail=True)


def close(got: torch.Tensor, want: np.ndarray, tol: float = 2e-5) -> None:
    g = got.detach().double().numpy()
    assert np.max(np.abs(g - want)) <= tol * max(1.0, np.max(np.abs(want))), np.max(np.abs(g - want))


@pytest.fixture
def target():
    return make_target()


@pytest.mark.parametrize("rank,confidence,copies", [(6, True, False), (6, True, True), (0, True, False),
                                                    (4, False, False)])
def test_kernel_matches_reference(target, rank, confidence, copies):
    d = make_dspark(target, rank=rank, confidence=confidence, copies=copies)
    _, _, p, got = first_block(target, d)
    ref = ref_dspark.forward(d, target, ref_qwen3.forward(target, PROMPT), p.argmax[-1])   # free-running chain
    assert got.drafts == ref.ids.tolist() and got.prev.tolist() == ref.prev.tolist()
    assert len(got.drafts) == d.block_size and got.prev[0] == p.argmax[-1]
    close(got.logits, ref.logits)
    close(got.layer_out, ref.layer_out)
    if confidence:
        close(got.conf_logits, ref.conf_logits)
        close(got.confidence, ref.confidence)
    else:
        assert got.conf_logits is None and np.all(ref.confidence == 1.0)


def test_forward_train_matches_engine(target):
    d = make_dspark(target)
    ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(4))
    _, hidden = target_train(target.tensors, target, ids)
    anchors = torch.tensor([[5, 9, 16]])
    eng = Qwen3Target(target, "cpu", torch.float32, max_len=64)
    draft = DSparkDraft(d, eng, max_len=64)
    taps = torch.stack([h[0] for h in hidden])
    got = []
    for s in anchors[0].tolist():
        draft.prompt(taps[:, :s])
        got.append(draft.propose(int(ids[0, s]), detail=True))
    prev = torch.stack([g.prev for g in got])[None]
    logits, z = forward_train(d.tensors, d, target.tensors, target, hidden, ids, anchors, prev)
    for a, g in enumerate(got):
        torch.testing.assert_close(logits[0, a], g.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(z[0, a], g.conf_logits, atol=1e-5, rtol=1e-5)
    # default prev: teacher-forced with the target's greedy ids (row 0 the anchor, row k its argmax at s+k-1)
    tlogits, _ = target_train(target.tensors, target, ids)
    tp = teacher_prev(ids, tlogits.argmax(-1), anchors, d.block_size)
    assert tp[0, 0, 0] == ids[0, 5] and tp[0, 0, 1] == tlogits[0, 5].argmax()
    torch.testing.assert_close(forward_train(d.tensors, d, target.tensors, target, hidden, ids, anchors)[0],
                               forward_train(d.tensors, d, target.tensors, target, hidden, ids, anchors, tp)[0])


def test_markov_rank0_and_w2_zero_equal_plain_backbone(target):
    d = make_dspark(target)
    w2 = "markov_head.markov_w2.weight"
    zero = with_tensors(d, **{w2: torch.zeros_like(d.tensors[w2])})
    t0 = {k: v for k, v in d.tensors.items() if not k.startswith("markov_head.")}
    t0["confidence_head.proj.weight"] = d.tensors["confidence_head.proj.weight"][:, : target.hidden_size]
    rank0 = DSparkSpec(**{**d.__dict__, "markov_rank": 0, "tensors": t0})
    _, draft, _, got0 = first_block(target, rank0)
    _, _, _, gotz = first_block(target, zero)
    _, _, _, got = first_block(target, d)
    plain = F.linear(draft.readout(got0.layer_out[-1]), draft.head).argmax(-1).tolist()
    assert got0.drafts == plain and gotz.drafts == plain
    torch.testing.assert_close(gotz.logits, got0.logits)
    assert not torch.allclose(got.logits, got0.logits)          # the Markov term does act when W2 != 0
    ref = ref_dspark.forward(rank0, target, ref_qwen3.forward(target, PROMPT), int(got0.prev[0]))
    assert ref.ids.tolist() == ref.base.argmax(-1).tolist() == plain


class InfillDraft(DSparkDraft):
    """Planted: DFlash's infill convention, draft k read from row k+1 (row k predicting s+k)."""

    def readout(self, h):
        hn = super().readout(h)
        return torch.cat([hn[1:], hn[:1]])


def lagged(report_used: bool):
    class LaggedDraft(DSparkDraft):
        """Planted: the Markov prev id off by one (row k reads d_{k-2}, the anchor for rows 0 and 1)."""

        def decode(self, hn, anchor):
            base = F.linear(hn, self.head)
            chain, used, rows = [anchor], [], []
            for k in range(base.shape[0]):
                used.append(chain[max(k - 1, 0)])
                rows.append(base[k] + F.linear(F.embedding(used[-1], self.w1), self.w2)[0])
                chain.append(rows[-1].argmax().view(1))
            return torch.stack(rows), torch.cat(used if report_used else chain[:-1])
    return LaggedDraft


def gate_report(target, d, cls=DSparkDraft, cut: float = 0.0) -> Report:
    eng = Qwen3Target(target, "cpu", torch.float32, 128, rows=d.block_size + 1)
    prefill = eng.prefill(PROMPT, logits=True)
    c = DraftCheck(target, d, eng, cls(d, eng, 128, confidence_cut=cut), PROMPT, prefill,
                   ref_qwen3.forward(target, PROMPT), "f32")
    report = Report("qwen3-dspark", emit=lambda line: None)
    qwen3_dspark.check_draft(report, c)
    return report


def failed(report: Report) -> list[str]:
    return [line for line in report.lines if line.endswith("FAIL")]


def test_gate_checks_pass_on_the_kernel(target):
    report = gate_report(target, make_dspark(target))
    # 6 one-block lines, then the cut on every window at the probe thresholds 0.5 and 0.9 (issue 29)
    assert report.failed == 0 and len([x for x in report.lines if x.startswith("(r) dspark")]) == 8, report.lines


def test_fail_first_infill_convention(target):
    d = make_dspark(target)
    _, _, p, got = first_block(target, d, InfillDraft)
    ref = ref_dspark.forward(d, target, ref_qwen3.forward(target, PROMPT), p.argmax[-1], prev=got.prev.tolist())
    assert np.max(np.abs(got.logits.double().numpy() - ref.logits)) > 1e-2
    bad = failed(gate_report(target, d, InfillDraft))
    assert any("dspark logits+markov" in x for x in bad), bad


@pytest.mark.parametrize("report_used", [False, True])
def test_fail_first_markov_prev_off_by_one(target, report_used):
    d = make_dspark(target)
    _, _, _, good = first_block(target, d)
    assert len(set(good.prev.tolist()[1:])) > 1 or good.prev[0] != good.prev[1], "vacuous: chain is constant"
    bad = failed(gate_report(target, d, lagged(report_used)))
    want = "markov chain" if report_used else "dspark logits+markov"
    assert any(want in x for x in bad), bad


def test_dflash_convention_differs_from_reference(target):
    """Reading drafts from rows 1..B-1 (DFlash) is not DSpark's anchor-first rows 0..B-2."""
    d = make_dspark(target, rank=0)
    ref = ref_dspark.forward(d, target, ref_qwen3.forward(target, PROMPT), 79)
    assert np.max(np.abs(ref.base[1:] - ref.base[:-1])) > 1e-2


def test_cut_rule_kernel_equals_host():
    for conf, t in [([0.9, 0.8, 0.2, 0.9], 0.5), ([0.1, 0.9, 0.9, 0.9], 0.5), ([0.9] * 4, 0.5), ([0.1] * 4, 0.0),
                    ([0.6, 0.4, 0.1, 0.1], 0.45)]:
        k = int(keep_count(torch.tensor(conf), t, 4, torch.device("cpu")))
        assert k == ref_dspark.cut_length(np.array(conf), t)
    assert ref_dspark.cut_length(np.array([0.1, 0.1]), 0.5) == 1 and int(keep_count(None, 0.5, 3, "cpu")) == 3


@pytest.mark.parametrize("cut", [0.0, 0.6])
def test_drafted_generate_equals_plain(target, cut):
    d = make_dspark(target)

    def engine():
        return Qwen3Target(target, "cpu", torch.float32, max_len=128, rows=d.block_size + 1)

    plain = generate(engine(), None, PROMPT, 40)
    eng = engine()
    drafted = generate(eng, DSparkDraft(d, eng, 128, confidence_cut=cut), PROMPT, 40)
    assert drafted.ids == plain.ids and 0 < drafted.tally.windows < 40
    if cut:
        assert drafted.tally.proposals < drafted.tally.windows * d.block_size      # the cut shortened some


def test_gate_registered_with_cut_option(target):
    g = GATES["qwen3-dspark"]
    assert g.block(make_dspark(target)) == 6 and g.draft.name == "qwen3-tiny-dspark-b7"
    g2 = qwen3_dspark.with_options(g, confidence_cut=0.6)
    assert g2.options["confidence_cut"].default == 0.6 and g2.describe(make_dspark(target))["confidence_cut"] == 0.6
    with pytest.raises(InputError):
        qwen3_dspark.with_options(g, confidence_cut=1.5)
    report = gate_report(target, make_dspark(target), cut=0.6)
    assert report.failed == 0 and report.facts["confidence_cut"]["ids_identical"], report.lines


def test_run_gate_fails_first_on_planted_infill(tmp_path, target):
    """The whole gate on files: the kernel's (r) and (w) lines pass; DFlash's infill rows planted -> exit 1."""
    d = make_dspark(target)
    tdir = write_hf(target, tmp_path / "t", qwen3_config(target))
    ddir = write_hf(d, tmp_path / "d", dspark_config(target, d))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"ids": p}) for p in (PROMPT, PROMPT[::-1])) + "\n")
    opts = GateOptions(target=tdir, draft=ddir, prompts=prompts, n=24)
    emit = lambda line: None  # noqa: E731
    _, report = run_gate(GATES["qwen3-dspark"], opts, emit)
    assert not [x for x in failed(report) if not x.startswith("(b)")], report.lines
    assert any(x.startswith("ids identical 24") for x in report.lines)
    planted = replace(GATES["qwen3-dspark"], make_draft=lambda s, e, m: InfillDraft(s, e, m))
    code, report = run_gate(planted, opts, emit)
    assert code == 1 and any("dspark logits+markov" in x for x in failed(report)), report.lines


# --- reader -----------------------------------------------------------------------------------------

def write(tmp_path: Path, target, d: DSparkSpec, **edit) -> Path:
    cfg = dspark_config(target, d)
    for k, v in edit.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return write_hf(d, tmp_path / "dspark", cfg)


def test_load_roundtrip_and_nested_keys(tmp_path, target):
    d = make_dspark(target, copies=True)
    got = load_dspark(write(tmp_path, target, d), target)
    assert (got.block_size, got.markov_rank, got.confidence, got.target_layer_ids) == (5, 6, True, (0, 1))
    path = write(tmp_path, target, d, mask_token_id=None, markov_rank=None,
                 dspark_config={"mask_token_id": 100}, dflash_config={"markov_rank": 6, "mask_token_id": 100})
    assert load_dspark(path, target).mask_token_id == 100
    _, _, _, a = first_block(target, load_dspark(path, target))
    _, _, _, b = first_block(target, d)
    assert a.drafts == b.drafts


def test_load_errors(tmp_path, target):
    d = make_dspark(target)
    with pytest.raises(BadConfig, match="markov_head_type.*'mlp' is not a DeepSpec Markov head type.*vanilla"):
        load_dspark(write(tmp_path, target, d, markov_head_type="mlp"), target)
    with pytest.raises(BadConfig, match="mask_token_id.*expected one value"):
        load_dspark(write(tmp_path, target, d, dspark_config={"mask_token_id": 3}), target)
    with pytest.raises(BadConfig, match="markov_rank.*missing"):
        load_dspark(write(tmp_path, target, d, markov_rank=None), target)
    with pytest.raises(BadTensor, match=r"markov_w1.*\[101, 6\], expected \[101, 8\]"):
        load_dspark(write(tmp_path, target, d, markov_rank=8), target)
    bad = with_tensors(d, **{"markov_head.markov_w2.weight": torch.zeros(50, 6)})
    with pytest.raises(BadTensor, match="markov_w2"):
        load_dspark(write(tmp_path, target, bad), target)
    with pytest.raises(BadTensor, match="confidence_head.proj.weight"):
        load_dspark(write(tmp_path, target, make_dspark(target, confidence=False), enable_confidence_head=True,
                          confidence_head_with_markov=True), target)
    with pytest.raises(Mismatch, match="mask_token_id 101"):
        load_dspark(write(tmp_path, target, d, mask_token_id=101), target)
    with pytest.raises(BadConfig, match="architectures"):
        load_dspark(write(tmp_path, target, d, architectures=["DFlashDraftModel"]), target)


# --- fixture trainer --------------------------------------------------------------------------------

def test_train_and_write_roundtrip(tmp_path, target):
    tokens = torch.randint(0, 100, (8, 24), generator=torch.Generator().manual_seed(9))
    shape = DSparkShape(block_size=4, target_layer_ids=(0, 1), mask_token_id=100, markov_rank=4)
    stored, dspec, stats = train_dspark(target.tensors, target, tokens, "cpu", steps=3, seed=0, shape=shape, batch=2,
                                        seq=24, anchors_per_row=2, warmup=1, quiet=True, eval_rows=tokens[:2])
    assert all(v.dtype == torch.bfloat16 for v in stored.values()) and np.isfinite(stats["final_train_loss"])
    assert set(stats["eval"]["mean_accept_len_tf"]) == {"0.0", "0.3", "0.5", "0.7"}
    d = load_dspark(write_dspark(tmp_path / "d", stored, dspec, target)[0].parent, target)
    assert (d.block_size, d.markov_rank, d.confidence) == (4, 4, True)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["markov_rank"] == 4
