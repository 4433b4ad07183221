"""Issue 29 part 6: the acceptance figures re-derived from the emitted ids and window boundaries
(``acceptance_check``) and compared exactly; accept_mean computed without the bonus row exits 1 (f32, bf16)."""

from __future__ import annotations

import pytest
from issue29_plants import accept_mean_without_bonus, gate_run, line, shrink_s

from bloomery_cli.acceptance_check import compare, kept_from_ids
from bloomery_cli.metrics import Tally
from bloomery_cli.speculative import Run
from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS

built = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")
HEAD = "(a) acceptance re-derived"


def toy_runs() -> tuple[list[Run], Tally]:
    """Two hand-made runs: e_0, then windows (proposals, kept) whose emitted ids follow rule (1)."""
    a = Run([], Tally(), [7, 1, 2, 9, 4, 5, 3, 2], [([1, 2, 6], 3), ([8, 8], 1), ([5], 2), ([], 1)])
    b = Run([], Tally(), [0, 6, 6, 6, 6], [([6, 6, 6], 4)])
    pooled = Tally()
    for p, k in ((3, 3), (2, 1), (1, 2), (3, 4)):
        pooled.add(p, k)
    return [a, b], pooled


def test_rederived_figures_equal_the_tally():
    runs, pooled = toy_runs()
    got, differ = compare(runs, pooled)
    assert differ == [] and got.kept == [3, 1, 2, 4] and got.ids == 13


def test_an_emitted_id_that_contradicts_kept_is_seen():
    runs, pooled = toy_runs()
    runs[0].emitted[2] = 6                        # the window emitted the third proposal: kept 3 is no longer true
    _, differ = compare(runs, pooled)
    assert any("ids give kept" in d for d in differ), differ


def test_a_boundary_past_the_end_and_no_window_are_seen():
    runs, pooled = toy_runs()
    runs[1].emitted.append(1)
    assert any("windows end at" in d for d in compare(runs, pooled)[1])
    assert compare([], Tally())[1] == ["no drafted window"]


def test_kept_from_ids_stops_at_the_first_mismatch():
    assert kept_from_ids([4, 5, 6], [9, 4, 5, 7], 1) == 3 and kept_from_ids([4], [9, 4], 1) == 2


def test_planted_accept_mean_without_bonus_is_seen_in_units(monkeypatch):
    runs, pooled = toy_runs()
    accept_mean_without_bonus(monkeypatch)
    assert compare(runs, pooled)[1] == ["accept_mean"]


@pytest.fixture(scope="module")
def one_prompt(tmp_path_factory):
    path = tmp_path_factory.mktemp("i29") / "one.jsonl"
    path.write_text(PROMPTS.read_text().splitlines()[0] + "\n")
    return path


GATES = {"qwen3-dflash greedy": ("qwen3-dflash", []), "qwen38-mtp T=1": ("qwen38-mtp", ["--temperature", "1"])}


@built
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate", list(GATES))
def test_clean_acceptance_rederives(gate, dtype, one_prompt, monkeypatch):
    shrink_s(monkeypatch)
    name, flags = GATES[gate]
    code, lines = gate_run(name, one_prompt, dtype, *flags)
    got = [x for x in lines if x.startswith(HEAD)]
    assert code == 0 and got and all(x.endswith(" PASS") for x in got), "\n".join(lines)


@built
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("gate", list(GATES))
def test_planted_accept_mean_without_bonus_fails(gate, dtype, one_prompt, monkeypatch):
    shrink_s(monkeypatch)
    accept_mean_without_bonus(monkeypatch)
    name, flags = GATES[gate]
    code, lines = gate_run(name, one_prompt, dtype, *flags)
    assert code == 1 and line(lines, HEAD).endswith(" FAIL"), "\n".join(lines)
