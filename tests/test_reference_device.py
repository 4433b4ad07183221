"""--reference-device / --reference-compare (issue 16) through the whole gate, on a strict fake device (tests/fake_xp:
NumPy arithmetic behind CuPy's refusal to mix): every line the host reference gives comes out the same, the load
line and the record say where the reference ran, a device that errs is caught by the compare line (exit 1), and a
device that cannot run is exit 2 before any work."""

from __future__ import annotations

import json
import re

import pytest
from fake_xp import fake_device
from gate_run import failed, run_named
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_gates.gates import GATES
from bloomery_gates.reference import xp as rxp

VARYING = ("load ", "cost ", "(r) reference on ")      # where the reference ran, what it cost, the compare line


def _stable(lines: list[str]) -> list[str]:
    """The lines that do not depend on where the reference ran, the draft's wall-time share blanked."""
    return [re.sub(r"draft_share=[0-9.]+", "draft_share=", x) for x in lines if not x.startswith(VARYING)]


def _plant_cuda(monkeypatch, plant=None) -> None:
    """``reference.xp.cuda`` hands out the fake device (as if CuPy and a card were here)."""
    monkeypatch.setattr(rxp, "cuda", lambda spec: fake_device(plant, name="cuda:0" if spec == "cuda" else spec))


@pytest.mark.parametrize("gate", sorted(GATES))
def test_every_gate_prints_the_host_lines_with_the_reference_on_a_device(monkeypatch, gate):
    """The reference on the (fake) device, compared with the host: the same lines as the host reference's run,
    the compare line at worst rel 0 (the fake device's arithmetic is NumPy's), the load line says cuda:0."""
    host_code, host = run_named(gate, n=16, prompts=1)
    _plant_cuda(monkeypatch)
    code, lines = run_named(gate, n=16, prompts=1, reference_device="cuda", reference_compare=True)
    assert code == host_code
    assert _stable(lines) == _stable(host)
    load = next(x for x in lines if x.startswith("load "))
    assert "reference=cuda:0" in load
    compare = next(x for x in lines if x.startswith("(r) reference on cuda:0 vs host f64:"))
    assert "worst rel 0.000e+00" in compare and compare.endswith(" PASS")
    assert "reference=cuda:0 reference_s=" in next(x for x in lines if x.startswith("cost "))


def test_a_device_that_errs_fails_the_compare_line(monkeypatch, tmp_path):
    """A planted device defect (its sqrt off by 1e-9 relative: every norm a little off, far inside every (r) band)
    passes every kernel line but fails the compare line: exit 1; the record holds the worst rel and where."""
    _plant_cuda(monkeypatch, {"sqrt": lambda f: lambda x, *a, **k: f(x, *a, **k) * (1 + 1e-9)})
    out = tmp_path / "rec.json"
    code, lines = run_named("qwen3-dflash", n=16, prompts=1, reference_device="cuda", reference_compare=True,
                            json=out)
    assert code == 1 and failed(lines, "(r) reference on cuda:0 vs host f64:")
    assert not [x for x in lines if x.endswith(" FAIL") and not x.startswith("(r) reference on")]
    rec = json.loads(out.read_text())["reference"]
    assert rec["device"] == "cuda:0" and rec["compare"] and 1e-12 < rec["worst_rel"] < 1e-6
    assert rec["compared_tensors"] > 20 and rec["emulated_not_compared"] > 0 and rec["wall_s"] > 0


@pytest.mark.parametrize("args", [["--reference-device", "cuda"], ["--reference-device", "cuda:7"],
                                  ["--reference-device", "tpu"], ["--reference-compare"]])
def test_a_reference_device_that_cannot_run_is_exit_2_before_work(args, tmp_path):
    """No CuPy here (or a card that is not there, a bad spelling, compare without a card): one error line, exit 2,
    no record written, on `gate run` and on `gates`."""
    pytest.importorskip("typer")
    try:
        rxp.cuda("cuda")
        pytest.skip("CuPy and a card are here: a cuda reference device can run")
    except ValueError:
        pass
    out = tmp_path / "rec.json"
    for cmd in (["gate", "run", "qwen3-dflash", "--json", str(out), *args], ["gates", "--results", str(tmp_path),
                                                                            *args]):
        res = CliRunner().invoke(app, cmd)
        assert res.exit_code == 2, res.output
        assert "--reference-" in res.output and "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []
