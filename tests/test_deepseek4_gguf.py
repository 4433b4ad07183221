"""deepseek4 in llama.cpp's GGUF layout: the writer (main file + the converter's separate ``mtp-<name>.gguf``), the
readers (MXFP4 experts handed over packed), llama.cpp as oracle on the trunk and the MTP graph, FAIL-first plants,
and bad files as named errors (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bloomery_cli import llamacpp_run
from bloomery_cli.cli import app
from bloomery_cli.contract import Report
from bloomery_cli.families.deepseek4 import fixture_gguf as writer
from bloomery_cli.families.deepseek4 import oracle_llamacpp as oracle
from bloomery_cli.families.deepseek4 import reader_gguf, reader_mtp_gguf
from bloomery_cli.families.deepseek4.gguf_names import mtp_name
from bloomery_cli.families.deepseek4.reader_mtp import deepseek4_mtp_from_file
from bloomery_cli.fixturegen.manifest import Manifest, sha256_file
from bloomery_cli.loading import load_target, load_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HF, GGUF = FIXTURES / "ds4-tiny", FIXTURES / "ds4-tiny-lc.gguf"
A = "deepseek4."

needs_llama = pytest.mark.skipif(llamacpp_run.unavailable() is not None,
                                 reason="llama_cpp not importable (pip install llama-cpp-python==0.3.36)")


def _report() -> tuple[Report, list[str]]:
    lines: list[str] = []
    return Report("t", emit=lines.append), lines


def _write(tmp_path: Path, experts: str = "mxfp4") -> Path:
    main, _ = writer.export(FIXTURES, tmp_path, experts)
    return main


def _rewrite(src: Path, dst: Path, drop: str = "", set_key: tuple[str, list[int]] | None = None) -> Path:
    """``src`` with one key dropped or one int array replaced, tensors copied as stored."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop:
            continue
        val = set_key[1] if set_key and name == set_key[0] else f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _seq(extra: int) -> list[int]:
    text = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["text"]
    return load_tokenizer(HF).encode(text).ids + [int(i) for i in np.arange(extra) * 37 % 4000 + 2]


# ----------------------------------------------------------------------------------------------------- round trip


def test_mxfp4_repack_is_the_exact_inverse():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (3, 5, 32), generator=g, dtype=torch.uint8)         # rows of 64 weights
    scales = torch.randint(0, 255, (3, 5, 2), generator=g, dtype=torch.uint8)
    blocks = writer.mxfp4_blocks(codes, scales)
    assert blocks.shape == (3, 5, 34)
    back_c, back_s = reader_gguf.unpack_mxfp4(blocks)
    assert torch.equal(back_c, codes) and torch.equal(back_s, scales)
    # the ggml values of a block equal the FP4 values: element j of block 0 row 0 = e2m1(code j) * 2^(e - 127)
    deq = gguf.quants.dequantize(blocks.reshape(-1, 34)[:1], gguf.GGMLQuantizationType.MXFP4).reshape(-1)[:32]
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6])
    c = codes[0, 0, :16].numpy()
    want = e2m1[np.stack([c & 15, c >> 4], -1).reshape(-1)] * 2.0 ** (int(scales[0, 0, 0]) - 127)
    assert np.array_equal(deq, want.astype(np.float32))


@pytest.mark.parametrize("experts", ["mxfp4", "bf16"])
def test_files_read_back_as_written(tmp_path, experts):
    """export() checks every tensor back through both readers (check_readback); here the shapes and layout."""
    main = _write(tmp_path, experts)
    spec = load_target(main)
    assert spec.source_format == "gguf" and spec.experts_mxfp4 == (experts == "mxfp4")
    assert spec.layer_types == ("sliding", "csa", "hca", "csa") and spec.mlp_types[0] == "hash"
    assert (spec.attn.csa_rate, spec.attn.hca_rate, spec.attn.index_head_dim) == (4, 128, 64)
    mtp = deepseek4_mtp_from_file(main, spec)            # the main file names its mtp- sibling
    assert mtp.source == mtp_name(main) and mtp.source_format == "gguf"
    e = mtp.tensors["mtp.0.e_proj.weight"]
    assert e.shape == (32, 32)
    assert gguf.GGUFReader(str(main)).fields[A + "block_count"].contents() == 4
    assert gguf.GGUFReader(str(mtp_name(main))).fields[A + "nextn_predict_layers"].contents() == 1


