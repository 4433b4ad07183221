"""Issue 27 diagnostic (device only, never CI): tests/test_accept.py's
``test_commit_dev_restores_the_state_after_row_kept_minus_1[triton]`` repeated in one process, with LOAD busy host
processes beside it (it failed once on CUDA while a llama.cpp build took 14 of the host's cores; not since).
Prints each repetition's kept values whose state or conv tail differ ([] when none) and the count of failures.
--plant: GraphSet.capture's collector guard planted away, and each engine made to refer to itself (engines are not
reference cycles since 8417479; the failure needs a dead cycle collected mid-capture: results/h200/restore-gc).

python3 -P .ci/diag_restore.py [--reps 30] [--load 14] [--seconds 150] [--plant]
"""
import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_accept as ta  # noqa: E402


def _busy() -> None:
    while True:
        pass


def engine(make, cycle: bool):
    """The test's engine on the Triton recurrence; with ``cycle``, holding itself (a dead cycle once dropped)."""
    e = ta._with_impl(make, "triton")
    if cycle:
        e.cycle = e
    return e


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--load", type=int, default=14)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--plant", action="store_true", help="GraphSet.capture's collector guard planted away")
    a = ap.parse_args()
    if a.plant:
        from bloomery_gates.kernels import graphs
        graphs.gc.disable = lambda: None
    busy = [mp.Process(target=_busy, daemon=True) for _ in range(a.load)]
    for p in busy:
        p.start()
    make, spec, _ = ta._qwen38(torch.device("cuda"), torch.float32)
    t0, fails, done = time.time(), 0, 0
    try:
        for i in range(a.reps):
            if time.time() - t0 > a.seconds:
                break
            bad = ta._commit_every_kept(lambda: engine(make, a.plant), spec)
            done += 1
            fails += bool(bad)
            print(f"rep {i} bad={bad} t={time.time() - t0:.1f}s", flush=True)
    finally:
        for p in busy:
            p.terminate()
    print(f"restore reps={done} failed={fails} load={a.load} plant={a.plant}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
