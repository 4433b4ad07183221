"""qwen38 (Qwen3.5/3.6/3.8 dense hybrid): reference vs HF transformers (f64), engine vs its differentiable forward
vs the reference (f32), recurrent-state rollback, padding invariance, readers and named errors, FAIL-first plants."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from bloomery_cli import bands
from bloomery_cli.contract import Report
from bloomery_cli.families.qwen38 import fixture as fx
from bloomery_cli.fixturegen.train import round_bf16
from bloomery_cli.loading import load_target
from bloomery_cli.oracle import hf as oracle
from bloomery_gates.errors import BadConfig, BadTensor
from bloomery_gates.gates.targets import check_target
from bloomery_gates.kernels.families.qwen38 import model as kq
from bloomery_gates.kernels.ops.gated_deltanet import delta_chunked, delta_scan
from bloomery_gates.reference.families.qwen38 import model as rq
from bloomery_gates.registry import FAMILIES
from bloomery_gates.spec import HybridShape, LayerShape, Qwen38Spec

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
LIN, FULL = "linear_attention", "full_attention"
TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizer.json"


def make_qwen38(seed: int = 0, types=(LIN, FULL, LIN), vocab: int = 97, hidden: int = 32, nk: int = 2,
                nv: int = 4, dk: int = 8, heads: int = 4, kv: int = 2, d: int = 8, prf: float = 0.5,
                tied: bool = True) -> Qwen38Spec:
    """A tiny random qwen38 (norm weights away from 0 so (1+w) vs w matters)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=gen) * sc

    hy = HybridShape(tuple(types), prf, int(d * prf), nk, nv, dk, dk, 4)
    t = {"model.embed_tokens.weight": r(vocab, hidden, sc=1.0), "model.norm.weight": r(hidden)}
    for i, ty in enumerate(types):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": r(hidden), p + "post_attention_layernorm.weight": r(hidden),
                  p + "mlp.gate_proj.weight": r(2 * hidden, hidden, sc=0.2), p + "mlp.up_proj.weight":
                  r(2 * hidden, hidden, sc=0.2), p + "mlp.down_proj.weight": r(hidden, 2 * hidden, sc=0.2)})
        if ty == LIN:
            a = p + "linear_attn."
            t.update({a + "in_proj_qkv.weight": r(hy.conv_dim, hidden), a + "in_proj_z.weight": r(hy.value_dim, hidden),
                      a + "in_proj_a.weight": r(nv, hidden), a + "in_proj_b.weight": r(nv, hidden),
                      a + "conv1d.weight": r(hy.conv_dim, 1, 4, sc=0.5),
                      a + "A_log": torch.log(torch.rand(nv, generator=gen) * 4 + 0.1), a + "dt_bias": 1.0 + r(nv),
                      a + "norm.weight": 1.0 + r(dk), a + "out_proj.weight": r(hidden, hy.value_dim)})
        else:
            a = p + "self_attn."
            t.update({a + "q_proj.weight": r(heads * d * 2, hidden), a + "k_proj.weight": r(kv * d, hidden),
                      a + "v_proj.weight": r(kv * d, hidden), a + "o_proj.weight": r(hidden, heads * d),
                      a + "q_norm.weight": r(d), a + "k_norm.weight": r(d)})
    if not tied:
        t["lm_head.weight"] = r(vocab, hidden)
    return Qwen38Spec(family="qwen38", source=Path("memory"), source_format="hf",
                      layer=LayerShape(hidden, heads, kv, d, 2 * hidden, 1e-6, 10000.0), num_layers=len(types),
                      vocab_size=vocab, tie_word_embeddings=tied, max_position=4096, tensors=t, hybrid=hy)


IDS = [int(x) for x in np.random.default_rng(0).integers(0, 97, 70)]      # 70 > HF's delta-rule chunk of 64


# ------------------------------------------------------------------------------------------- tier 3 / reference

@needs_hf
@pytest.mark.parametrize("tied,types", [(True, (LIN, FULL, LIN)), (False, (FULL, LIN, LIN, FULL))])
def test_reference_equals_hf_qwen3_5_f64(tied, types):
    spec = make_qwen38(tied=tied, types=types)
    ref, hf = rq.forward(spec, IDS), oracle.hf_qwen38(spec, IDS)
    assert bands.worst_rel(ref.logits, hf.logits) < 1e-10
    assert bands.worst_rel(rq.hf_hidden_states(ref), hf.hidden_states) < 1e-10
    assert FAMILIES["qwen38"].oracle(spec, IDS[:9]).shape == (9, 97)


