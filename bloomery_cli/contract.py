"""The printed gate contract (CONTRACT.md): the single owner of every line's spelling.

Each check line ends in PASS or FAIL; the run's verdict is its exit code (0 all passed, 1 any
failed). ``ids identical N`` and ``accept_mean=`` start at column 0 with exactly that spelling.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .metrics import Tally, macro_accept_mean

PASS, FAIL = "PASS", "FAIL"
PASSED_HEAD, FAILED_LINE = "PASSED:", "FAILED: one or more checks above did not pass"
MARGINAL = 0.8      # a banded line whose statistic uses more than this share of its band is listed as marginal


def verdict(ok: bool) -> str:
    return PASS if ok else FAIL


def share(stat: float, band: float) -> float:
    """stat / band: how much of its band a statistic uses (0 for a zero statistic, inf past a zero band or a NaN)."""
    if stat != stat:
        return float("inf")
    if stat == 0:
        return 0.0
    return stat / band if band > 0 else float("inf")


def fmt_list(xs: list[float] | list[int]) -> str:
    return "[" + ",".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in xs) + "]"


def kv(**items: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in items.items())


@dataclass
class Report:
    """Collects the gate's lines and facts; prints each line as it is made."""

    name: str
    emit: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    failed: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def line(self, text: str) -> None:
        self.lines.append(text)
        self.emit(text)

    def check(self, text: str, ok: bool, margin: float | None = None) -> bool:
        """One check line; ``margin`` (a banded line's statistic / band, the larger of its two) goes to the record."""
        self.line(f"{text} {verdict(ok)}")
        self.failed += 0 if ok else 1
        entry: dict[str, Any] = {"line": text, "ok": ok}
        if margin is not None:
            entry["margin"] = round(margin, 4) if margin != float("inf") else "inf"
        self.facts.setdefault("checks", []).append(entry)
        return ok

    def marginal(self, above: float = MARGINAL) -> list[tuple[str, float]]:
        """The banded check lines that passed with more than ``above`` of their band used: (line, margin)."""
        return [(c["line"], float(c["margin"])) for c in self.facts.get("checks", [])
                if c["ok"] and "margin" in c and float(c["margin"]) > above]

    def worst_margin(self) -> float | None:
        """The largest statistic / band over the banded lines (None when the run printed none)."""
        got = [float(c["margin"]) for c in self.facts.get("checks", []) if "margin" in c]
        return max(got) if got else None

    # --- the contract's lines, in order ---
    def header(self, target: str, draft: str, device: str, dtype: str, n: int, prompts: int) -> None:
        head = {"target": target, "draft": draft, "device": device, "dtype": dtype, "n": n, "prompts": prompts}
        self.facts.update(gate=self.name, **head)
        self.line(f"gate {self.name} " + kv(**head))

    def load(self, kind: str, **sizes: Any) -> None:
        self.facts["load"] = {"draft": kind, **sizes}
        self.line("load " + kv(draft=kind, **sizes))

    def load_off(self, reason: str, **sizes: Any) -> None:
        """The draft turned off: ``load draft=off (<reason with the numbers>)`` then the target's sizes."""
        self.facts["load"] = {"draft": "off", "reason": reason, **sizes}
        self.line(f"load draft=off ({reason})" + (" " + kv(**sizes) if sizes else ""))

    def reference(self, what: str, checked: int, worst: float, band: float, tag: str = "(r)",
                  ref: str = "host f64", rms: float | None = None, rms_band: float | None = None) -> bool:
        """Tier 2 ((r), against our f64 reference) or tier 3 ((o), against an external oracle).

        With ``rms`` and ``rms_band`` the line also carries the relative RMS error and its band; both
        statistics must sit inside their bands."""
        text = f"{tag} {what} vs {ref}: {checked} checked, worst rel {worst:.3e} (band {band:.3e})"
        ok = worst <= band
        use = [share(worst, band)]
        if rms is not None and rms_band is not None:
            text += f", rms rel {rms:.3e} (band {rms_band:.3e})"
            ok = ok and rms <= rms_band
            use.append(share(rms, rms_band))
        return self.check(text, ok, margin=max(use))

    def integer_match(self, what: str, checked: int, differ: int, excused: int, tag: str = "(r)",
                      ref: str = "host f64") -> bool:
        """Greedy ids / integer outputs: equal, a flip excused only inside the reference's top-2 margin band."""
        note = f", {excused} inside the top-2 margin band" if excused else ""
        return self.check(f"{tag} {what} vs {ref}: {checked} checked, {differ} differ{note}", differ == excused)

    def reference_compare(self, device: str, tensors: int, values: int, worst: float, bound: float,
                          int_differ: int, emulated: int, worst_at: str) -> bool:
        """(r) the reference on a device against the same reference on the host (``--reference-compare``): every
        array the exact runs returned, worst rel over them within ``bound``, integer outputs equal."""
        at = f" at {worst_at}" if worst_at else ""
        return self.check(f"(r) reference on {device} vs host f64: {tensors} tensors, {values} checked, worst rel "
                          f"{worst:.3e} (bound {bound:.0e}){at}, {int_differ} integers differ, {emulated} emulated "
                          "runs not compared", tensors > 0 and worst <= bound and int_differ == 0)

    def state(self, windows: int, what: str, shape: tuple[int, ...], checked: int, worst: float, band: float,
              rms: float | None = None, rms_band: float | None = None) -> bool:
        """(r) one piece of the engine's state after a drafted run of ``windows`` windows, against the f64
        reference's fresh run of the emitted sequence."""
        dims = "x".join(str(d) for d in shape)
        return self.reference(f"state after {windows} windows: {what} [{dims}]", checked, worst, band,
                              rms=rms, rms_band=rms_band)

    def state_match(self, windows: int, what: str, checked: int, differ: int, excused: int) -> bool:
        """(r) an integer outcome of the state after ``windows`` windows (a cut length, ids) against the reference's."""
        return self.integer_match(f"state after {windows} windows: {what}", checked, differ, excused)

    def state_broken(self, windows: int | None, what: str, why: str) -> bool:
        """(r) a state item that could not be compared at all (a shape that differs, a run that broke): FAIL."""
        after = f"state after {windows} windows" if windows is not None else "state after the loop"
        return self.check(f"(r) {after}: {what}: {why}", False)

    def ids(self, prompt: int, plain: list[int], drafted: list[int], margin: float | None = None) -> bool:
        if plain == drafted:
            return self.check(f"(w) prompt {prompt}: ids identical {len(plain)}", True)
        pairs = enumerate(zip(plain, drafted, strict=False))
        k = next((i for i, (a, b) in pairs if a != b), min(len(plain), len(drafted)))
        a = plain[k] if k < len(plain) else None
        b = drafted[k] if k < len(drafted) else None
        m = f" (margin {margin:.3e})" if margin is not None else ""
        return self.check(f"(w) prompt {prompt}: ids differ at {k} of {len(plain)}: plain {a} drafted {b}{m}", False)

    def branches(self, tally: Tally) -> bool:
        a, p = tally.accepts, tally.proposals
        return self.check(f"(b) accepts {a} of {p} proposals: both branches ran", 0 < a < p)

    def identical(self, n: int) -> None:
        self.line(f"ids identical {n}")

    def acceptance(self, pooled: Tally, per_prompt: list[Tally], verify_rows: int) -> None:
        facts = {
            "accept_mean": round(pooled.accept_mean, 6), "accept_mean_macro": round(macro_accept_mean(per_prompt), 6),
            "windows": pooled.windows, "kept": pooled.histogram(),
            "pos_accept": [round(x, 4) for x in pooled.pos_accept()],
            "pos_accept_cond": [round(x, 4) for x in pooled.pos_accept_cond()],
            "draft_share": round(pooled.draft_share, 4), "verify_rows": verify_rows,
        }
        self.facts["acceptance"] = facts
        self.line(f"accept_mean={pooled.accept_mean:.3f} windows={pooled.windows} kept={fmt_list(facts['kept'])} "
                  f"pos_accept={fmt_list(pooled.pos_accept())} pos_accept_cond={fmt_list(pooled.pos_accept_cond())} "
                  f"draft_share={pooled.draft_share:.3f} verify_rows={verify_rows}")

    def acceptance_rederived(self, runs: int, windows: int, ids: int, differ: list[str]) -> bool:
        """(a) accept_mean, the kept histogram and both per-position rates re-derived from the runs' emitted ids and
        window boundaries (``acceptance_check``), equal to the printed figures; no drafted window is a FAIL."""
        what = "accept_mean kept pos_accept pos_accept_cond equal" if not differ else \
            f"{len(differ)} differ: " + "; ".join(differ[:3])
        self.facts.setdefault("acceptance_rederived", []).append(
            {"runs": runs, "windows": windows, "ids": ids, "differ": differ[:20]})
        return self.check(f"(a) acceptance re-derived from the emitted ids: {runs} runs, {windows} windows, "
                          f"{ids} ids: {what}", not differ)

    def sampling_replay(self, res: Any) -> bool:
        """(s) the kernel's sampled runs replayed by the host rule on the same uniforms (``sampling_replay``): ids
        and kept equal window by window; a differing draw within 1e-12 of a cell boundary is excused."""
        near = f", {res.excused} at a draw within 1e-12 of a boundary" if res.excused else ""
        where = f": {res.first[0]}" if res.first else ""
        self.facts["sampling_replay"] = {"runs": res.runs, "windows": res.windows, "ids": res.ids,
                                         "differ": res.differ, "excused": res.excused, "first": res.first}
        return self.check(f"(s) sampling replay vs host rule, common random numbers: {res.runs} runs, "
                          f"{res.windows} windows, {res.ids} ids, {res.differ} runs differ{near}{where}",
                          res.runs > 0 and res.windows > 0 and res.differ == res.excused)

    def cut_windows(self, t: float, probe: bool, windows: int, cut: int, differ: int, excused: int,
                    where: str = "") -> bool:
        """(r) DSpark's confidence cut on every window of a drafted run: the kernel's kept drafts against the host
        rule on its confidence logits (tier 1); ``probe``: the gate has no threshold and the check runs at t."""
        how = "probe t" if probe else "t"
        note = f", {excused} within 1e-6 of t" if excused else ""
        at = f": {where}" if where else ""
        self.facts.setdefault("confidence_cut_windows", []).append(
            {"t": t, "probe": probe, "windows": windows, "cut": cut, "differ": differ, "excused": excused})
        return self.check(f"(r) dspark confidence cut {how}={t:g} vs host rule: {windows} windows ({cut} cut), "
                          f"{differ} differ{note}{at}", windows > 0 and differ == excused)

    def ties(self, what: str, cases: int, differ: int, where: str = "") -> bool:
        """(r) a planted tie case (values made equal on purpose): the kernel's integer outputs against the host rule's
        (tier 1, exact: the tied values are small integers, exact in every run dtype)."""
        at = f": {where}" if where else ""
        return self.check(f"(r) ties: {what} vs host rule: {cases} planted cases, {differ} differ{at}",
                          cases > 0 and differ == 0)

    def crossing(self, pooled: Tally, prompt: Any) -> None:
        """A draft on its own device: what crossed per window and its time, apart from the draft share (a note)."""
        w = pooled.transfer_windows
        per = round(pooled.transfer_bytes / w) if w else 0
        facts = {"windows": w, "bytes": pooled.transfer_bytes, "bytes_per_window": per,
                 "transfer_s": round(pooled.transfer_s, 6), "transfer_share": round(pooled.transfer_share, 4),
                 "prompt_bytes": prompt.bytes, "prompt_transfer_s": round(prompt.seconds, 6)}
        self.facts["crossing"] = facts
        self.line("crossing " + kv(**facts))

    def cost(self, phases: dict[str, float], host_rss: int, device_peak: int | None,
             reference: tuple[str, float, int | None] | None = None) -> None:
        """What the run cost: wall seconds per phase, peak host RSS and peak device memory (never a check);
        ``reference`` = (where it ran, its wall seconds over every call, its device's peak bytes or None)."""
        self.facts.update(phases_s=phases, peak_host_rss_bytes=host_rss, peak_device_bytes=device_peak)
        dev = "n/a" if device_peak is None else f"{device_peak / 1e9:.2f}GB"
        extra = {}
        if reference is not None:
            where, seconds, peak = reference
            extra = {"reference": where, "reference_s": f"{seconds:.1f}"}
            if peak is not None:
                extra["peak_reference_device"] = f"{peak / 1e9:.2f}GB"
        self.line("cost " + kv(phases_s=",".join(f"{k}:{v:.1f}" for k, v in phases.items()),
                               peak_host_rss=f"{host_rss / 1e9:.2f}GB", peak_device=dev, **extra))
    def greedy_acceptance(self, pooled: Tally) -> None:
        """At T > 0 the greedy runs' acceptance (of the (w) check) is a note; accept_mean= is the one at T."""
        self.facts["acceptance_greedy"] = {"accept_mean": round(pooled.accept_mean, 6), "windows": pooled.windows,
                                           "kept": pooled.histogram()}
        self.line(f"greedy (the (w) runs): accept_mean {pooled.accept_mean:.3f} windows={pooled.windows}")

    def sampling(self, res) -> bool:
        """(s) the lossless claim at T > 0, about distributions (a ``sampling_stats.GofResult``)."""
        return self.check(f"(s) sampling: {res.test} over {res.runs}+{res.runs} runs, {res.positions} positions, "
                          f"{res.pit_samples} PITs, alpha={res.alpha:g}, power {res.power:g} at "
                          f"w>={res.detectable_w:.3f} / shift>={res.detectable_shift:.4f}: "
                          f"p_marginal={res.p_marginal:.3g} (worst position {res.worst_position + 1}) "
                          f"p_pit_hist={res.p_pit_hist:.3g} p_pit_mean={res.p_pit_mean:.3g}, "
                          f"p={res.p:.3g}", res.ok)

    def sampling_conditions(self, facts: dict[str, Any]) -> None:
        """The run's sampling conditions: the line before the sampled accept_mean."""
        self.facts["sampling"] = facts
        shown = {**facts, "q": facts["q"].replace(" ", "-")}
        self.line("sampling " + kv(**shown))

    def note(self, text: str) -> None:
        """Informational lines (external anchors, oracle details); never a check."""
        self.line(text)

    def finish(self) -> int:
        ok = self.failed == 0
        self.facts["passed"] = ok
        self.line(f"{PASSED_HEAD} {self.name}" if ok else FAILED_LINE)
        return 0 if ok else 1


def stdout_emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
