"""``bloomery bench moe --drafts mtp,dflash``: drafted tok/s at the MoE shapes with their real drafts, and the cost
width policy with the draft's measured cost.

The drafts (``moe_draft_shapes``: random weights of the real draft shapes, made on the device, the gates' engines)
run in the drafted loop (``speculative.generate`` via ``common.timed_generate``) inside ``common.ReplayDraft``: the
real draft runs every window (its cost is real) and its proposals are replaced by the plain run's own continuation
ref (the prefill's argmax, then the plain run's ids), each proposal kept with probability a (else ref + 1), so a
window at verify width k keeps 1 + j rows with j ~ chained Bernoulli(a), capped at k-1:

    tau(k, a) = E(kept) = sum_{j<k} a^j          accept_mean: the measured mean kept per drafted window

Per draft, n ids a run (``--drafted-n``; the prefill and the draft's prompt excluded, ``timed_generate``):
- one warm-up run (min(n, 8) ids, not recorded: the eager engines' first calls), then
- the sweep: a in ACCEPTS at the draft's natural width (MTP: 3 drafts, verify 4; DFlash: its block, all B-1
  drafts): drafted tok/s, accept_mean, ratio to the plain tok/s (the bench's plain loop of ``-n`` one-row passes),
  draft_share = device time in the draft / (draft + verify + commit) (``Tally.draft_share``, CUDA events on a GPU),
  draft_ms = that draft time per drafted window;
- the grid: the drafted loop at every verify width k of the draft's ``grid`` (k = 1: one plain run with the draft's
  context following, shared by every a), per a (the sweep's run reused at the natural width);
- the policy, per a: ``moe_policy.policy_vs_best`` (CostWidth over widths 1..max(grid) fed walls drawn from the verify
  table's measured walls of k rows plus draft_ms(k), the draft time per window measured in the grid at this a,
  linear between grid widths, 0 at k = 1) -> policy_width and the model's best width; against best_width, the width
  of the fastest measured run of the grid (a policy width outside the grid is run too and joins the comparison):
  policy_over_best = measured tok/s at policy_width / at best_width. The grid is small (a few widths, n ids each):
  best_width is what those runs measured, host noise included (the eager engines are host-bound).

Cost (H200, from results/h200/speed/i27-moe: eager windows ~85 ms qwen35moe, ~20 ms mimo2 at 8 layers, plus a
~0.3-0.5 s prefill a run): with n = 32 about 60-90 s for qwen35moe's two drafts (~60 runs
in all: ~11 (MTP) and ~9 (DFlash) x (n-1) windows), 15-25 s for mimo2's MTP.

Checks (any failing exits 1): ``drafted_ids_identical``: every drafted run's ids equal the plain run's first n
(greedy, the target's argmax either way); ``drafted_ran``: every requested draft finished its sweep and every sweep
run drafted (windows with proposals). No draft run never prints ok: both are False when nothing ran. What the ids
check sees: the emitted sequence (an id dropped, repeated or changed). At these random weights greedy decoding is a
walk of the current token (``moe_shapes``), so a wrong cache or draft context does not show in the ids; the gates
(qwen35moe-mtp, qwen35moe-dflash, mimo2-mtp) are what prove those.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from .common import ReplayDraft, sync, timed_generate
from .moe_draft_shapes import DraftShape, build_draft, set_width
from .moe_policy import ACCEPTS, expected_ids, policy_vs_best


@dataclass
class DraftedRun:
    draft: str
    a: float
    width: int                 # verify width k (anchor + k-1 proposals); 1: plain, the draft's context following
    n: int
    tok_s: float
    accept_mean: float
    tau: float                 # sum_{j<k} a^j
    ratio_plain: float
    draft_share: float
    draft_ms: float            # draft time per drafted window (ms)
    windows: int               # drafted windows
    proposals: int
    ids_identical: bool
    off_track: int


def drafted_run(engine, draft, ds: DraftShape, kind: str, prompt: list[int], ref: list[int], n: int, a: float,
                k: int, plain_tok_s: float, seed: int) -> DraftedRun:
    """One drafted run of n ids at verify width k (fixed) with proposals right with probability a."""
    set_width(draft, ds, k)
    rd = ReplayDraft(draft, ref, a, engine.spec.vocab_size, seed=seed)
    run, tok_s = timed_generate(engine, rd, prompt, n, k)
    t = run.tally
    return DraftedRun(kind, a, k, n, tok_s, t.accept_mean, expected_ids(a, k), tok_s / plain_tok_s, t.draft_share,
                      t.draft_s / t.windows * 1e3 if t.windows else 0.0, t.windows, t.proposals,
                      run.ids == ref[:n], rd.off_track)


def draft_cost(runs: list[DraftedRun], width: int) -> dict[int, float]:
    """Width k in 1..width -> draft ms per window: measured at the grid's drafted widths, linear between them,
    the nearest measured beyond; 0 at k = 1 (no draft runs)."""
    got = {r.width: r.draft_ms for r in runs if r.width > 1 and r.windows}
    out = {1: 0.0}
    ks = sorted(got)
    for k in range(2, width + 1):
        if not ks:
            out[k] = 0.0
        elif k in got:
            out[k] = got[k]
        elif k < ks[0] or k > ks[-1]:
            out[k] = got[ks[0] if k < ks[0] else ks[-1]]
        else:
            lo = max(j for j in ks if j < k)
            hi = min(j for j in ks if j > k)
            out[k] = got[lo] + (got[hi] - got[lo]) * (k - lo) / (hi - lo)
    return out


def _line(r: DraftedRun) -> str:
    return (f"drafted draft={r.draft} width={r.width} a={r.a} tok_s={r.tok_s:.2f} accept_mean={r.accept_mean:.3f} "
            f"tau={r.tau:.2f} ratio_plain={r.ratio_plain:.3f} draft_share={r.draft_share:.3f} "
            f"draft_ms={r.draft_ms:.3f} windows={r.windows} ids_identical={r.ids_identical}")


def one_draft(engine, kind: str, s, depth: int, max_len: int, prompt: list[int], ref: list[int], n: int,
              plain_tok_s: float, verify: list[dict[str, Any]], log, accepts=ACCEPTS
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The sweep, the grid and the policy of one draft kind -> (rec["drafted"][kind], its policy rows)."""
    t0 = time.perf_counter()
    draft, nbytes, ds = build_draft(kind, s, engine, depth, max_len)
    sync(engine.device)
    out: dict[str, Any] = {"shape": ds.facts(), "bytes": nbytes, "made_s": time.perf_counter() - t0,
                           "width": ds.width, "n": n, "sweep": [], "grid": []}
    log(f"draft {kind} width={ds.width} grid={','.join(map(str, ds.grid))} bytes={nbytes} "
        f"made_s={out['made_s']:.1f} ({ds.about})")
    drafted_run(engine, draft, ds, kind, prompt, ref, min(n, 8), 0.5, ds.width, plain_tok_s, 0)   # warm-up, unrecorded
    seed = 0
    for a in accepts:
        seed += 1
        r = drafted_run(engine, draft, ds, kind, prompt, ref, n, a, ds.width, plain_tok_s, seed)
        out["sweep"].append(asdict(r))
        log(_line(r))
    grid = {1: drafted_run(engine, draft, ds, kind, prompt, ref, n, 0.0, 1, plain_tok_s, 0)}
    out["grid"].append(asdict(grid[1]))
    log(_line(grid[1]) + " (plain, the draft's context following)")
    policy = []
    top = max(ds.grid)
    for i, a in enumerate(accepts):
        runs = {1: grid[1]}
        for k in ds.grid[1:]:
            if k == ds.width:
                runs[k] = DraftedRun(**out["sweep"][i])
                continue
            seed += 1
            runs[k] = drafted_run(engine, draft, ds, kind, prompt, ref, n, a, k, plain_tok_s, seed)
            out["grid"].append(asdict(runs[k]))
            log(_line(runs[k]))
        cost = draft_cost(list(runs.values()), top)
        p = policy_vs_best(verify, accepts=(a,), draft_ms=cost, max_width=top)[0]
        pw = p["policy_width"]
        if pw not in runs:
            seed += 1
            runs[pw] = drafted_run(engine, draft, ds, kind, prompt, ref, n, a, pw, plain_tok_s, seed)
            out["grid"].append(asdict(runs[pw]))
            log(_line(runs[pw]) + " (the policy's width, outside the grid)")
        best = max(runs, key=lambda k: (runs[k].tok_s, -k))
        row = {"draft": kind, "accept": a, "policy_width": pw, "best_width": best, "model_best_width": p["best_width"],
               "policy_over_best": runs[pw].tok_s / runs[best].tok_s, "tok_s_policy": runs[pw].tok_s,
               "tok_s_best": runs[best].tok_s, "widths_run": sorted(runs), "draft_ms": cost,
               "model_policy_over_best": p["policy_over_best"]}
        policy.append(row)
        log(f"cost_policy_drafted draft={kind} a={a} policy_width={pw} best_width={best} "
            f"policy_over_best={row['policy_over_best']:.3f} model_best_width={p['best_width']} "
            f"tok_s_policy={runs[pw].tok_s:.2f} tok_s_best={runs[best].tok_s:.2f} "
            f"(best of measured runs at widths {','.join(map(str, sorted(runs)))}; the policy fed the verify walls "
            f"+ the draft's measured ms)")
    del draft
    return out, policy


