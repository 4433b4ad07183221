"""Issue 28 (bad input, third round) through the other commands: bench, plan, results, inventory, fixtures, and
the readers' sized claims (safetensors mmap, MoE expert counts, GGUF typed arrays). Each class: exit 2, one line
naming the flag, file or key, no traceback, nothing written or changed."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import pytest
from conftest_formats import make_qwen3_hf
from exit2 import assert_one_line_exit2 as one_line_exit2
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_gates.errors import BadConfig, BadTensor, InputError

runner = CliRunner()
RESULTS = Path(__file__).resolve().parents[1] / "results"


def invoke(*argv: str):
    return runner.invoke(app, list(argv), catch_exceptions=False)


# --- bench ---------------------------------------------------------------------------------------------------

TINY = ["bench", "qwen3-dflash", "--shape", "tiny", "--device", "cpu", "--dtype", "f32"]


@pytest.mark.parametrize("args, needle", [
    (["-n", "0"], "-n: 0"), (["-n", "-5"], "-n: -5"), (["--prompt-len", "0"], "--prompt-len: 0"),
    (["--prompt-len", "100000"], "past the 32768 positions"), (["--layers", "2"], "--layers: does not act"),
    (["--block", "4"], "--block: does not act"), (["--mtp-width", "2"], "--mtp-width: does not act"),
    (["--hf"], "--hf: does not act")])
def test_bench_refuses_what_it_cannot_measure(tmp_path, args, needle):
    rec = tmp_path / "bench.json"
    one_line_exit2(invoke(*TINY, *args, "--json", str(rec)), needle)
    assert not list(tmp_path.iterdir()), "a bench record was written for a run that could not measure"


def test_bench_prompt_len_without_shape():
    one_line_exit2(invoke("bench", "qwen3-dflash", "--device", "cpu", "--prompt-len", "5"), "--prompt-len",
                   "--shape")


def test_bench_out_of_memory_is_one_line(tmp_path, monkeypatch):
    """The allocator's refusal mid-run (torch's CPU allocator raises a plain RuntimeError) is exit 2, one line."""
    from bloomery_cli.bench import command as bench

    def refuse(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 10003200000 bytes.")

    monkeypatch.setattr(bench, "bench", refuse)
    one_line_exit2(invoke(*TINY, "--prompt-len", "30000", "-n", "4"), "out of memory", "--prompt-len 30000")


# --- plan ----------------------------------------------------------------------------------------------------

def test_plan_ctx_past_the_positions(tmp_path):
    target, _ = make_qwen3_hf(tmp_path / "t")                   # max_position_embeddings 128
    one_line_exit2(invoke("plan", str(target), "--gpu-mem", "1G", "--ctx", "129"), "--ctx", "past the target's 128")


def test_plan_measure_absurd_ctx_refused_before_building(monkeypatch):
    from bloomery_cli.plan import measure as plan_measure

    monkeypatch.setattr(plan_measure, "_build", lambda *a, **k: pytest.fail("the engine was built"))
    one_line_exit2(invoke("plan", "--shape", "tiny", "--gpu-mem", "1000T", "--ctx", "10000000", "--measure",
                          "--device", "cpu"), "--ctx", "past the target's")


def test_plan_measure_ctx_one_is_refused_not_failed(monkeypatch):
    from bloomery_cli.plan import measure as plan_measure

    monkeypatch.setattr(plan_measure, "_build", lambda *a, **k: pytest.fail("the engine was built"))
    one_line_exit2(invoke("plan", "--shape", "tiny", "--gpu-mem", "1G", "--ctx", "1", "--measure", "--device", "cpu"),
                   "--ctx: 1", "expected --ctx >=")


def test_plan_measure_ctx_past_free_memory(monkeypatch):
    from bloomery_cli import preflight
    from bloomery_cli.plan import measure as plan_measure

    monkeypatch.setattr(plan_measure, "_build", lambda *a, **k: pytest.fail("the engine was built"))
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 1 << 20)
    one_line_exit2(invoke("plan", "--shape", "tiny", "--gpu-mem", "1G", "--ctx", "4096", "--measure", "--device",
                          "cpu"), "--ctx: 4096", "free on cpu")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_plan_config_is_an_endless_device(tmp_path):
    target, _ = make_qwen3_hf(tmp_path / "t")
    (target / "config.json").unlink()
    (target / "config.json").symlink_to("/dev/zero")
    one_line_exit2(invoke("plan", str(target), "--gpu-mem", "1G"), "config.json", "larger than")


@pytest.mark.parametrize("value", ["12XB", "0", "1e400"])
def test_plan_gpu_mem(value):
    one_line_exit2(invoke("plan", "--shape", "tiny", "--gpu-mem", value), "--gpu-mem")


def test_plan_says_the_target_alone_does_not_fit():
    r = invoke("plan", "--shape", "qwen38-27b", "--gpu-mem", "24GiB")
    assert r.exit_code == 0, r.output
    assert "the target alone does not fit" in r.output and "24.00 GiB" in r.output, r.output


# --- results -------------------------------------------------------------------------------------------------

@pytest.fixture
def results(tmp_path) -> Path:
    """A copy of the committed CPU records (the READMEs regenerated from them), to spoil one record of."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS / "cpu", root / "cpu", ignore=shutil.ignore_patterns("*.png", "*.md", "*.txt"))
    (root / "cpu" / "README.md").write_text("untouched\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def spoil(root: Path, how: str) -> Path:
    src = next(p for p in sorted((root / "cpu").glob("*.json")) if "acceptance" in json.loads(p.read_text()))
    bad = root / "cpu" / "zz-bad.json"
    if how == "string-number":
        rec = json.loads(src.read_text())
        rec["acceptance"]["accept_mean"] = "high"
        bad.write_text(json.dumps(rec))
    elif how == "utf8":
        bad.write_bytes(b'{"gate": "\xff\xfe"}')
    elif how == "deep":
        bad.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "array":
        bad.write_text("[1, 2]")
    elif how == "syntax":
        bad.write_text('{"gate": ')
    elif how == "kept-strings":
        rec = json.loads(src.read_text())
        rec["acceptance"]["kept"] = ["a"]
        bad.write_text(json.dumps(rec))
    return bad


@pytest.mark.parametrize("how, needle", [("string-number", "key 'acceptance.accept_mean'"), ("utf8", "not UTF-8"),
                                         ("deep", "nested too deeply"), ("array", "expected a results record"),
                                         ("syntax", "cannot parse"), ("kept-strings", "acceptance.kept[0]")])
def test_results_names_the_bad_record_and_changes_nothing(results, how, needle):
    bad = spoil(results, how)
    before = snapshot(results)
    one_line_exit2(invoke("results", "--dir", str(results), "--no-plots"), "zz-bad.json", needle)
    assert snapshot(results) == before, "a README was rewritten before the bad record was found"
    assert bad.exists()


def test_results_readme_without_markers_changes_nothing(results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    before = snapshot(results)
    one_line_exit2(invoke("results", "--dir", str(results), "--no-plots", "--readme", str(readme)), "README.md",
                   "markers")
    assert snapshot(results) == before and readme.read_text() == "no markers here\n"


def test_results_committed_records_all_pass_the_schema():
    """The schema holds every committed record (else `bloomery results` on the repository would refuse)."""
    from bloomery_cli.results.schema import load_checked

    assert len(load_checked(RESULTS)) == len(list(RESULTS.rglob("*.json")))


# --- inventory and the shard index ---------------------------------------------------------------------------

def test_inventory_refuses_an_index_that_leaves_the_folder(tmp_path):
    target, _ = make_qwen3_hf(tmp_path / "t")
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(target / "model.safetensors", outside)
    names = json.loads((target / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (target / "model.safetensors").read_bytes()[:8], "little")])
    wm = {n: "../elsewhere.safetensors" for n in names if n != "__metadata__"}
    (target / "model.safetensors").unlink()
    index = target / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": wm}))
    one_line_exit2(invoke("inventory", str(index)), "index.json", "expected a file name in this folder")
    one_line_exit2(invoke("inventory", str(target)), "index.json", "expected a file name in this folder")
    one_line_exit2(invoke("plan", str(target), "--gpu-mem", "1G"), "index.json", "expected a file name in this folder")


def test_inventory_mmap_refusal_named(tmp_path, monkeypatch):
    from bloomery_cli.formats import hf_dir

    target, _ = make_qwen3_hf(tmp_path / "t")

    def refuse(*a, **k):
        raise MemoryError

    monkeypatch.setattr(hf_dir, "safe_open", refuse)
    one_line_exit2(invoke("inventory", str(target / "model.safetensors")), "model.safetensors")


# --- fixtures ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("manifest, needle", [("[1, 2]", "expected a JSON object"),
                                              ('{"format": "x", "files": [1]}', "key 'files'"),
                                              ('{"format": "x", "files": {"a": 5}}', "files['a']"),
                                              ('{"format": "x", "files": {"../a": {"bytes": 1, "sha256": "0"}}}',
                                               "inside"),
                                              ('{"format": 5}', "key 'format'")])