def test_bundled_files_are_the_writer_output_and_in_the_manifest(tmp_path):
    main = _write(tmp_path)
    man = Manifest.read(FIXTURES)
    for p in (main, mtp_name(main)):
        assert sha256_file(p) == sha256_file(FIXTURES / p.name) == man.files[p.name]["sha256"]
    assert man.models["ds4-tiny-lc"]["files"] == ["ds4-tiny-lc.gguf", "mtp-ds4-tiny-lc.gguf"]


def test_writer_refuses_ratios_llama_cpp_refuses():
    with pytest.raises(ValueError, match="accepts only ratios 0 / 4"):
        writer.ratios(load_target(HF))                        # ds4-tiny: HCA rate 16


@pytest.mark.parametrize("overlap", [False, True])
def test_compressor_with_no_complete_window_pools_nothing(overlap):
    """Fewer rows than the rate (ds4-tiny-lc's HCA rate 128 under a 56-token prompt): no entry, in the kernel and
    the reference alike (both raised on the empty reshape before)."""
    from bloomery_gates.kernels.ops import v4_attention as kv4
    from bloomery_gates.reference.ops import v4_attention as rv4

    c = 2 if overlap else 1
    k, z, b = torch.randn(3, c * 8), torch.randn(3, c * 8), torch.randn(4, c * 8)
    assert tuple(kv4.pool_windows(k, z, b, 4, overlap).shape) == (0, 8)
    assert rv4.pool_windows(k.double().numpy(), z.double().numpy(), b.double().numpy(), 4, overlap).shape == (0, 8)


# ----------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("case", ["no_ratios", "ratio_16", "gating", "mtp_as_target"])
def test_bad_gguf_is_exit_2_one_line(tmp_path, case):
    main = _write(tmp_path)
    bad = {"no_ratios": lambda: _rewrite(main, tmp_path / "bad.gguf", drop=A + "attention.compress_ratios"),
           "ratio_16": lambda: _rewrite(main, tmp_path / "bad.gguf", set_key=(A + "attention.compress_ratios",
                                                                              [0, 4, 16, 4])),
           "gating": lambda: _rewrite(main, tmp_path / "bad.gguf", set_key=(A + "expert_gating_func", 2)),
           "mtp_as_target": lambda: mtp_name(main)}[case]()
    want = {"no_ratios": "compress_ratios", "ratio_16": "each 0, 4 or 128", "gating": "sqrt-softplus",
            "mtp_as_target": "MTP-only"}[case]
    r = CliRunner().invoke(app, ["gate", "run", "ds4-mtp", "--target", str(bad), "--draft", str(mtp_name(main)),
                                 "-n", "4"], catch_exceptions=False)
    assert r.exit_code == 2 and want in r.output and "Traceback" not in r.output, r.output


def test_mtp_file_of_another_target_is_a_mismatch(tmp_path):
    from bloomery_gates.errors import Mismatch

    main = _write(tmp_path)
    other = _rewrite(mtp_name(main), tmp_path / "mtp-other.gguf", set_key=(A + "attention.sliding_window", 8))
    with pytest.raises(Mismatch, match="attn"):
        reader_mtp_gguf.deepseek4_mtp_from_gguf(other, load_target(main))


# ----------------------------------------------------------------------------------------------------- llama.cpp


def _check(main: Path, extra: int = 90) -> tuple[int, list[str]]:
    spec = load_target(main)
    report, lines = _report()
    oracle.check_v4(report, spec, deepseek4_mtp_from_file(main, spec), _seq(extra))
    return report.finish(), lines


@needs_llama
def test_llama_cpp_trunk_streams_and_mtp_agree_with_the_reference():
    code, lines = _check(GGUF)
    checks = [line for line in lines if line.endswith((" PASS", " FAIL"))]
    assert code == 0 and len(checks) == 5 and all(c.endswith(" PASS") for c in checks), lines
    assert "HCA entries from position 127: exercised" in lines[0], lines[0]


@needs_llama
def test_indexer_width_llama_cpp_aborts_on_is_skipped_with_the_reason(tmp_path):
    """An indexer key_length of 8 (ds4-tiny's own) would abort llama.cpp (its Hadamard block is >= 64 wide): the
    (o) lines are skipped with a note naming it, the process lives."""
    from tokenizers import Tokenizer

    spec = writer.for_llamacpp(load_target(HF), index_head_dim=8)
    tok = Tokenizer.from_file(str(HF / "tokenizer.json"))
    main = writer.write_main(tmp_path / "i8.gguf", spec, tok)
    writer.write_mtp(mtp_name(main), spec, tok)
    code, lines = _check(main, 8)
    assert "multiple of 64" in lines[0] and not any(x.startswith("(o) ") and x.endswith("PASS") for x in lines), lines


