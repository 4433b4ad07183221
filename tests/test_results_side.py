"""results/README.md's greedy / T = 1 side-by-side table (one row per gate x device x dtype, `-` where no record)
and the random-weight real-layout section (kept out of the acceptance tables), from record sets in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

from bloomery_cli.results import side as results_side
from bloomery_cli.results.side import SIDE_HEAD, side_by_side_rows
from bloomery_cli.results.table import SAMPLED_ANCHORS, load_records, render


def _rec(gate: str, device: str, dtype: str, accept: float, t: float | None = None, date: str = "2026-12-01",
         target: str = "fixtures/qwen3-tiny", s_ok: bool = True, p: float = 0.25, kind: str = "dflash2") -> dict:
    r = {"gate": gate, "target": target, "draft": "fixtures/d", "device": "cuda", "dtype": dtype, "n": 16,
         "prompts": 2, "load": {"draft": kind}, "passed": True,
         "acceptance": {"accept_mean": accept, "accept_mean_macro": accept, "pos_accept": [0.5], "draft_share": 0.3},
         "checks": [{"line": "(w) prompt 0: ids identical 16", "ok": True}],
         "conditions": {"device_name": device, "commit": "abc", "date": date}}
    if t is not None:
        r["sampling"] = {"temperature": t, "top_p": 1.0, "top_k": 0, "seed": 0, "q": "point mass"}
        r["sampling_test"] = {"p": p, "alpha": 0.001}
        r["checks"].append({"line": "(s) sampling: ... p=...", "ok": s_ok})
    return r


def _write(root: Path, name: str, rec: dict) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(json.dumps(rec))


def _rows(root: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    return {(r[0], r[1], r[2]): dict(zip(SIDE_HEAD, r, strict=True))
            for r in side_by_side_rows(load_records(root), SAMPLED_ANCHORS)}


def test_greedy_and_t1_side_by_side_and_a_missing_record_is_a_dash(tmp_path):
    _write(tmp_path, "h200/a-greedy.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 2.5))
    _write(tmp_path, "h200/a-old-greedy.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 9.9, date="2026-01-01"))
    _write(tmp_path, "h200/a-t1.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 1.4, t=1.0, p=0.894))
    _write(tmp_path, "h200/a-t07.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 1.9, t=0.7))
    _write(tmp_path, "cpu/b-greedy.json", _rec("qwen3-dflash2", "cpu", "f32", 2.6))
    _write(tmp_path, "cpu/c-t1.json", _rec("qwen38-mtp", "cpu", "f32", 1.3, t=1.0, s_ok=False, p=1e-5, kind="mtp"))
    rows = _rows(tmp_path)
    both = rows[("qwen3-dflash2", "NVIDIA H200", "bf16")]
    assert (both["accept_mean greedy"], both["accept_mean T=1"], both["(s) verdict, p"]) == ("2.500", "1.400",
                                                                                             "PASS, p=0.894")
    assert both["published at T = 1 (external)"] == SAMPLED_ANCHORS["dflash2"]
    assert both["greedy record"] == "[a-greedy.json](h200/a-greedy.json)"
    assert both["T=1 record"] == "[a-t1.json](h200/a-t1.json)"
    only_greedy = rows[("qwen3-dflash2", "cpu", "f32")]
    assert only_greedy["accept_mean greedy"] == "2.600" and only_greedy["accept_mean T=1"] == "-"
    assert only_greedy["(s) verdict, p"] == "-" and only_greedy["T=1 record"] == "-"
    only_t1 = rows[("qwen38-mtp", "cpu", "f32")]
    assert only_t1["accept_mean greedy"] == "-" and only_t1["greedy record"] == "-"
    assert only_t1["(s) verdict, p"] == "FAIL, p=1e-05" and only_t1["published at T = 1 (external)"] == \
        SAMPLED_ANCHORS["mtp"]
    empty = rows[("qwen38-mtp", "NVIDIA H200", "bf16")]                  # gate x device x dtype with no record
    assert all(empty[h] == "-" for h in SIDE_HEAD[3:7] + SIDE_HEAD[8:])
    assert len(rows) == 2 * 2                                           # 2 gates x 2 (device, dtype)
    text = render(tmp_path)
    assert "## Greedy and T = 1 side by side" in text
    assert "| qwen3-dflash2 | NVIDIA H200 | bf16 | qwen3-tiny | 2.500 | 1.400 | PASS, p=0.894 |" in text
    assert "## Greedy and sampled acceptance" not in text              # folded into this one


def test_the_greedy_cell_takes_the_t1_runs_target(tmp_path):
    _write(tmp_path, "cpu/gguf.json", _rec("qwen3-dflash2", "cpu", "f32", 2.2, target="fixtures/qwen3-tiny.gguf",
                                           date="2026-12-02"))
    _write(tmp_path, "cpu/hf.json", _rec("qwen3-dflash2", "cpu", "f32", 2.6))
    _write(tmp_path, "cpu/t1.json", _rec("qwen3-dflash2", "cpu", "f32", 1.3, t=1.0))
    row = _rows(tmp_path)[("qwen3-dflash2", "cpu", "f32")]
    assert row["accept_mean greedy"] == "2.600" and row["target"] == "qwen3-tiny"


def test_planted_defect_t1_never_recognised_empties_the_cell(tmp_path, monkeypatch):
    """The check above fails on the defect it guards: a T = 1 record not taken as one leaves the cell '-'."""
    _write(tmp_path, "h200/t1.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 1.4, t=1.0))
    _write(tmp_path, "h200/g.json", _rec("qwen3-dflash2", "NVIDIA H200", "bf16", 2.5))
    assert _rows(tmp_path)[("qwen3-dflash2", "NVIDIA H200", "bf16")]["accept_mean T=1"] == "1.400"
    monkeypatch.setattr(results_side, "_is_t1", lambda r: False)
    assert _rows(tmp_path)[("qwen3-dflash2", "NVIDIA H200", "bf16")]["accept_mean T=1"] == "-"


def _real(tmp_path: Path) -> str:
    rec = _rec("qwen3-dflash", "NVIDIA H200", "bf16", 1.0, target="/tmp/ck/qwen3-8b/target", kind="dflash")
    rec["passed"] = False
    rec["checks"].append({"line": "(b) accepts 0 of 930 proposals: both branches ran", "ok": False})
    _write(tmp_path, "h200/real/qwen3-dflash-qwen3-8b-real.json", rec)
    _write(tmp_path, "h200/qwen3-dflash-cuda-bf16.json", _rec("qwen3-dflash", "NVIDIA H200", "bf16", 2.0,
                                                              kind="dflash"))
    return render(tmp_path)


def _section(text: str, title: str) -> str:
    i = text.index(title)
    j = text.find("\n## ", i + 1)
    return text[i:j if j > 0 else None]


def test_random_real_layout_runs_have_their_own_section(tmp_path):
    text = _real(tmp_path)
    acceptance = _section(text, "## Acceptance per target x draft") + _section(text, "## Greedy and T = 1")
    assert "qwen3-dflash-qwen3-8b-real.json" not in acceptance and "qwen3-dflash-cuda-bf16.json" in acceptance
    rnd = _section(text, "## Random-weight real-layout runs")
    assert "accept_mean is 1.0" in rnd and "h200/real/NOTE.md" in rnd
    assert "| qwen3-dflash | /tmp/ck/qwen3-8b/target |" in rnd and "(b) accepts 0 of 930 proposals" in rnd
    assert "| 1.000 |" in rnd and "FAILED" in rnd


def test_random_layout_by_conditions_too():
    assert results_side.is_random_layout(Path("h200/x.json"), {"conditions": {"weights": "random (real layout)"}})
    assert not results_side.is_random_layout(Path("h200/x.json"), {"conditions": {"device_name": "NVIDIA H200"}})


def test_planted_defect_random_runs_among_the_acceptance_rows(tmp_path, monkeypatch):
    """The section test fails on the defect it guards: with the detection planted away, the real-layout record
    is back among the acceptance rows and its section is gone."""
    monkeypatch.setattr(results_side, "is_random_layout", lambda path, r: False)
    text = _real(tmp_path)
    assert "qwen3-dflash-qwen3-8b-real.json" in _section(text, "## Acceptance per target x draft")
    assert "## Random-weight real-layout runs" not in text


def test_a_draft_on_its_own_device_or_a_split_target_gets_rows_of_its_own():
    from bloomery_cli.results.side import device_label

    base = {"device": "cuda", "conditions": {"device_name": "NVIDIA H200"}, "load": {"draft": "dflash"}}
    assert device_label(base) == "NVIDIA H200"
    moved = {**base, "load": {"draft": "dflash", "draft_device": "cpu"}}
    assert device_label(moved) == "NVIDIA H200 (draft on cpu)"
    same = {**base, "load": {"draft": "dflash", "draft_device": "cuda"}}
    assert device_label(same) == "NVIDIA H200"
    assert device_label({**base, "load": {"tp": 2}}) == "NVIDIA H200 (tp 2)"
