"""kernels/triton/pdl_policy.py: when the decode kernels take programmatic dependent launch (BLOOMERY_PDL, only in
a GraphSet's warm-up and capture, only on CUDA of compute capability 9+), the L2 prefetch budget per row, and a bad
setting as a named error (exit 2) before any work. The device side (griddepcontrol, the prefetch) runs on the H200
only: .ci/diag_pdl.py, whose plain ids must equal those of PDL off (results/h200/speed/*-pdl)."""

from __future__ import annotations

import pytest
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.kernels import graphs
from bloomery_gates.kernels.triton import pdl_policy as p


@pytest.mark.parametrize("text, want", [
    ("", p.Setting(on=True, early=True, l2_bytes=4 << 20)),         # the default: DEFAULT
    ("off", p.Setting()),
    (" off ", p.Setting()),
    ("on", p.Setting(on=True)),
    ("on,early", p.Setting(on=True, early=True)),
    (" on , early , l2=4 ", p.Setting(on=True, early=True, l2_bytes=4 << 20)),
    ("on,l2", p.Setting(on=True, l2_bytes=0)),
    ("on,l2=0.5", p.Setting(on=True, l2_bytes=1 << 19)),
])
def test_setting_parses(text, want):
    assert p.setting(text) == want
    assert p.setting(str(want)) == want                # a record's spelling (describe) reads back as the same


@pytest.mark.parametrize("text", ["yes", "on,l2=abc", "on,l2=-1", "on,l2=0", "early", "l2=4", "on,early,late",
                                  "off,on"])
def test_a_bad_setting_is_a_named_error(text):
    with pytest.raises(InputError, match="BLOOMERY_PDL"):
        p.setting(text)


def test_the_environment_is_read_and_checked_before_any_work(monkeypatch):
    from bloomery_cli.gatekit import resolve_device

    monkeypatch.setenv("BLOOMERY_PDL", "on,l2=4")
    assert p.setting().l2_bytes == 4 << 20
    monkeypatch.setenv("BLOOMERY_PDL", "on,turbo")
    with pytest.raises(InputError, match="turbo"):
        resolve_device("cpu")


def test_the_gate_command_exits_2_on_a_bad_setting(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    monkeypatch.setenv("BLOOMERY_PDL", "on,turbo")
    r = CliRunner().invoke(app, ["gate", "run", "qwen3-dflash", "--device", "cpu", "-n", "4",
                                 "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 2, r.output
    assert "BLOOMERY_PDL" in r.output and not (tmp_path / "r.json").exists()


def test_off_outside_a_graph_capture_and_on_cpu(monkeypatch):
    monkeypatch.setenv("BLOOMERY_PDL", "on,early,l2=4")
    assert not graphs.graphing()
    assert p.mode(torch.device("cpu")) == (p.OFF, None)
    graphs._GRAPHING[0] += 1                           # as inside GraphSet.capture
    try:
        assert graphs.graphing()
        assert p.mode(torch.device("cpu")) == (p.OFF, None)       # CPU never takes it
    finally:
        graphs._GRAPHING[0] -= 1


def test_row_bytes():
    assert p.row_bytes(None, 4096, 8192) == 0                     # no prefetch
    assert p.row_bytes(0, 4096, 8192) == 8192                     # the whole row
    assert p.row_bytes(4 << 20, 4096, 8192) == 1024               # 4 MiB over 4096 rows
    assert p.row_bytes(4 << 20, 8192, 12288) == 512               # down_proj at two splits
    assert p.row_bytes(1 << 30, 4096, 8192) == 8192               # never past the row
    assert p.row_bytes(1000, 4096, 8192) == 0                     # under one line a row: none


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GraphSet captures on CUDA only: run on the device")
def test_graphing_during_a_capture_only():
    seen = []
    gs = graphs.GraphSet(lambda k: seen.append(graphs.graphing()), torch.device("cuda"), warmup=2)
    gs.run(1)
    gs.run(1)                                          # a replay: fn is not called again
    assert seen == [True, True, True] and not graphs.graphing()


def test_a_record_names_the_engine_setting_it_ran_under(monkeypatch):
    """A record made under BLOOMERY_PDL (or the projection's settings) says so, and its table rows stand apart."""
    from bloomery_cli.results.records import conditions
    from bloomery_cli.results.schema import check_record
    from bloomery_cli.results.side import device_label

    monkeypatch.delenv("BLOOMERY_PDL", raising=False)
    plain = conditions(torch.device("cpu"))
    assert "knobs" not in plain
    monkeypatch.setenv("BLOOMERY_PDL", "on,early,l2=4")
    c = conditions(torch.device("cpu"))
    assert c["knobs"] == {"BLOOMERY_PDL": "on,early,l2=4"}
    rec = {"gate": "g", "conditions": c}
    assert check_record("r.json", rec) is rec
    assert device_label(rec) == f"{c['device_name']} (BLOOMERY_PDL=on,early,l2=4)"
    assert device_label({"gate": "g", "conditions": plain}) == plain["device_name"]
    with pytest.raises(InputError, match="knobs"):
        check_record("r.json", {"gate": "g", "conditions": {**c, "knobs": {"BLOOMERY_PDL": 1}}})


def test_describe_names_what_a_record_ran_under(monkeypatch):
    monkeypatch.delenv("BLOOMERY_PDL", raising=False)
    assert p.describe(torch.device("cpu")) is None                # off CUDA: nothing to name
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        dev = torch.device("cuda")
        assert p.describe(dev) == "on,early,l2=4"
        monkeypatch.setenv("BLOOMERY_PDL", "off")
        assert p.describe(dev) == "off"
        monkeypatch.setenv("BLOOMERY_PDL", "on,l2")
        assert p.describe(dev) == "on,l2"


def test_in_effect_is_on_and_a_capable_cuda_device(monkeypatch):
    """``in_effect``: the setting on and the device CUDA of compute capability 9+ (the capability stubbed: the rule
    is under test, not the card)."""
    monkeypatch.setenv("BLOOMERY_PDL", "on,early,l2=4")
    assert not p.in_effect(torch.device("cpu"))
    monkeypatch.setattr(p, "hopper", lambda dev: True)
    assert p.in_effect(torch.device("cuda"))
    monkeypatch.setattr(p, "hopper", lambda dev: False)
    assert not p.in_effect(torch.device("cuda"))
    monkeypatch.setattr(p, "hopper", lambda dev: True)
    monkeypatch.setenv("BLOOMERY_PDL", "off")
    assert not p.in_effect(torch.device("cuda"))
