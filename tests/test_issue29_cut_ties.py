"""Issue 29 parts 2 and 3: DSpark's confidence cut on every window (tier 1, with and without --confidence-cut) and
DFlash2's selector on planted ties. Each planted defect exits 1 in f32 and bf16 (FAIL-first); the clean gates
pass."""

from __future__ import annotations

import pytest
from issue29_plants import CUT_PLANTS, TIE_PLANTS, gate_run

from bloomery_gates.gates import dflash2_ties, dspark_cut
from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")
CUT = "(r) dspark confidence cut"
TIES = "(r) ties: dflash2 selector"


@pytest.fixture(scope="module")
def one_prompt(tmp_path_factory):
    path = tmp_path_factory.mktemp("i29") / "one.jsonl"
    path.write_text(PROMPTS.read_text().splitlines()[0] + "\n")
    return path


def cut_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith(CUT) and " windows (" in x]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate, flags", [("qwen3-dspark", []), ("qwen38-dspark", ["--confidence-cut", "0.5"])])
def test_clean_cut_passes_on_every_window(gate, flags, dtype, one_prompt):
    code, lines = gate_run(gate, one_prompt, dtype, *flags)
    got = cut_lines(lines)
    assert code == 0 and len(got) == 2 and all(x.endswith(" 0 differ PASS") for x in got), "\n".join(lines)
    assert all(int(x.split(" windows (")[1].split(" cut")[0]) > 0 for x in got), got     # cut positions were seen


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("flags", [[], ["--confidence-cut", "0.5"]], ids=["no threshold", "t=0.5"])
@pytest.mark.parametrize("gate", ["qwen3-dspark", "qwen38-dspark"])
@pytest.mark.parametrize("plant", list(CUT_PLANTS))
def test_planted_cut_defect_fails(plant, gate, flags, dtype, one_prompt, monkeypatch):
    CUT_PLANTS[plant](monkeypatch)
    code, lines = gate_run(gate, one_prompt, dtype, *flags)
    assert code == 1 and any(x.endswith(" FAIL") for x in cut_lines(lines)), "\n".join(lines)


def test_cut_judge_excuses_only_at_the_threshold():
    """A window whose kept count differs is excused only where a confidence lies within 1e-6 of t."""
    import numpy as np

    def z(c):
        return np.log(np.asarray(c) / (1 - np.asarray(c)))

    seen = [([5, 6], [5, 6, 7], z([0.9, 0.6, 0.3])),            # host: keep 2 (0.3 < 0.5): equal
            ([5, 6, 7], [5, 6, 7], z([0.9, 0.6, 0.3])),         # one too late: differs
            ([5], [5, 6, 7], z([0.9, 0.5 + 1e-8, 0.9]))]        # kernel cut at 0.5 + 1e-8: excused
    windows, cut, differ, excused, where = dspark_cut.judge(seen, 0.5)
    assert (windows, cut, differ, excused) == (3, 2, 2, 1) and where.startswith("window 1: kernel kept 3, host rule 2")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate", ["qwen3-dflash2", "qwen38-dflash2"])
def test_clean_ties_pass(gate, dtype, one_prompt):
    code, lines = gate_run(gate, one_prompt, dtype)
    got = next(x for x in lines if x.startswith(TIES))
    assert code == 0 and got.endswith(f"{dflash2_ties.CASES} planted cases, 0 differ PASS"), "\n".join(lines)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate", ["qwen3-dflash2", "qwen38-dflash2"])
@pytest.mark.parametrize("plant", list(TIE_PLANTS))
def test_planted_tie_rule_fails(plant, gate, dtype, one_prompt, monkeypatch):
    TIE_PLANTS[plant](monkeypatch)
    code, lines = gate_run(gate, one_prompt, dtype)
    got = next(x for x in lines if x.startswith(TIES))
    assert code == 1 and got.endswith(" FAIL"), "\n".join(lines)


def test_planted_cases_tie_at_the_kth_place_and_in_the_walk():
    """The cases do what the docstring says: every row ties across the K-th place; the Bs = 0 cases' walk rows tie."""
    import numpy as np

    for case in range(dflash2_ties.CASES):
        l, g, a, bs, anchor = dflash2_ties.planted(7, 4096, 16, case)
        top = np.sort(l, axis=-1)[:, ::-1]
        assert (top[:, 7] == top[:, 8]).all() and (top[:, 0] == top[:, 1]).all()
        if case % 2 == 0:
            assert not bs.any()