def _plant_eh_swapped(monkeypatch) -> None:
    """Our MTP reader planted wrong: the [e | h] halves of eh_proj read as [h | e]."""
    real = reader_mtp_gguf.deepseek4_mtp_from_gguf

    def swapped(path, target):
        m = real(path, target)
        t = m.tensors.table
        t["mtp.0.e_proj.weight"], t["mtp.0.h_proj.weight"] = t["mtp.0.h_proj.weight"], t["mtp.0.e_proj.weight"]
        return m
    monkeypatch.setattr(reader_mtp_gguf, "deepseek4_mtp_from_gguf", swapped)


@needs_llama
@pytest.mark.parametrize("plant", ["eh_proj_swapped", "mxfp4_nibbles_swapped"])
def test_fail_first_reader_defects_fail_the_o_lines(monkeypatch, plant):
    """Our reader planted wrong (the MTP's [e | h] halves read as [h | e]; the MXFP4 nibbles read high-first): our
    reference on that spec, against llama.cpp on the good files, fails an (o) line (exit 1)."""
    if plant == "eh_proj_swapped":
        _plant_eh_swapped(monkeypatch)
        line = "(o) mtp logits"
    else:
        real = reader_gguf.unpack_mxfp4

        def high_first(blocks):
            c, s = real(blocks)
            return ((c >> 4) | (c << 4)).to(torch.uint8), s
        monkeypatch.setattr(reader_gguf, "unpack_mxfp4", high_first)
        line = "(o) trunk logits"
    code, lines = _check(GGUF, 40)
    hit = [x for x in lines if x.startswith(line)]
    assert code == 1 and hit and hit[0].endswith(" FAIL"), lines


@needs_llama
def test_fail_first_gate_bf16_exit_1_on_a_planted_mtp_read(tmp_path, monkeypatch):
    """The ds4-mtp gate in bf16 on the GGUF pair with --oracle: our MTP read planted ([h | e]) passes every (r) line
    (engine and reference read the same wrong weights) and fails the llama.cpp (o) line: exit 1."""
    _plant_eh_swapped(monkeypatch)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text((FIXTURES / "prompts.jsonl").read_text().splitlines()[0] + "\n")
    r = CliRunner().invoke(app, ["gate", "run", "ds4-mtp", "--target", str(GGUF), "--draft", str(mtp_name(GGUF)),
                                 "--dtype", "bf16", "-n", "8", "--prompts", str(prompts), "--oracle"],
                           catch_exceptions=False)
    fails = [x for x in r.output.splitlines() if x.endswith(" FAIL")]
    assert r.exit_code == 1 and fails and all(x.startswith("(o) mtp") for x in fails), r.output


# ----------------------------------------------------------------------------------------------------- --engine


def _engine(monkeypatch=None, n: int = 24):
    from bloomery_cli.engines import llamacpp
    from bloomery_cli.engines.gate import EngineOptions, run_engine_gate
    from bloomery_gates.gates import GATES

    try:
        drv = llamacpp.find_driver(None)
    except Exception:                                          # noqa: BLE001 - no driver built: skipped below
        pytest.skip("no llama.cpp driver (`bloomery engine build`)")
    return run_engine_gate(GATES["ds4-mtp"], EngineOptions(llama_cpp=drv.parent.parent if drv.parent.name == "build"
                                                           else drv.parent, n=n, max_prompts=2), emit=lambda s: None)


def test_engine_llamacpp_runs_the_gguf_pair_and_the_judge_agrees():
    """llama.cpp's draft-mtp on ds4-tiny-lc.gguf with -md mtp-ds4-tiny-lc.gguf: its plain ids are our f64 target's,
    its drafts our f64 drafter's on every window."""
    code, rep = _engine()
    assert code == 0, "\n".join(rep.lines)
    assert any(x.startswith("(a) draft ids on the engine's windows") and x.endswith("0 differ PASS")
               for x in rep.lines), "\n".join(rep.lines)


def test_fail_first_engine_judge_with_a_planted_mtp_read(monkeypatch):
    """The judge replaying with our MTP read planted ([h | e]) disagrees with llama.cpp's drafts: exit 1."""
    _plant_eh_swapped(monkeypatch)
    code, rep = _engine()
    bad = [x for x in rep.lines if x.endswith(" FAIL")]
    assert code == 1 and any(x.startswith("(a) draft ids") for x in bad), "\n".join(rep.lines)


