"""``bench --profile`` (bloomery_cli.bench.profile), the drafted criterion's bound (``bench.criterion_bound``) and the
thread rule with the engine on a card, on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from bloomery_cli.bench.common import CRITERION, criterion_bound
from bloomery_cli.bench.hybrid import bench_hybrid
from bloomery_cli.threads import apply_threads, thread_count


def test_profile_records_each_pass_and_its_ops():
    lines: list[str] = []
    rec = bench_hybrid("qwen38-dflash2", "qwen38-tiny", "cpu", "f32", prompt_len=16, n=8, block=4, iters=1,
                       emit=lines.append, quiet=True, profile=True)
    prof = rec["profile"]
    assert set(prof) == {"plain", "verify16", "draft", "window"}        # window: the device loop's, after the sweep
    assert prof["window"]["kernels"]["kernels"] > 10 and prof["window"]["kernels"]["top"]
    assert any(line.startswith("profile window4 wall_ms=") for line in lines)
    for label in ("plain", "verify16"):
        k = prof[label]["kernels"]
        assert k["kernels"] > 10 and k["kernel_ms"] > 0 and k["top"] and prof[label]["gemm"]
        assert all(g["weight"].count("x") == 1 and g["us"] > 0 for g in prof[label]["gemm"])
    assert any(line.startswith("profile plain wall_ms=") for line in lines)
    assert any(line.startswith("profile gemm weight=") for line in lines)
    # the bound is the record's own arithmetic (plain / (verify R4 + the draft's read)), not a timing relation: on a
    # busy 2-core box a verify of 4 rows can time below a plain step, so frac_max > 1 is a measurement, not a defect
    bound = rec["bound"]
    assert bound["rows"] == 4 and bound["frac_max"] > 0
    assert bound["frac_max"] == pytest.approx(1 / (bound["verify_rel"] + bound["draft_read_rel"]))


def test_profile_says_when_pdl_overlaps_the_kernel_times(monkeypatch):
    """Under PDL (stubbed: the CPU never takes it) the profile names the setting and says the kernel times overlap;
    without it, nothing is said (the test above)."""
    from bloomery_gates.kernels.triton import pdl_policy

    monkeypatch.setattr(pdl_policy, "in_effect", lambda dev: True)
    monkeypatch.setattr(pdl_policy, "describe", lambda dev: "on,early,l2=4")
    lines: list[str] = []
    rec = bench_hybrid("qwen38-dflash2", "qwen38-tiny", "cpu", "f32", prompt_len=16, n=8, block=4, iters=1,
                       emit=lines.append, quiet=True, profile=True)
    assert rec["profile"]["pdl"] == "on,early,l2=4"
    assert any(line.startswith("profile note pdl=on,early,l2=4:") and "overlap" in line for line in lines)


def test_criterion_bound_is_plain_over_verify_plus_the_drafts_read():
    verify = [{"rows": 1, "ms": 10.0, "rel_plain": 1.0}, {"rows": 8, "ms": 11.0, "rel_plain": 1.1}]
    b = criterion_bound(verify, 8, 4 * 10 ** 9, 4000.0)                # 4 GB at 4000 GB/s: 1 ms
    assert b["draft_read_ms"] == pytest.approx(1.0) and b["draft_read_rel"] == pytest.approx(0.1)
    assert b["frac_max"] == pytest.approx(10.0 / 12.0) and not b["attainable"]
    free = criterion_bound(verify, 8, 0, 4000.0)                        # a draft that reads nothing
    assert free["frac_max"] == pytest.approx(10.0 / 11.0) and free["frac_max"] >= CRITERION and free["attainable"]
    with pytest.raises(StopIteration):                                 # a width the bench did not measure
        criterion_bound(verify, 4, 0, 4000.0)


def test_thread_rule_keeps_torchs_default_with_the_engine_on_a_card():
    assert thread_count(None, {}, "cpu") == 1 and thread_count(None, {}) == 1
    assert thread_count(None, {}, "cuda") is None and thread_count(None, {}, "cuda:1") is None
    assert thread_count(None, {"OMP_NUM_THREADS": "3"}, "cuda") == 3 and thread_count(2, {}, "cuda") == 2
    assert thread_count(None, {}, "auto") == (None if torch.cuda.is_available() else 1)
    before = torch.get_num_threads()
    try:
        apply_threads(1, "cpu")
        assert torch.get_num_threads() == 1
        if "OMP_NUM_THREADS" not in os.environ:                       # the card's rule: torch's own count back
            assert apply_threads(None, "cuda") == torch.get_num_threads() >= 1
    finally:
        torch.set_num_threads(before)


def test_results_derive_the_bound_of_older_records_and_not_of_eager_engines():
    from bloomery_cli.results.table import bound_of

    verify = [{"rows": 1, "ms": 10.0, "rel_plain": 1.0}, {"rows": 8, "ms": 11.0, "rel_plain": 1.1}]
    rec = {"bench": "qwen38-dflash2", "shape": "qwen38-27b", "verify": verify, "bandwidth": {"copy_GBps": 4000.0},
           "shape_facts": {"vocab": 1000, "hidden": 500}, "lines": ["weights bytes=1 draft_bytes=3999000000"],
           "conditions": {"verify_rows": 8, "dtype": "bf16", "engine": "qwen38 fast ops=triton graphs=on"}}
    b = bound_of(rec)                               # 3.999 GB + a 1000 x 500 bf16 head = 4 GB: 1 ms at 4000 GB/s
    assert b["frac_max"] == pytest.approx(10.0 / 12.0)
    mtp = rec | {"bench": "qwen38-mtp", "lines": ["weights draft_bytes=3999000000 mtp_width=3"]}
    assert bound_of(mtp)["draft_read_ms"] == pytest.approx(3.0)            # the layer and the head, per chained draft
    assert bound_of(rec | {"conditions": rec["conditions"] | {"engine": "qwen38 eager delta=triton"}}) is None
    assert bound_of(rec | {"bound": {"frac_max": 0.5}}) == {"frac_max": 0.5}
