"""The gate at T > 0 through the CLI: the (s) line passes on the fixtures, and planted sampling defects
(resample from p instead of the residual, an argmax drafter verified with its softmax as q) turn it red (exit 1).
Bad sampling flags are named exit-2 errors. (The bonus-dropped defect is caught by the exact proof,
tests/test_sampling_exact.py; at T = 1 on the fixtures full acceptance is ~2% of windows and the (s) budget does
not see it: docs/CONTRACT.md.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import bloomery_cli.sampling.rule as sampling
from bloomery_cli.cli import app
from bloomery_cli.sampling.rule import process
from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")


@pytest.fixture
def one_prompt(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(PROMPTS.read_text().splitlines()[0] + "\n")
    return path


def run(gate: str, prompts, *flags: str):
    result = CliRunner().invoke(app, ["gate", "run", gate, "-n", "32", "--prompts", str(prompts), *flags])
    return result.exit_code, result.output.splitlines()


def s_line(lines: list[str]) -> str:
    """The (s) line, which must be a test result (a broken run is a FAIL of another kind)."""
    line = next(line for line in lines if line.startswith("(s) sampling:"))
    assert ", p=" in line and "broke" not in line, line
    return line


def test_t1_passes_and_prints_the_sampled_acceptance(one_prompt, tmp_path):
    record = tmp_path / "r.json"
    code, lines = run("qwen38-mtp", one_prompt, "--temperature", "1", "--json", str(record))
    assert code == 0, "\n".join(lines)
    assert s_line(lines).endswith(" PASS")
    assert any(line.startswith("sampling temperature=1.0") for line in lines)
    assert any(line.startswith("accept_mean=") for line in lines)
    rec = json.loads(record.read_text())
    assert rec["sampling"]["temperature"] == 1.0 and rec["sampling"]["q"] == "point mass"
    assert rec["sampling_test"]["p"] >= rec["sampling_test"]["alpha"]
    assert "acceptance_greedy" in rec and rec["acceptance"]["windows"] > 0


def test_planted_residual_from_p_fails(one_prompt, monkeypatch):
    monkeypatch.setattr(sampling, "residual", lambda p, q, d: p)
    code, lines = run("qwen38-mtp", one_prompt, "--temperature", "1")
    assert code == 1 and s_line(lines).endswith(" FAIL"), "\n".join(lines)


def test_planted_softmax_q_for_an_argmax_drafter_fails(one_prompt, monkeypatch):
    def proposals(self, draft, anchor, k):
        prop = draft.propose(anchor, detail=True)
        return prop.ids[:k], list(process(prop.logits[:k].double().cpu().numpy(), 1.0))

    monkeypatch.setattr(sampling.Sampler, "proposals", proposals)
    code, lines = run("qwen38-mtp", one_prompt, "--temperature", "1")
    assert code == 1 and s_line(lines).endswith(" FAIL"), "\n".join(lines)


@pytest.mark.parametrize("flags, named", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0.9"], "--top-p"),
    (["--temperature", "1", "--top-p", "0"], "--top-p"),
    (["--temperature", "1", "--top-k", "-2"], "--top-k"),
    (["--temperature", "1", "--draft-top-k", "4"], "--draft-top-k"),
    (["--temperature", "1", "--draft-temperature", "0"], "--draft-temperature"),
])
def test_bad_sampling_flags_exit_2(one_prompt, flags, named):
    code, lines = run("qwen3-dflash", one_prompt, *flags)
    assert code == 2 and named in "\n".join(lines), "\n".join(lines)


def test_draft_temperature_on_a_deterministic_drafter_exit_2(one_prompt):
    code, lines = run("qwen38-mtp", one_prompt, "--temperature", "1", "--draft-temperature", "1")
    assert code == 2 and "proposes deterministically" in "\n".join(lines), "\n".join(lines)


def test_seeded_choice_is_reproducible_and_never_draws_a_zero():
    dist = np.array([0.0, 0.5, 0.0, 0.5])
    a = [sampling.SeededChoice(3, 1, 2)(dist) for _ in range(3)]
    b = [sampling.SeededChoice(3, 1, 2)(dist) for _ in range(3)]
    assert a == b
    draws = sampling.SeededChoice(0)
    assert {draws(dist) for _ in range(200)} == {1, 3}
