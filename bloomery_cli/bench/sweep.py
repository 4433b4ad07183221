"""The synthetic-acceptance sweep of a drafted bench (the dense ``bench.command``, the hybrid ``bench.hybrid``).

Per point (an acceptance a; tau its nominal mean accepted length), the host loop runs the real draft for its cost
with its proposals replayed right with probability a (``ReplayDraft``), timed from the end of the prefill:

    row        accept_mean, tok_s, speedup over plain, draft_share, windows, ids against the padded reference,
               tok_s_windows (``window_tok_s``: the rate the windows emitted ids at) and
               tau_x_plain_frac = tok_s_windows / (accept_mean x plain)
    criterion  at the point that carries it (tau = 6 for a block draft, a = 0.8 for MTP): drafted >= CRITERION x
               accept_mean x plain (issue 11's criterion, kept beside the bound's)
    device     the device loop's row at the same a and seed beside it (``bench.accept.add_row``)

and with ``profile`` the device loop's window is profiled once after the sweep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..width import width_policy
from .accept import add_row, start_device
from .common import CRITERION, ReplayDraft, timed_generate, window_tok_s


@dataclass(frozen=True)
class Point:
    a: float                        # the probability a proposal is replayed right
    tau: float                      # the nominal mean accepted length at a
    seed: int                       # the replay's draws
    label: str                      # how the drafted line names the point
    criterion: str | None = None    # "tau=6" / "a=0.8": the criterion is judged on this point's row


def run_sweep(target, draft, ref, prompt: list[int], n: int, width: str, b: int, points: list[Point],
              plain_tok_s: float, rec: dict[str, Any], log, save, profile: bool = False) -> None:
    """``rec['sweep']`` (and ``rec['criterion']``, ``rec['device_accept']``) over ``points`` (module docstring);
    ``ref`` the padded reference run, ``b`` the draft's block (fixed width), ``save(rec)`` after each row."""
    dev = start_device(rec, target, draft, b, n, len(ref.ids), width, log)
    for p in points:
        rd = ReplayDraft(draft, ref.ids, p.a, target.spec.vocab_size, seed=p.seed)
        run, tok_s = timed_generate(target, rd, prompt, n, width_policy(width, b))
        am = run.tally.accept_mean
        row = {"a": p.a, "tau_nominal": p.tau, "accept_mean": am, "tok_s": tok_s, "speedup": tok_s / plain_tok_s,
               "draft_share": run.tally.draft_share, "windows": run.tally.windows,
               "ids_identical": run.ids == ref.ids[:n], "off_track": rd.off_track,
               "tok_s_windows": window_tok_s(tok_s, run)}
        row["tau_x_plain_frac"] = row["tok_s_windows"] / (am * plain_tok_s) if am else 0.0
        rec["sweep"].append(row)
        log(f"drafted {p.label} accept_mean={am:.3f} tok_s={tok_s:.2f} speedup={row['speedup']:.2f} "
            f"draft_share={row['draft_share']:.3f} frac_of_tau_x_plain={row['tau_x_plain_frac']:.3f} "
            f"ids_identical={row['ids_identical']}")
        if p.criterion:
            need = CRITERION * am * plain_tok_s
            met = row["tok_s_windows"] >= need
            rec["criterion"] = {"at": p.criterion, "tok_s": tok_s, "tok_s_windows": row["tok_s_windows"],
                                "needed": need, "met": met, "draft_share": row["draft_share"], "accept_mean": am}
            log(f"criterion {p.criterion} drafted_tok_s={tok_s:.2f} windows_tok_s={row['tok_s_windows']:.2f} "
                f"needed_{CRITERION}x_accept_mean_x_plain={need:.2f} met={met} draft_share={row['draft_share']:.3f}")
        add_row(dev, rec, log, prompt, ref.ids, n, p.a, p.seed, plain_tok_s, row, run.windows, rec.get("bound"))
        save(rec)
    if profile:                                     # the drafted window's kernels (--profile)
        from .profile import profile_window

        profile_window(dev, rec, log)
        save(rec)