@needs_hf
def test_stock_hf_has_f32_islands_and_oracle_sees_w_for_1_plus_w(monkeypatch):
    spec = make_qwen38()
    ref = rq.forward(spec, IDS)
    assert 1e-12 < bands.worst_rel(oracle.hf_qwen38_logits(spec, IDS, promote_f32=False), ref.logits) < 1e-4
    monkeypatch.setattr(rq, "norm1p", lambda x, w, eps: rq.rms_norm(x, w, eps))       # plant: (1+w) read as w
    assert bands.worst_rel(rq.forward(spec, IDS).logits, oracle.hf_qwen38_logits(spec, IDS)) > 1e-2


def test_reference_layer_matches_forward():
    spec = make_qwen38()
    ref = rq.forward(spec, IDS[:20])
    for l in range(spec.num_layers):
        assert np.allclose(rq.reference_layer(spec, l, ref.hidden[l]), ref.hidden[l + 1], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------- kernels

def test_chunked_delta_rule_equals_sequential_scan():
    gen = torch.Generator().manual_seed(0)
    n, t, nv, dk, dv = 2, 70, 4, 8, 6
    q, v = torch.randn(n, t, nv, dk, generator=gen), torch.randn(n, t, nv, dv, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(n, t, nv, dk, generator=gen), dim=-1)
    g, b, s0 = -2 * torch.rand(n, t, nv, generator=gen), torch.rand(n, t, nv, generator=gen), torch.randn(n, nv, dk, dv)
    o1, s1 = delta_scan(q, k, v, g, b, s0)
    o2, s2 = delta_chunked(q, k, v, g, b, s0, chunk=16)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)
    _, states = delta_scan(q, k, v, g, b, s0, keep=True)
    torch.testing.assert_close(states[:, -1], s1, atol=0, rtol=0)


def test_engine_and_train_forward_match_reference():
    spec = make_qwen38()
    ids = IDS[:40]
    ref = rq.forward(spec, ids)
    logits, hidden = kq.forward_train(spec.tensors, spec, torch.tensor([ids]), chunk=16)
    assert bands.worst_rel(logits[0].double().numpy(), ref.logits) < 1e-5
    eng = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(ids[:20], logits=True)
    assert bands.worst_rel(p.logits.double().numpy(), ref.logits[:20]) < 1e-5
    assert bands.worst_rel(p.taps.double().numpy(), ref.hidden[:, :20]) < 1e-5
    assert bands.worst_rel(p.final.double().numpy(), ref.final[:20]) < 1e-5
    torch.testing.assert_close(p.final, kq.rms_norm(p.taps[-1], eng.final_norm, spec.layer.rms_eps))
    v = eng.verify(ids[20:24], logits=True)
    assert bands.worst_rel(v.logits.double().numpy(), ref.logits[20:24]) < 1e-5
    report = Report("t", emit=lambda line: None)
    check_target(report, FAMILIES["qwen38"], spec, p, rq.forward(spec, ids[:20]), "f32", ids[:20])
    assert report.failed == 0, report.lines


def _run_plain(spec, prompt, rest, rows):
    """The plain run: prefill, then one row per pass (padded to ``rows``), each committed."""
    eng = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=rows)
    eng.prefill(prompt)
    logits = []
    for x in rest:
        logits.append(eng.verify([x], logits=True).logits[0])
        eng.commit(1)
    return eng, torch.stack(logits)


def test_rollback_commit_every_k_then_continue_equals_straight_run():
    """Verify R rows, commit(k) for every k, continue one row at a time: bit-identical to the plain run,
    conv tails and recurrent states included; commit runs no layer (it replays the delta rule over the kept rows'
    stored inputs)."""
    spec, rows = make_qwen38(), 4
    prompt, window, after = IDS[:12], IDS[12:16], IDS[16:22]
    for k in range(1, rows + 1):
        eng = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=rows)
        eng.prefill(prompt)
        drafted = eng.verify(window, logits=True).logits                      # R rows, then keep k of them
        calls_before = eng.rows_run
        eng.commit(k)
        assert eng.rows_run == calls_before                                    # commit re-ran nothing
        cont = []
        for x in window[k:] + after:
            cont.append(eng.verify([x], logits=True).logits[0])
            eng.commit(1)
        plain, plain_logits = _run_plain(spec, prompt, window + after, rows)
        assert torch.equal(drafted[:k], plain_logits[:k])                      # batch invariance, exact
        assert torch.equal(torch.stack(cont), plain_logits[k:])               # same numbers after the rollback
        assert torch.equal(eng.state, plain.state) and torch.equal(eng.conv_tail, plain.conv_tail)