def test_fixtures_verify_manifest_of_the_wrong_shape(tmp_path, manifest, needle):
    (tmp_path / "MANIFEST.json").write_text(manifest)
    one_line_exit2(invoke("fixtures", "verify", "--out", str(tmp_path)), "MANIFEST.json", needle)


def test_fixtures_build_bad_device(tmp_path):
    one_line_exit2(invoke("fixtures", "build", "--out", str(tmp_path / "fx"), "--device", "tpu"), "--device")
    assert not (tmp_path / "fx").exists()


# --- readers: claims sized by the file, typed arrays ---------------------------------------------------------

def test_moe_expert_count_past_the_file_refused_before_the_tables(tmp_path):
    """num_experts 10^8 on a per-expert checkpoint of 4: refused before 10^8-long name tables (bounded memory)."""
    from test_qwen35moe import make_qwen35moe, write_hf

    from bloomery_cli.loading import load_target

    spec = make_qwen35moe()
    load_target(write_hf(tmp_path / "ok", spec, per_expert=True))       # the imports, outside the measurement
    d = write_hf(tmp_path / "m", spec, per_expert=True, num_experts=10**8)
    tracemalloc.start()
    try:
        with pytest.raises(BadTensor, match="num_experts is 100000000"):
            load_target(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak} bytes allocated before refusing"