def test_plan_counts_the_gguf_experts_packed():
    """`bloomery plan` on the GGUF: the MXFP4 experts at their stored bytes (codes n/2 + e8m0 scales n/32)."""
    from bloomery_cli.families.deepseek4.plan import deepseek4_gguf_target
    from bloomery_cli.inventory import inventory

    spec = load_target(GGUF)
    m = deepseek4_gguf_target(GGUF, inventory([GGUF]).models[0])
    packed = sum(int(np.prod(spec.tensors.shape_of(n))) for n in spec.tensors if ".experts." in n)
    E, ff, H = spec.moe.num_experts, spec.moe.expert_ff, spec.hidden_size
    assert packed == spec.num_layers * E * (2 * ff * H + H * ff) * 17 // 32
    assert m.meta["packed_expert_bytes"] == packed and m.experts.mxfp4 and m.fmt == "gguf"


def test_gguf_fixture_uses_every_path_past_position_128():
    """ds4-tiny-lc over the first prompt + 200 ids (the (o) lines' length): the f64 logits move by more than 1e-2
    (worst relative) when a CSA / the HCA layer is made sliding-only, when the indexer keeps every entry, or when
    the hash table is shifted: the HCA entries (from position 127) and the sparse CSA choice carry weight."""
    from dataclasses import replace

    from bloomery_gates.reference.families.deepseek4 import model as ref

    spec = load_target(GGUF)
    ids = _seq(200)
    base = ref.forward(spec, ids).logits
    variants = {f"layer {i} sliding": replace(spec, layer_types=tuple("sliding" if j == i else k for j, k in
                                                                      enumerate(spec.layer_types)))
                for i, k in enumerate(spec.layer_types) if k != "sliding"}
    variants["dense indexer"] = replace(spec, attn=replace(spec.attn, index_topk=10 ** 6))
    t = {k: spec.tensors[k] for k in spec.tensors}
    t["model.layers.0.mlp.gate.tid2eid"] = torch.roll(t["model.layers.0.mlp.gate.tid2eid"], 1, 0)
    variants["hash shifted"] = replace(spec, tensors=t)
    assert len(ids) >= 2 * spec.attn.hca_rate - 1 and len(ids) // spec.attn.csa_rate > spec.attn.index_topk
    moved = {k: float(np.abs(ref.forward(v, ids).logits - base).max() / np.abs(base).max())
             for k, v in variants.items()}
    assert all(m > 1e-2 for m in moved.values()), moved


def test_inventory_verdicts_for_the_pair():
    """The MTP file is a sidecar drafted by ds4-mtp (gguf_runs: the gates run the GGUF layout); the main file has
    no MTP of its own."""
    r = CliRunner().invoke(app, ["inventory", str(mtp_name(GGUF))], catch_exceptions=False)
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "verdict: MTP sidecar" in out and "drafter here: gate ds4-mtp" in out, out
    r = CliRunner().invoke(app, ["inventory", str(GGUF)], catch_exceptions=False)
    assert r.exit_code == 0 and "verdict: none" in " ".join(r.output.split()), r.output


def test_engine_keeps_the_gguf_experts_packed():
    """The engine built from the GGUF holds the MXFP4 experts as their uint8 bytes (codes + e8m0 scales), never
    widened: 4.25 bits a weight, the stored bytes."""
    from bloomery_gates.kernels.families.deepseek4.model import Deepseek4Target

    spec = load_target(GGUF)
    eng = Deepseek4Target(spec, "cpu", torch.bfloat16, 16)
    packed = {n: x for n, x in eng.t.items() if ".experts." in n}
    E, ff, H = spec.moe.num_experts, spec.moe.expert_ff, spec.hidden_size
    assert packed and all(x.dtype == torch.uint8 for x in packed.values())
    assert sum(x.numel() for x in packed.values()) == spec.num_layers * E * 3 * ff * H * 17 // 32


def test_plan_takes_the_mtp_file_as_the_draft():
    """`bloomery plan X.gguf --draft mtp-X.gguf`: the MTP block (its packed experts at their bytes, its HC head,
    eh_proj and norms) is the draft term; the target's copies of embed / head in the file are not counted."""
    r = CliRunner().invoke(app, ["plan", str(GGUF), "--draft", str(mtp_name(GGUF)), "--gpu-mem", "1G", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    spec = load_target(GGUF)
    mtp = deepseek4_mtp_from_file(GGUF, spec)
    elems = sum(int(np.prod(mtp.tensors.shape_of(n))) for n in mtp.tensors)     # what the MTP reader hands over
    assert p["draft_on"] and p["terms"]["draft_weights"] == 2 * elems, p["terms"]  # bf16, the plan's default