class _NoRollback(kq.Qwen38Target):
    """Plant: commit keeps the recurrent state after the LAST row of the pass, whatever was kept."""

    def _rollback_row(self, kept, first, n_states):
        return n_states - 1


def test_fail_first_state_not_rolled_back_differs():
    spec, rows = make_qwen38(), 4
    prompt, window = IDS[:12], IDS[12:16]
    eng = _NoRollback(spec, "cpu", torch.float32, max_len=64, rows=rows)
    eng.prefill(prompt)
    eng.verify(window)
    eng.commit(2)
    got = eng.verify(window[2:3], logits=True).logits[0]
    _, plain = _run_plain(spec, prompt, window[:3], rows)
    assert (got - plain[2]).abs().max() > 1e-3


def test_commit_runs_no_layer_and_verify_runs_rows(monkeypatch):
    spec = make_qwen38()
    eng = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=4)
    calls = {"n": 0}
    real = kq.deltanet_mixer

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(kq, "deltanet_mixer", counting)
    eng.prefill(IDS[:30])
    eng.verify(IDS[30:34])
    n = calls["n"]
    eng.commit(1)
    assert calls["n"] == n and eng.length == 31 and eng.rows_run == 34
    with pytest.raises(RuntimeError):
        eng.commit(1)                                                          # nothing pending: no second commit


def test_padding_invariance_one_row_equals_first_of_four():
    spec = make_qwen38()
    a = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=4)
    b = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64, rows=4)
    a.prefill(IDS[:10])
    b.prefill(IDS[:10])
    one = a.verify(IDS[10:11], logits=True)
    four = b.verify(IDS[10:14], logits=True)
    assert torch.equal(one.logits[0], four.logits[0]) and torch.equal(one.taps[:, 0], four.taps[:, 0])


def test_fail_first_one_plus_w_read_as_w_differs(monkeypatch):
    spec = make_qwen38()
    ref = rq.forward(spec, IDS[:16])
    monkeypatch.setattr(kq, "norm_gain", lambda w: w.float())
    eng = kq.Qwen38Target(spec, "cpu", torch.float32, max_len=64)
    got = eng.prefill(IDS[:16], logits=True).logits.double().numpy()
    assert bands.worst_rel(got, ref.logits) > 1e-2


# ------------------------------------------------------------------------------------------- readers / fixture

SMALL = fx.Qwen38Shape(hidden_size=32, head_dim=8, intermediate_size=64, linear_key_head_dim=8,
                       linear_value_head_dim=8, vocab_size=4096)


def _written(tmp_path: Path, extra=None, extra_config=None) -> tuple[Path, dict]:
    p = fx.init_qwen38(SMALL, 0, std=0.2)
    gen = torch.Generator().manual_seed(1)
    p = round_bf16({k: v + 0.1 * torch.randn(v.shape, generator=gen) if v.ndim == 1 else v for k, v in p.items()})
    fx.write_qwen38_target(tmp_path / "q38", p, TOKENIZER.read_text(), shape=SMALL, extra=extra,
                           extra_config=extra_config)
    return tmp_path / "q38", p


def test_hf_and_gguf_readers_round_trip(tmp_path):
    d, p = _written(tmp_path)
    hf, gg = load_target(d), load_target(d.with_suffix(".gguf"))
    assert isinstance(hf, Qwen38Spec) and hf.hybrid == gg.hybrid and hf.layer == gg.layer
    assert set(hf.tensors) == set(gg.tensors) == set(p)
    for n in p:
        assert torch.equal(hf.tensors[n], p[n])
        torch.testing.assert_close(gg.tensors[n].float(), p[n].float(), rtol=1e-6, atol=1e-7)
    assert bands.worst_rel(rq.forward(gg, IDS[:20]).logits, rq.forward(hf, IDS[:20]).logits) < 1e-6


@needs_hf
def test_written_hf_dir_loads_in_transformers(tmp_path):
    import transformers

    d, _ = _written(tmp_path)
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float64)
    assert model.config.layer_types == list(SMALL.layer_types)
    got = model(torch.tensor([IDS[:20]])).logits[0].detach().numpy()
    assert bands.worst_rel(got, rq.forward(load_target(d), IDS[:20]).logits) < 1e-4   # stock HF: f32 islands