@pytest.mark.parametrize("value", [["a", "b", "c"], [1.5, 2, 3], [None, 1, 2]])
def test_gguf_typed_array_of_the_wrong_type(value):
    from bloomery_cli.families.mimo2 import reader_gguf as mimo2_gguf
    from bloomery_cli.formats.config import Cfg

    cfg = Cfg({"mimo2.attention.sliding_window_pattern": value, "mimo2.expert_feed_forward_length": value,
               "mimo2.expert_count": 8, "mimo2.expert_used_count": 2}, "x.gguf")
    with pytest.raises(BadConfig, match="sliding_window_pattern"):
        mimo2_gguf._flags(cfg, "mimo2.attention.sliding_window_pattern", 3)
    with pytest.raises(BadConfig, match="expert_feed_forward_length"):
        mimo2_gguf._moe(cfg, "mimo2.")


def test_a_moe_bench_records_checks_are_booleans():
    from bloomery_cli.results.schema import check_record

    good = {"bench": "moe", "checks": {"worst_case_planted": True}}
    assert check_record("r.json", good) is good
    with pytest.raises(InputError, match=r"checks\.worst_case_planted"):
        check_record("r.json", {"bench": "moe", "checks": {"worst_case_planted": "yes"}})
    with pytest.raises(InputError, match="expected an array"):                 # a gate record's are check lines
        check_record("r.json", {"gate": "qwen3-dflash", "checks": {"x": True}})
