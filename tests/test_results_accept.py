"""The acceptance table per target x draft (results_accept): the latest record per key, the published figures
beside it marked external, and the README's marked block rewritten by `bloomery results`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.results.accept import BEGIN, END, summary_rows


def rec(gate: str, kind: str, date: str, am: float, device: str = "NVIDIA H200") -> dict:
    return {"gate": gate, "target": "fixtures/qwen3-tiny", "draft": f"fixtures/{kind}-d", "n": 256, "prompts": 8,
            "dtype": "bf16", "passed": True, "load": {"draft": kind},
            "conditions": {"device_name": device, "date": date},
            "acceptance": {"accept_mean": am, "accept_mean_macro": am + 0.1, "pos_accept": [0.5, 0.25],
                           "draft_share": 0.2}}


def test_latest_record_per_key_with_published_beside():
    records = [(Path("h200/a.json"), rec("qwen3-dflash", "dflash", "2026-11-01", 1.5)),
               (Path("h200/b.json"), rec("qwen3-dflash", "dflash", "2026-12-01", 2.5)),
               (Path("cpu/c.json"), rec("qwen3-dflash", "dflash", "2026-10-01", 3.5, "cpu")),
               (Path("h200/d.json"), rec("qwen3-eagle3", "eagle3", "2026-12-01", 1.6))]
    rows = summary_rows(records)
    assert [(r[0], r[3], r[8]) for r in rows] == [("qwen3-dflash", "2.500", "NVIDIA H200"),
                                                   ("qwen3-dflash", "3.500", "cpu"),
                                                   ("qwen3-eagle3", "1.600", "NVIDIA H200")]
    assert rows[0][4] == "2.600" and rows[0][5] == "[0.50, 0.25]" and rows[0][7] == "256 x 8"
    assert "6.55 GSM8K" in rows[0][12] and rows[0][12].endswith("(external)") and "T=0" in rows[0][12]


def test_results_rewrites_only_the_marked_block(tmp_path):
    res = tmp_path / "results"
    (res / "h200").mkdir(parents=True)
    (res / "h200" / "x.json").write_text(json.dumps(rec("qwen3-dspark", "dspark", "2026-12-01", 2.7)))
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n\nkeep me\n\n{BEGIN}\nold table\n{END}\n\ntail stays\n")
    r = CliRunner().invoke(app, ["results", "--dir", str(res), "--no-plots"])
    assert r.exit_code == 0, r.output
    text = readme.read_text()
    assert text.startswith("# top\n\nkeep me\n\n") and text.endswith("\n\ntail stays\n")
    assert "old table" not in text and "| qwen3-dspark | qwen3-tiny | dspark (dspark-d) | 2.700 |" in text
    assert "(results/h200/x.json)" in text and "6.17" in text
    assert "| qwen3-dspark |" in (res / "h200" / "README.md").read_text()       # the tables: per device folder
    assert "| qwen3-dspark |" not in (res / "README.md").read_text()             # the index: links only
    assert "(h200/README.md)" in (res / "README.md").read_text()


def test_a_named_readme_without_markers_is_exit_2(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    (tmp_path / "R.md").write_text("no markers\n")
    r = CliRunner().invoke(app, ["results", "--dir", str(res), "--no-plots", "--readme", str(tmp_path / "R.md")])
    assert r.exit_code == 2 and "markers" in r.output
    assert (tmp_path / "R.md").read_text() == "no markers\n"


def test_sampled_record_gets_its_own_row_not_the_greedy_one():
    """A later T=1 record of the same gate, device and dtype must not replace the greedy row (they are different
    quantities): each gets a row, with its temperature."""
    t1 = rec("qwen3-dflash", "dflash", "2026-12-02", 1.2)
    t1["sampling"] = {"temperature": 1.0}
    rows = summary_rows([(Path("h200/g.json"), rec("qwen3-dflash", "dflash", "2026-12-01", 2.5)),
                         (Path("h200/t.json"), t1)])
    assert sorted((r[3], r[10]) for r in rows) == [("1.200", "1"), ("2.500", "0")]