def test_mtp_extra_tensors_pass_through_hf_and_gguf(tmp_path):
    h = SMALL.hidden_size
    extra = {"mtp.fc.weight": torch.randn(h, 2 * h), "mtp.norm.weight": torch.randn(h) * 0.1,
             "mtp.pre_fc_norm_embedding.weight": torch.randn(h) * 0.1, "mtp.pre_fc_norm_hidden.weight":
             torch.randn(h) * 0.1, "mtp.layers.0.input_layernorm.weight": torch.randn(h) * 0.1}
    extra = round_bf16(extra)
    d, _ = _written(tmp_path, extra, {"mtp_num_hidden_layers": 1})
    hf, gg = load_target(d), load_target(d.with_suffix(".gguf"))
    assert hf.hybrid.mtp_num_hidden_layers == gg.hybrid.mtp_num_hidden_layers == 1 and gg.num_layers == 4
    for n, t in extra.items():
        torch.testing.assert_close(gg.tensors[n].float(), t.float(), rtol=1e-6, atol=1e-7)
        assert torch.equal(hf.tensors[n], t)


def test_multimodal_wrapper_layout_reads(tmp_path):
    d, p = _written(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    wrapped = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
               "tie_word_embeddings": True, "text_config": {**cfg, "model_type": "qwen3_5_text"}}
    (d / "config.json").write_text(json.dumps(wrapped))
    t = load_file(str(d / "model.safetensors"))
    t = {n.replace("model.", "model.language_model.", 1): x for n, x in t.items()}
    t["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    save_file(t, str(d / "model.safetensors"))
    spec = load_target(d)
    assert torch.equal(spec.tensors["model.layers.0.linear_attn.A_log"], p["model.layers.0.linear_attn.A_log"])
    assert "model.visual.patch_embed.proj.weight" not in spec.tensors


def test_named_errors(tmp_path):
    d, _ = _written(tmp_path)
    t = load_file(str(d / "model.safetensors"))
    del t["model.layers.1.linear_attn.A_log"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(BadTensor, match=r"model\.layers\.1\.linear_attn\.A_log.*missing"):
        load_target(d)
    cfg = json.loads((d / "config.json").read_text())
    for key, value, pattern in (("linear_num_key_heads", None, "linear_num_key_heads"),
                                ("layer_types", ["linear_attention", "mamba"], "layer_types"),
                                ("linear_num_value_heads", 3, "linear_num_value_heads")):
        bad = {**cfg, key: value} if value is not None else {k: v for k, v in cfg.items() if k != key}
        (d / "config.json").write_text(json.dumps(bad))
        with pytest.raises(BadConfig, match=pattern):
            load_target(d)


def test_gguf_missing_tensor_names_the_llama_cpp_name(tmp_path):
    import gguf
    from tokenizers import Tokenizer

    d, p = _written(tmp_path)
    del p["model.layers.2.linear_attn.A_log"]
    path = fx.write_qwen38_gguf(tmp_path / "bad.gguf", SMALL, p, Tokenizer.from_str(TOKENIZER.read_text()))
    with pytest.raises(BadTensor, match=r"blk\.2\.ssm_a \(= model\.layers\.2\.linear_attn\.A_log\).*missing"):
        load_target(path)
    with pytest.raises(ValueError, match="full_attention_interval"):
        fx.write_qwen38_gguf(tmp_path / "x.gguf", dataclasses.replace(SMALL, layer_types=(LIN, FULL, LIN, LIN)),
                             p, Tokenizer.from_str(TOKENIZER.read_text()))
    assert gguf.GGUFReader(str(d.with_suffix(".gguf"))).fields["general.architecture"].contents() == "qwen35"


def test_train_qwen38_target_smoke():
    stream = torch.randint(0, 4096, (5000,), generator=torch.Generator().manual_seed(0))
    params, spec, stats = fx.train_qwen38_target(stream, "cpu", 3, 0, held=stream[:600], shape=SMALL, batch=2,
                                                 seq=32, eval_windows=4)
    assert all(v.dtype == torch.bfloat16 for v in params.values()) and spec.family == "qwen38"
    assert stats["held_out"]["tokens"] == 4 * 32 and np.isfinite(stats["held_out"]["ce"])
