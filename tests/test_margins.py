"""Issue 30: every banded line's margin (statistic / band, the larger of worst and rms) goes to the record, and the
lines above contract.MARGINAL are listed, so an edge case is seen before it flips."""

from __future__ import annotations

import math

from bloomery_cli.contract import MARGINAL, Report, share


def quiet() -> Report:
    return Report("t", emit=lambda _: None)


def test_share():
    assert share(0.0, 0.0) == 0.0 and share(1.0, 2.0) == 0.5
    assert math.isinf(share(1.0, 0.0)) and math.isinf(share(float("nan"), 1.0))


def test_margin_is_the_larger_statistic_share_and_marginal_lists_only_passing_lines_above():
    r = quiet()
    r.reference("a", 10, 0.1, 1.0, rms=0.9, rms_band=1.0)            # rms uses 0.9 of its band: marginal
    r.reference("b", 10, 0.5, 1.0, rms=0.1, rms_band=1.0)            # 0.5: not marginal
    r.reference("c", 10, 2.0, 1.0)                                    # failed: not listed as marginal
    r.integer_match("ids", 3, 0, 0)                                   # no band, no margin
    margins = [c.get("margin") for c in r.facts["checks"]]
    assert margins == [0.9, 0.5, 2.0, None]
    assert [m for _, m in r.marginal()] == [0.9] and MARGINAL == 0.8
    assert r.worst_margin() == 2.0


def test_gates_summary_prints_the_marginal_lines(capsys):
    from bloomery_cli import cli

    cli.print_marginal([("g1", "(r) x [2x2] vs host f64: 4 checked, worst rel ...", 0.93)])
    cli.print_marginal([])
    text = capsys.readouterr().out
    assert "0.93 g1: (r) x [2x2]" in text and "no passing line uses more than 0.8" in text
