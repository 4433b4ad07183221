"""--draft-device: the draft on a device of its own. On the CPU (target and draft both cpu) the crossing is a
same-device copy through the same code path, so ids, verdicts and every check line must equal the run without it;
a wrong tap declaration must fail the gate; a pair without support is refused (exit 2) before any work."""

from __future__ import annotations

import pytest
import torch
from gate_run import run_named
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.parallel import draft_device


def checks(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("(r)", "(w)", "(b)", "ids identical", "state run"))]


def run_facts(name: str, **options):
    from bloomery_cli.gate import GateOptions, run_gate
    from bloomery_gates.gates import GATES

    lines: list[str] = []
    code, report = run_gate(GATES[name], GateOptions(max_prompts=2, **options), emit=lines.append)
    return code, lines, report.facts


def test_same_ids_and_verdicts_with_the_draft_on_cpu():
    code0, plain = run_named("qwen3-dflash", n=32, prompts=2)
    code1, moved, facts = run_facts("qwen3-dflash", n=32, draft_device="cpu")
    assert code0 == code1 == 0
    assert checks(plain) == checks(moved)
    acc = [[x for x in line.split() if not x.startswith("draft_share=")] for line in plain + moved
           if line.startswith("accept_mean=")]
    assert acc[0] == acc[1]
    load = next(line for line in moved if line.startswith("load "))
    assert "draft_device=cpu" in load and "cross_layers=[2, 3, 5]" in load
    crossing = next(line for line in moved if line.startswith("crossing "))
    assert "bytes_per_window=" in crossing and "transfer_share=" in crossing
    # what crossed is the declared layers of the kept rows, window by window: sum(kept) rows of 3 x 128 f32
    acc, cross = facts["acceptance"], facts["crossing"]
    kept_rows = sum((i + 1) * h for i, h in enumerate(acc["kept"]))
    assert cross["windows"] == acc["windows"] and cross["bytes"] == kept_rows * 3 * 128 * 4


@pytest.mark.parametrize("gate", ["qwen3-eagle3", "qwen38-mtp", "mimo2-mtp"])
def test_chained_drafts_cross(gate):
    code, lines = run_named(gate, n=16, prompts=1, draft_device="cpu")
    assert code == 0, "\n".join(lines)
    assert any(line.startswith("crossing ") for line in lines)


def test_a_wrong_tap_declaration_fails(monkeypatch):
    """FAIL-first: one declared layer left out (it stays NaN on the draft's side) -> the draft's (r) lines fail."""
    real = draft_device.tap_layers
    monkeypatch.setattr(draft_device, "tap_layers", lambda *a: real(*a)[1:])
    code, lines = run_named("qwen3-dflash", n=16, prompts=1, draft_device="cpu")
    assert code == 1
    assert any(line.startswith("(r) dflash") and line.endswith("FAIL") for line in lines)


def test_refused_before_work():
    r = CliRunner().invoke(app, ["gate", "run", "qwen3-dflash", "--draft-device", "tpu", "-n", "8"],
                           catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "--draft-device" in r.output and "expected cpu, cuda or cuda:<i>" in r.output
    assert "Traceback" not in r.output


def test_a_kind_without_a_tap_declaration_is_refused():
    """A draft kind nobody declared the taps of (a new drafter) is refused before any model work."""
    from dataclasses import replace

    from bloomery_cli.gate import GateOptions, run_gate
    from bloomery_gates.errors import InputError
    from bloomery_gates.gates import GATES

    lines: list[str] = []
    with pytest.raises(InputError, match="does not support a draft device"):
        run_gate(replace(GATES["qwen3-dflash"], draft_kind="medusa"), GateOptions(n=8, draft_device="cpu"),
                 emit=lines.append)
    assert lines == []


def test_every_registered_gate_can_move_its_draft():
    from bloomery_cli.cli import draft_device_ok
    from bloomery_gates.gates import GATES

    assert all(draft_device_ok(g) for g in GATES.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the target on cuda, the draft on cpu")
@pytest.mark.parametrize("gate", ["qwen3-dflash", "qwen3-eagle3"])
def test_target_on_cuda_draft_on_cpu(gate):
    """The one-GPU form: the taps cross cuda -> cpu; the same ids and verdicts as the draft beside the target."""
    code0, plain = run_named(gate, n=32, prompts=2, device="cuda", dtype="bf16")
    code1, moved = run_named(gate, n=32, prompts=2, device="cuda", dtype="bf16", draft_device="cpu")
    assert code0 == code1 == 0, "\n".join(moved)
    assert [x for x in plain if x.startswith("(w)")] == [x for x in moved if x.startswith("(w)")]
    assert any(line.startswith("crossing ") for line in moved)
