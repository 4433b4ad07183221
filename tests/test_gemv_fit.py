"""``bloomery_cli.bench.gemv``'s fixed-cost fit (t = bytes / rate + c over the narrow weights of a record): it
recovers a known line, leaves the wide weights (cuBLAS's, other tiles) out, refuses what it cannot fit, and
reproduces the figures docs/SPEED.md quotes from a committed record. No CUDA needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bloomery_cli.bench import gemv

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "results/h200/speed/cef8619-tma/gemv-cuda-bf16.json"
COPY = 4000.0                                        # GB/s


def _row(n: int, k: int, us: float, rows: int = 1) -> dict:
    return {"weight": f"{n}x{k}", "rows": rows, "best": {"us": us}}


def _line(n: int, k: int, frac: float, fixed: float) -> float:
    return n * k * 2 / (frac * COPY * 1e3) + fixed   # bytes / (bytes per us) + us


NARROW = [(6144, 4096), (4096, 4096), (4096, 12288), (5120, 6144), (5120, 17408)]


def test_fit_recovers_a_known_line_and_leaves_the_wide_weights_out():
    rows = [_row(n, k, _line(n, k, 0.9, 4.0)) for n, k in NARROW]
    rows.append(_row(24576, 4096, 1000.0))           # a wide weight far off the line: not the kernel's to fit
    rows.append(_row(4096, 4096, 1.0, rows=16))      # another width: its own fit
    f = gemv.fit_fixed_cost(rows, COPY, 1)
    assert f.weights == 5
    assert f.rate_frac_copy == pytest.approx(0.9, rel=1e-9)
    assert f.fixed_us == pytest.approx(4.0, abs=1e-9)
    assert f.max_residual_us < 1e-9


def test_fit_needs_two_weight_sizes():
    assert gemv.fit_fixed_cost([_row(4096, 4096, 11.0)], COPY, 1) is None
    assert gemv.fit_fixed_cost([_row(4096, 4096, 11.0), _row(4096, 4096, 12.0)], COPY, 1) is None
    assert gemv.fit_fixed_cost([_row(4096, 4096, 11.0, rows=16), _row(6144, 4096, 15.0)], COPY, 1) is None


def test_fit_of_the_committed_record_is_what_speed_md_quotes(capsys):
    gemv.main(["--fit", str(RECORD)])
    out = capsys.readouterr().out
    assert "fit rows=1 weights=5 rate=1.038 of copy fixed_us=4.08 max_residual_us=0.64" in out
    assert "fit rows=16 weights=5 rate=1.022 of copy fixed_us=4.33 max_residual_us=0.85" in out
    assert "| cef8619-tma (TMA; 16 rows: 1.022, 4.33, 0.85) | 1.038 | 4.08 | 0.64 |" in \
        (ROOT / "docs/SPEED.md").read_text()


@pytest.mark.parametrize("content", [None, "{", '{"copy_GBps": 4000}', '{"copy_GBps": 4000, "rows": []}'])
def test_fit_of_a_bad_record_exits_2_with_its_name(tmp_path, capsys, content):
    path = tmp_path / "rec.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        gemv.main(["--fit", str(RECORD), str(path)])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert f"--fit {path}" in err
    assert out == ""                                 # nothing printed before the bad record was found
