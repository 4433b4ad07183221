"""qwen4exp in llama.cpp's GGUF layout: the writer (from the HF fixture), the reader (to HF names), llama.cpp as
tier-3 oracle on the same file with its known QSA defect named, and FAIL-first plants in a BF16 file.

The bundled ``fixtures/qwen4exp-tiny.gguf`` is the writer's output (the manifest's sha256) and reads back to the HF
fixture; llama.cpp's trunk agrees with our f64 reference on every row its QSA selects as HF does, and the rows it
does not are named on a KNOWN DEFECT line that is never a pass; a planted conversion defect in a BF16 file (a
zero-centred norm without its +1, ssm_a stored as A_log) makes the llama.cpp check exit 1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_family import (
    FIXTURES,
    assert_bundled_is_writer_output,
    needs_gguf,
    needs_llama,
    prompt_ids,
    reference_check,
    write,
)
from gguf_family import report as _report

from bloomery_cli import llamacpp_run
from bloomery_cli.bands import logits_band
from bloomery_cli.families.qwen4exp import fixture_gguf
from bloomery_cli.families.qwen4exp import oracle_llamacpp as oracle
from bloomery_cli.loading import load_target
from bloomery_gates import ple_hash

HF, GGUF = FIXTURES / "qwen4exp-tiny", FIXTURES / "qwen4exp-tiny.gguf"


def _seq(t: int = 48) -> tuple[list[int], int]:
    return prompt_ids(HF, keep=24, t=t)


def _write(tmp_path: Path, name: str, **kw) -> Path:
    return write(fixture_gguf.write_qwen4exp_gguf, HF, tmp_path / name, **kw)


@needs_gguf(GGUF)
def test_bundled_file_is_the_writer_output_and_in_the_manifest(tmp_path):
    assert_bundled_is_writer_output(fixture_gguf.export_gguf, HF, GGUF, tmp_path, max_bytes=2_000_000)


def test_gguf_reads_back_to_the_hf_spec_and_weights(tmp_path):
    path = _write(tmp_path, "q.gguf")
    hf, gg = load_target(HF), load_target(path)
    fixture_gguf.check_readback(path, hf)
    assert gg.source_format == "gguf" and gg.output_gate == "sigmoid" and gg.hc == hf.hc and gg.qsa == hf.qsa
    assert ple_hash.spec_tables(gg.ple, gg.vocab_size) == ple_hash.spec_tables(hf.ple, hf.vocab_size)
    assert set(gg.tensors) == {n for n in hf.tensors if not n.startswith("mtp.")}
    for n in ("model.layers.3.self_attn.indexer.index_qk_proj.weight", "model.layers.1.ple.conv1d.weight",
              "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.linear_attn.in_proj_qkv.weight"):
        assert torch.equal(gg.tensors[n].float(), hf.tensors[n].float()), n


def test_readback_catches_a_wrong_tensor(tmp_path):
    path = _write(tmp_path, "bad.gguf", edit={"blk.1.ple_norm_key.weight": lambda x: x - 1.0})   # the +1 lost
    with pytest.raises(RuntimeError, match="ple.norm_key.weight does not read back"):
        fixture_gguf.check_readback(path, load_target(HF))


def test_qsa_width_rows_are_the_rows_past_the_budget_without_a_full_tail():
    spec = load_target(HF)                      # budget 32, ratio 4: 8 blocks; affected once 9 blocks are behind
    assert oracle.qsa_width_rows(spec, 48) == [35, 36, 37, 39, 40, 41, 43, 44, 45, 47]
    assert oracle.qsa_width_rows(spec, 35) == []
    assert oracle.clean_rows(spec, 48) == [i for i in range(48) if i not in oracle.qsa_width_rows(spec, 48)]
    early = replace(spec, hybrid=replace(spec.hybrid, layer_types=("linear_attention", "full_attention",
                                                                    "linear_attention", "full_attention")))
    assert oracle.clean_rows(early, 48) == list(range(35))     # a mixing layer after the QSA one: the prefix only


def _check(spec, path: Path, seq: list[int], p: int) -> tuple[int, list[str]]:
    from bloomery_gates.reference.families.qwen4exp.model import forward

    return reference_check(forward, oracle.check_target_qwen4exp, spec, path, seq, p)


@needs_llama
def test_llama_cpp_agrees_on_the_clean_rows_and_names_the_qsa_defect(tmp_path):
    path = _write(tmp_path, "q.gguf")
    seq, p = _seq()
    code, lines = _check(load_target(path), path, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    defect = next(line for line in lines if "KNOWN DEFECT qsa-width" in line)
    assert code == 0 and logit.endswith(" PASS") and "(rows 38 of 48)" in logit, lines
    assert "10 of 48 rows predicted affected" in defect and not defect.endswith("PASS"), defect


@needs_llama
@pytest.mark.parametrize("plant", {"hc_norm_without_plus_one": ("blk.0.hc_attn_norm.weight", lambda x: x - 1.0),
                                   "ssm_a_as_A_log": ("blk.0.ssm_a", lambda x: torch.log(-x))}.items(),
                         ids=lambda kv: kv[0])
def test_fail_first_planted_conversion_defect_in_bf16(tmp_path, plant):
    """llama.cpp runs a BF16 file with one tensor converted wrongly; our reference reads the good file: exit 1."""
    good = _write(tmp_path, "good.gguf")
    name, fn = plant[1]
    bad = _write(tmp_path, "bad.gguf", edit={name: fn})
    assert "BF16" in llamacpp_run.tensor_types(bad)
    seq, p = _seq(32)
    code, lines = _check(load_target(good), bad, seq, p)
    logit = next(line for line in lines if line.startswith("(o) host f64 logits"))
    assert code == 1 and logit.endswith(" FAIL"), lines


def test_skip_reason_without_llama_cpp_python(monkeypatch):
    monkeypatch.setattr(llamacpp_run, "unavailable", lambda: "llama_cpp (llama-cpp-python) is not importable: x")
    spec = load_target(HF)
    report, lines = _report()
    oracle.check_target_qwen4exp(report, spec, [1, 2, 3], np.zeros((3, spec.vocab_size)), 2, [4], gguf=Path("x"))
    assert len(lines) == 1 and lines[0].startswith("(o) llama.cpp: skipped, llama_cpp") and report.failed == 0
    assert "PASS" not in lines[0]


@needs_llama
def test_qsa_width_diagnosis_reproduces_llama_cpp(monkeypatch):
    """Evidence for the named defect: our reference with llama.cpp's selection (HF's blocks and tail plus r - 1 - m
    cells of the next-best block; each subset tried, ggml's top-k breaks ties inside a block arbitrarily) matches
    llama.cpp on every affected row, which HF's selection does not."""
    import itertools

    from bloomery_gates.reference.families.qwen4exp import model as ref_model
    from bloomery_gates.reference.ops import qsa as rqsa

    spec, (seq, _) = load_target(GGUF), _seq()
    got = llamacpp_run.run(GGUF, seq).logits.astype(np.float64)
    q, bad = spec.qsa, oracle.qsa_width_rows(spec, len(seq))
    r, blocks, pick = q.compress_ratio, q.budget // q.compress_ratio, {"k": 0}

    def llama_selection(spec_, w, layer, b, positions):
        pre = f"model.layers.{layer}.self_attn.indexer."
        sel = rqsa.qsa_select(b, b, positions, rqsa.QsaWeights(w[pre + "index_qk_proj.weight"],
                              w[pre + "q_layernorm.weight"], w[pre + "k_layernorm.weight"]), q.num_heads, r,
                              q.budget, spec_.layer.rms_eps, spec_.hybrid.rotary_dim, spec_.layer.rope_theta)
        mask = np.array(sel.mask, copy=True)
        for t in bad:
            nxt = int(np.argsort(-np.asarray(sel.scores[t]), kind="stable")[blocks])
            subsets = list(itertools.combinations(range(nxt * r, nxt * r + r), r - 1 - (t + 1) % r))
            mask[t, list(subsets[min(pick["k"], len(subsets) - 1)])] = True
        return mask

    hf_way = ref_model.forward(spec, seq).logits
    monkeypatch.setattr(ref_model, "qsa_mask", llama_selection)
    best = np.full(len(bad), np.inf)
    for pick["k"] in range(6):                                     # at most C(4, 2) = 6 subsets
        ref = ref_model.forward(spec, seq).logits
        best = np.minimum(best, [np.abs(ref[t] - got[t]).max() / np.abs(ref[t]).max() for t in bad])
    hf_rel = max(np.abs(hf_way[t] - got[t]).max() / np.abs(hf_way[t]).max() for t in bad)
    band = logits_band("f32", spec.layer, spec.num_layers, len(seq)).value      # the (o) lines' band
    assert len(bad) == 10 and best.max() <= band < hf_rel, (best, hf_rel, band)


def test_writer_refuses_what_the_format_cannot_say(tmp_path):
    from bloomery_gates.errors import Refused

    hf = load_target(HF)
    for bad, why in ((replace(hf, output_gate="silu"), "output gate 'silu'"),
                     (replace(hf, moe=replace(hf.moe, norm_topk=False)), "norm_topk_prob false")):
        with pytest.raises(Refused, match=why):
            fixture_gguf.refuse_inexpressible(bad)