def bench_drafted(engine, s, kinds: tuple[str, ...], depth: int, max_len: int, prompt: list[int], ref: list[int],
                  n: int, plain_tok_s: float, verify: list[dict[str, Any]], log, accepts=ACCEPTS
                  ) -> dict[str, Any]:
    """Every draft of ``kinds``: {"drafted": {kind: ...}, "policy_drafted": [...], "checks": {...}}. ``ref``: the
    plain run's ids from the prefill's argmax on (at least n). A draft that raises is logged and recorded (its
    check then fails)."""
    drafted: dict[str, Any] = {}
    policy: list[dict[str, Any]] = []
    for kind in kinds:
        try:
            drafted[kind], rows = one_draft(engine, kind, s, depth, max_len, prompt, ref, n, plain_tok_s, verify,
                                            log, accepts)
            policy += rows
        except Exception as e:  # noqa: BLE001  (recorded; the drafted_ran check fails, exit 1)
            log(f"drafted {kind} failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            drafted[kind] = {"error": f"{type(e).__name__}: {e}"}
    runs = [r for d in drafted.values() for r in d.get("sweep", []) + d.get("grid", [])]
    same = bool(runs) and all(r["ids_identical"] for r in runs)
    ran = bool(kinds) and all(len(drafted[k].get("sweep", [])) == len(accepts) and
                              all(r["windows"] > 0 and r["proposals"] > 0 for r in drafted[k]["sweep"])
                              for k in kinds)
    log(f"drafted ids identical {n} in every drafted run: {same} ({len(runs)} runs)")
    return {"drafted": drafted, "policy_drafted": policy,
            "checks": {"drafted_ids_identical": same, "drafted_ran": ran}}
