"""`bloomery results`: README tables regenerated from the committed records (results/h200), anchors marked
external, a bench record's tables, and the PNGs only where matplotlib imports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bloomery_cli.results.table import ANCHORS, load_records, render, write

RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_acceptance_table_from_the_committed_h200_records():
    text = render(RESULTS)
    for rec_path in sorted((RESULTS / "h200").glob("qwen3-*.json")):
        rec = json.loads(rec_path.read_text())
        acc = rec["acceptance"]
        row = next(line for line in text.splitlines() if f"({rec_path.relative_to(RESULTS).as_posix()})" in line)
        assert row.startswith(f"| {rec['gate']} |")
        assert f"| {acc['accept_mean']:.3f} | {acc['accept_mean_macro']:.3f} |" in row
        assert f"| {acc['draft_share']:.3f} |" in row and "NVIDIA H200" in row and "| bf16 |" in row
        assert f"| {rec['n']} x {rec['prompts']} |" in row and rec["conditions"]["commit"] in row
    assert "external" in text
    for _, source, published in ANCHORS:
        assert f"| {source} | {published} |" in text
    assert "## DFlash2 kernels" in text
    benches = sorted(RESULTS.glob("h200/bench-qwen3-*.json"))
    if not benches:
        assert "No bench records yet." in text
    for path in benches:                       # every committed bench record has its row
        assert f"({path.relative_to(RESULTS).as_posix()})" in text


def test_render_is_a_function_of_the_records():
    assert render(RESULTS) == render(RESULTS)


def test_bench_record_tables(tmp_path):
    shutil.copytree(RESULTS / "h200", tmp_path / "h200")
    from bloomery_cli.bench.command import bench

    rec = bench("qwen3-dflash", "tiny", "cpu", "f32", prompt_len=16, n=24, hf_tokens=4, emit=lambda line: None,
                quiet=True)
    (tmp_path / "h200" / "bench-tiny.json").write_text(json.dumps(rec))
    assert len(load_records(tmp_path)) == len(load_records(RESULTS / "h200")) + 1
    text = render(tmp_path)
    bench_row = next(line for line in text.splitlines() if "(h200/bench-tiny.json)" in line)
    assert bench_row.startswith("| qwen3-dflash | tiny |") and f"{rec['plain']['tok_s']:.1f}" in bench_row
    assert "Acceptance sweep of `h200/bench-tiny.json`" in text
    assert "`--width cost` at a = 0.02" in text and "`--width cost` at a = 0.98" in text
    for png in (tmp_path / "h200").rglob("*.png"):
        png.unlink()
    path, pngs = write(tmp_path, plots=False)
    device = tmp_path / "h200" / "README.md"       # the tables per device folder, links relative to it
    assert device.read_text() == render(tmp_path / "h200", [], "Results: h200") and pngs == []
    assert "(bench-tiny.json)" in device.read_text()
    assert path == tmp_path / "README.md" and "(h200/README.md)" in path.read_text() and "| ---" not in path.read_text()
    (tmp_path / "h200" / "kept-histograms.png").write_bytes(b"png")          # made earlier where matplotlib was
    path, pngs = write(tmp_path, plots=False)
    assert pngs == ["h200/kept-histograms.png"]
    assert "![kept-histograms.png](kept-histograms.png)" in device.read_text()


def test_plots_when_matplotlib_is_there(tmp_path):
    """Each record's plot beside its record, the plots over several records at the top of the device folder, none
    at the top of the results folder."""
    pytest.importorskip("matplotlib")
    shutil.copytree(RESULTS / "h200", tmp_path / "h200")
    for png in (tmp_path / "h200").rglob("*.png"):
        png.unlink()
    path, pngs = write(tmp_path, plots=True)
    assert "h200/kept-histograms.png" in pngs and (tmp_path / "h200" / "kept-histograms.png").stat().st_size > 1000
    assert "![kept-histograms.png](kept-histograms.png)" in (tmp_path / "h200" / "README.md").read_text()
    assert "h200/plot-bench-qwen3-8b-cuda-bf16.png" in pngs       # beside h200/bench-qwen3-8b-cuda-bf16.json
    for name in pngs:
        if Path(name).name.startswith("plot-") and not Path(name).name.startswith("plot-shape-"):
            record = tmp_path / Path(name).parent / (Path(name).name.removeprefix("plot-")[:-4] + ".json")
            assert record.is_file(), name
    assert not list(tmp_path.glob("*.png"))


def test_results_command_exit_codes(tmp_path):
    import typer
    from typer.testing import CliRunner

    from bloomery_cli.results.table import results_command

    app = typer.Typer()
    app.command()(results_command)
    missing = CliRunner().invoke(app, ["--dir", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
    shutil.copytree(RESULTS / "h200", tmp_path / "h200")
    ok = CliRunner().invoke(app, ["--dir", str(tmp_path), "--no-plots"])
    assert ok.exit_code == 0 and (tmp_path / "README.md").is_file()


def test_greedy_and_sampled_acceptance_side_by_side(tmp_path):
    rec = json.loads((RESULTS / "h200" / "qwen3-dflash2-cuda-bf16.json").read_text())     # a greedy record
    sampled = json.loads(json.dumps(rec))
    sampled["acceptance"]["accept_mean"] = 1.234
    sampled["sampling"] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0, "draft_temperature": None,
                           "draft_top_k": 0, "q": "point mass"}
    sampled["sampling_test"] = {"p": 0.5, "alpha": 0.001}
    (tmp_path / "greedy.json").write_text(json.dumps(rec))
    (tmp_path / "t1.json").write_text(json.dumps(sampled))
    text = render(tmp_path)
    side = text[text.index("## Greedy and T = 1 side by side"):]
    row = next(line for line in side.splitlines() if line.startswith("| qwen3-dflash2 |"))
    assert f"| {rec['acceptance']['accept_mean']:.3f} | 1.234 |" in row and "5.97" in row
    assert "| qwen3-dflash2 | greedy |" in text and "| qwen3-dflash2 | T=1 |" in text


def test_the_histogram_keeps_the_newest_record_per_gate_and_dtype():
    """One panel a gate; in it the newest record of each dtype (an older record of the same pair adds bars, not
    information); records without a kept histogram (benches) are not gates."""
    from bloomery_cli.results.side import newest_per_gate

    def rec(gate, dtype, date, kept=(3, 1)):
        return {"gate": gate, "dtype": dtype, "conditions": {"date": date}, "acceptance": {"kept": list(kept)}}

    records = [(Path("a/x.json"), rec("qwen3-dflash", "bf16", "2026-12-01")),
               (Path("b/x.json"), rec("qwen3-dflash", "bf16", "2026-12-03")),
               (Path("c/x.json"), rec("qwen3-dflash", "f32", "2026-12-02")),
               (Path("d/x.json"), rec("mimo2-mtp", "bf16", "2026-12-02")),
               (Path("e/x.json"), rec("qwen38-mtp", "bf16", "2026-12-02", kept=())),
               (Path("f/x.json"), {"bench": "qwen3-dflash", "sweep": []})]
    got = newest_per_gate(records)
    assert list(got) == ["mimo2-mtp", "qwen3-dflash"]
    assert [str(p) for p, _ in got["qwen3-dflash"]] == ["b/x.json", "c/x.json"]
    # a T = 1 run and another engine's run get bars of their own; a random real-layout run (acceptance 1.0 by
    # construction) is not a quality record, however new
    t1 = rec("qwen3-dflash", "f32", "2026-12-04") | {"sampling": {"temperature": 1.0}}
    llama = rec("qwen3-dflash", "bf16", "2026-12-04") | {"load": {"engine": "llama.cpp"}}
    randw = rec("mimo2-mtp", "bf16", "2026-12-05", kept=(0, 9))
    got = newest_per_gate([*records, (Path("g/x.json"), t1), (Path("h/x.json"), llama),
                           (Path("real/i/x.json"), randw)])
    assert [str(p) for p, _ in got["qwen3-dflash"]] == ["b/x.json", "g/x.json", "c/x.json", "h/x.json"]
    assert [str(p) for p, _ in got["mimo2-mtp"]] == ["d/x.json"]
