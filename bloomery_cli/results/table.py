"""``bloomery results``: regenerate the results READMEs from the committed JSON records: one README of tables per
device folder (results/cpu/README.md, results/h200/README.md: every folder of results/ with records) and a short
index, results/README.md, linking them.

Tables: acceptance per target x draft (one row per gate record: accept_mean pooled and macro, pos_accept,
draft_share, N, device, dtype, commit, date) with the published numbers of ANCHORS.md beside them, marked
external; the speed benches (``bloomery bench`` records) with their acceptance sweeps; the DFlash2 kernel
bench. PNG plots (``bloomery_cli.results.plots``) when matplotlib imports. The output depends only on the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bloomery_gates.dtypes import RUN

from .records import write_text_atomic
from .side import Record, sampling_label

# ANCHORS.md (shared design notes): published figures, quoted with their conditions; never ours.
ANCHORS: tuple[tuple[str, str, str], ...] = (
    ("dflash", "z-lab DFlash, Qwen3-8B, B=16, T=0, B200",
     "tau 6.55 GSM8K, 5.84 code avg, 3.71 chat avg; speedup 5.2x / 4.6x / 2.5x"),
    ("dflash", "EAGLE-3 on the same models (z-lab)", "tau 2.89 / 3.04 / 2.70"),
    ("dflash2", "DFlash2 blog (Inco AI / Z Lab), Qwen3.5-4B, thinking on, T=1, 5-benchmark mean",
     "tau 5.97 (DFlash 4.92, DSpark 5.49, MTP 4.54)"),
    ("dflash2", "DFlash2 blog, Qwen3.8-27B, B=8", "tau 4.80 (GSM8K 5.46, MT-Bench 4.10; MTP 4.28, DSpark 3.62)"),
    ("dflash2", "ExLlamaV3 on an RTX 3090, Qwen3.8-27B", "tau 5.47 vs MTP 4.10; 152 vs 114 vs 42 (plain) tok/s"),
    ("dspark", "DSpark paper, Qwen3-8B GSM8K, T=1, B=7", "tau 6.17 (DFlash 5.33, EAGLE-3 5.30)"),
    ("mtp", "DeepSeek-V3 MTP", "second-token acceptance 85-90%, 1.8x tokens/s"),
    ("mtp", "MiMo-7B MTP", "acceptance about 90%"),
)
# The published figures measured with sampling at T = 1 (ANCHORS.md), per drafter kind: beside our T = 1 acceptance.
SAMPLED_ANCHORS: dict[str, str] = {
    "dflash": "DFlash2 blog, Qwen3.5-4B: 4.92; DSpark paper, Qwen3-8B GSM8K B=7: 5.33",
    "dflash2": "DFlash2 blog, Qwen3.5-4B: 5.97; Qwen3.8-27B B=8: 4.80",
    "dspark": "DFlash2 blog, Qwen3.5-4B: 5.49; Qwen3.8-27B B=8: 3.62; DSpark paper, Qwen3-8B GSM8K B=7: 6.17",
    "mtp": "DFlash2 blog, Qwen3.5-4B: 4.54; Qwen3.8-27B: 4.28",
    "eagle3": "DSpark paper, Qwen3-8B GSM8K: 5.30",
}
BENCH_ANCHOR = ("peer (H200, 2026-11-29, random bf16 weights, batch 1, 512-token prompt): HF transformers 5.17 "
                "eager generate, Qwen3-8B shape: 12.3 tok/s (bound 259)")


def load_records(results_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every record under ``results_dir``, checked (``results_schema``): a bad one raises, naming it."""
    from .schema import load_checked

    return load_checked(results_dir)


def _f(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else ("-" if x is None else str(x))


def _row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows)]


def acceptance_rows(records) -> list[list[Any]]:
    from .side import device_label, quality_records

    rows = []
    for path, r in quality_records(records):
        acc = r.get("acceptance")
        c = r.get("conditions", {})
        target = Path(str(r.get("target", "?"))).name
        draft = f"{r.get('load', {}).get('draft', '?')} ({Path(str(r.get('draft', '?'))).name})"
        pos = ", ".join(f"{x:.2f}" for x in acc.get("pos_accept", [])[:8])
        n = f"{r.get('n', '?')} x {r.get('prompts', '?')}"
        rows.append([r["gate"], sampling_label(r), target, draft, _f(acc.get("accept_mean")),
                     _f(acc.get("accept_mean_macro")),
                     f"[{pos}]", _f(acc.get("draft_share")), acc.get("verify_rows", "-"), n,
                     device_label(r), r.get("dtype", "?"),
                     "PASSED" if r.get("passed") else "FAILED", c.get("commit", "?"), str(c.get("date", "?"))[:10],
                     f"[{path.name}]({path.as_posix()})"])
    return rows


def _frac(t6: dict[str, Any], plain: dict[str, Any]) -> str:
    """drafted tok/s over accept_mean x plain at the criterion's point."""
    am, tok = t6.get("accept_mean"), t6.get("tok_s")
    return _f(tok / (am * plain["tok_s"])) if am and tok and plain.get("tok_s") else "-"


def _old_tau6(r: dict[str, Any]) -> dict[str, Any]:
    """A record from before issue 11's criterion (its ``tau6`` judged 0.75 x 6 x plain): judged again by today's
    0.85 x accept_mean x plain from its own tau-6 sweep row."""
    from ..bench.common import CRITERION

    t6 = r.get("tau6")
    row = next((s for s in r.get("sweep", []) if s.get("tau_nominal") == 6.0), None)
    if not t6 or not row or not r.get("plain"):
        return {}
    need = CRITERION * row["accept_mean"] * r["plain"]["tok_s"]
    return {"tok_s": t6["tok_s"], "needed": need, "met": t6["tok_s"] >= need, "accept_mean": row["accept_mean"]}


def bound_of(r: dict[str, Any]) -> dict[str, Any] | None:
    """The record's drafted bound (``bench_common.criterion_bound``): its own ``bound``, or for a record from before it
    the same arithmetic on its verify costs, its draft's bytes (its ``weights`` line), the head of its shape and its
    copy bandwidth. None where a piece is missing (a checkpoint bench: its head is not in the record) and for the
    eager engines."""
    import re

    from ..bench.common import criterion_bound
    from ..bench.shapes import SHAPES

    if r.get("bound"):
        return r["bound"]
    c = r.get("conditions", {})
    if "eager" in str(c.get("engine", "")):
        # an eager engine's standalone verify timing carries host work that its drafted loop overlaps (its drafted
        # runs measure above this arithmetic): no bound is derived for it
        return None
    lines = "\n".join(r.get("lines", []))
    m = re.search(r"draft_bytes=(\d+)", lines)
    facts, shape = r.get("shape_facts"), SHAPES.get(str(r.get("shape")))
    vocab_hidden = (facts["vocab"], facts["hidden"]) if facts else (shape.vocab, shape.hidden) if shape else None
    if not (m and vocab_hidden and r.get("verify") and r.get("bandwidth", {}).get("copy_GBps")):
        return None
    rows = c.get("verify_rows") or (shape.block if shape else None)
    w = re.search(r"mtp_width=(\d+)", lines)
    passes = int(w.group(1)) if r.get("bench") == "qwen38-mtp" and w else 1
    esize = RUN[str(c.get("dtype"))].itemsize if str(c.get("dtype")) in RUN else 2
    if not rows or not any(v["rows"] == rows for v in r["verify"]):
        return None
    head = vocab_hidden[0] * vocab_hidden[1] * esize
    return criterion_bound(r["verify"], rows, passes * (int(m.group(1)) + head), r["bandwidth"]["copy_GBps"])


def bench_rows(records) -> tuple[list[list[Any]], list[str]]:
    rows, sweeps = [], []
    for path, r in records:
        if "bench" not in r or "plain" not in r:
            continue
        c, bw, p = r.get("conditions", {}), r.get("bandwidth", {}), r["plain"]
        ver = {v["rows"]: v["rel_plain"] for v in r.get("verify", [])}
        top = max(ver) if ver else None
        hf = r.get("hf", {})
        t6 = r.get("criterion") or _old_tau6(r)        # tau 6 (DFlash, DFlash2) or a = 0.8 (MTP)
        name = r["bench"] + ("" if r.get("complete", True) else " (partial)")
        rows.append([name, r.get("shape"), c.get("device_name", "?"), c.get("dtype"), c.get("prompt_len"),
                     c.get("engine", "-"), _f(bw.get("copy_GBps"), 0), _f(bw.get("roofline_tok_s"), 1),
                     _f(bw.get("roofline_read_tok_s"), 1), _f(p.get("tok_s"), 1), _f(p.get("ratio_roofline")),
                     _f(p.get("ratio_roofline_read")),
                     f"{_f(ver.get(top))} (R={top})" if top else "-",
                     _f(r.get("draft", {}).get("rel_plain_step")),
                     f"{_f(t6.get('tok_s'), 1)} ({'met' if t6.get('met') else 'not met'})" if t6 else "-",
                     _frac(t6, p), _f((bound_of(r) or {}).get("frac_max")),
                     _f(hf.get("tok_s"), 2), f"{_f(hf.get('ratio_ours'), 1)}x" if "ratio_ours" in hf else "-",
                     c.get("commit", "?"), str(c.get("date", "?"))[:10], f"[{path.name}]({path.as_posix()})"])
        if r.get("sweep"):
            sweeps += ["", f"Acceptance sweep of `{path.as_posix()}` ({r['bench']} {r.get('shape')}, "
                           f"{c.get('device_name', '?')}, {c.get('dtype')}, prompt {c.get('prompt_len')}, batch 1, "
                           f"width {c.get('width', 'fixed')}; plain {_f(p.get('tok_s'), 1)} tok/s):", ""]
            sweeps += _table(["tau (nominal)", "a", "accept_mean", "tok/s", "speedup", "draft_share",
                              "of tau x plain", "ids identical"],
                             [[_f(s["tau_nominal"], 1), _f(s["a"], 4), _f(s["accept_mean"]), _f(s["tok_s"], 1),
                               f"{_f(s['speedup'], 2)}x", _f(s["draft_share"]),
                               _f(s.get("tau_x_plain_frac", s.get("frac_of_tau_x_plain"))),
                               s.get("ids_identical")] for s in r["sweep"]])
        m = r.get("measured")
        if m:
            sweeps.append(f"\nMeasured with the real draft on `{path.as_posix()}`: accept_mean "
                          f"{_f(m['accept_mean'])}, {_f(m['tok_s'], 1)} tok/s, speedup {_f(m['speedup'], 2)}x, "
                          f"draft_share {_f(m['draft_share'])}, ids identical to the padded plain run "
                          f"{m.get('ids_identical_padded')}")
        for pol in r.get("cost_policy", []):
            sweeps.append(f"\n`--width cost` at a = {pol['a']}: most chosen width {pol['most_chosen']}, "
                          f"widths {pol['widths']}, {_f(pol['tok_s'], 1)} tok/s, ids identical {pol['ids_identical']}")
    return rows, sweeps


def kernel_rows(records) -> list[list[Any]]:
    rows = []
    for path, r in records:
        if "rows" in r and "impls" in r and "shape" in r:
            for k in r["rows"]:
                rows.append([k["case"], r.get("device", "?"), _f(k.get("floor_us"), 2), _f(k.get("torch_us"), 1),
                             _f(k.get("triton_us"), 1), f"{_f(k.get('speedup'), 1)}x" if "speedup" in k else "-",
                             k.get("check", "-"), f"[{path.name}]({path.as_posix()})"])
    return rows


def render(results_dir: Path, plots: list[str] | None = None, title: str = "Results",
           records: list[Record] | None = None) -> str:
    """The README text for ``results_dir`` (``plots``: PNG paths relative to it, linked at the end; ``records``:
    its records when the caller has read them)."""
    records = load_records(results_dir) if records is None else records
    out = [f"# {title}", "", "Generated by `bloomery results` from the JSON records in this folder; do not edit by "
           "hand. Acceptance is printed, never pinned (CONTRACT.md). accept_mean = mean kept rows per drafted window "
           "(bonus included), pooled over prompts; macro = mean of per-prompt means (z-lab's tau). pos_accept[i] = "
           "P(the first i+1 proposals kept).", "", "## Acceptance per target x draft", ""]
    from .accept import summary_table
    out += ["The latest record per gate, target, device and dtype, the published figures beside it (external):", ""]
    out += summary_table(records) + ["", "Every record:", ""]
    acc = acceptance_rows(records)
    head = ["gate", "sampling", "target", "draft", "accept_mean", "macro", "pos_accept", "draft_share", "verify rows",
            "N (ids x prompts)", "device", "dtype", "verdict", "commit", "date", "record"]
    out += _table(head, acc) if acc else ["No gate records yet."]
    from .side import RANDOM_HEAD, SIDE_HEAD, random_rows, random_why, side_by_side_rows
    side = side_by_side_rows(records, SAMPLED_ANCHORS)
    if side:
        out += ["", "## Greedy and T = 1 side by side", "", "One row per gate x device x dtype: the latest greedy "
                "record's accept_mean beside the latest T = 1 record's (speculative sampling, the same definition) "
                "with its (s) line's verdict and p, and the published figures measured at T = 1 (external: their "
                "models and data). `-`: no such record yet.", ""]
        out += _table(SIDE_HEAD, side)
    out += ["", "Published numbers (external: their models, data and conditions, not reproduced here):", ""]
    out += _table(["draft", "source and conditions (external)", "published"], [list(a) for a in ANCHORS])
    rnd = random_rows(records)
    if rnd:
        out += ["", "## Random-weight real-layout runs (memory and time, not acceptance)", "", random_why(records), ""]
        out += _table(RANDOM_HEAD, rnd)
    rows, sweeps = bench_rows(records)
    out += ["", "## Decode speed (`bloomery bench`)", ""]
    if rows:
        out += ["Batch 1; roofline = copy bandwidth / weight bytes (every weight read once a step); read roofline = "
                "copy bandwidth / the bytes a step reads (one embedding row, not the table); verify = cost of a pass "
                "of R rows over one plain step; draft = the draft's block (+ DFlash's context extension) over one "
                "plain step; tau 6 = drafted tok/s at a synthetic acceptance of tau = 6 (MTP: a = 0.8), met when "
                ">= 0.85 x accept_mean x plain (records from before that criterion judged again by it); bound = the "
                "most drafted / (accept_mean x plain) any draft of that size reaches on that verify (a verify of B "
                "rows + the draft's bytes and its head read once per pass at the copy rate, no host time: "
                "bench.criterion_bound).",
                ""]
        out += _table(["bench", "shape", "device", "dtype", "prompt", "engine", "copy GB/s", "roofline tok/s",
                       "read roofline tok/s", "plain tok/s", "of roofline", "of read roofline", "verify", "draft",
                       "tau 6 / a 0.8 tok/s", "of accept_mean x plain", "bound", "HF eager tok/s", "ours / HF",
                       "commit", "date", "record"], rows)
        out += sweeps
    else:
        out += ["No bench records yet."]
    out += ["", f"External: {BENCH_ANCHOR}."]
    from .accept import plan_table
    out += plan_table(records)
    kr = kernel_rows(records)
    if kr:
        out += ["", "## DFlash2 kernels", ""]
        out += _table(["case", "device", "floor us", "torch us", "triton us", "speedup", "check", "record"], kr)
    if plots:
        out += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def is_record(r: dict[str, Any]) -> bool:
    """A record the tables show: a gate run, a bench, a plan measurement or a kernel bench (an expectation file such
    as results/engines/llamacpp-expected.json is not one)."""
    return any(k in r for k in ("gate", "bench", "plan_measure")) or ("rows" in r and "impls" in r)


def under(records: list[Record], folder: str) -> list[Record]:
    """The records below ``folder`` (a top-level folder of their results folder), their paths relative to it."""
    return [(Path(*p.parts[1:]), r) for p, r in records if len(p.parts) > 1 and p.parts[0] == folder]


def device_dirs(results_dir: Path, records: list[Record] | None = None) -> list[Path]:
    """The folders of results_dir that hold records (results/cpu, results/h200): one README of tables each
    (``records``: results_dir's, when the caller has read them)."""
    records = load_records(results_dir) if records is None else records
    return [d for d in sorted(Path(results_dir).iterdir())
            if d.is_dir() and any(is_record(r) for _, r in under(records, d.name))]


def render_index(results_dir: Path, dirs: list[Path], records: list[Record] | None = None) -> str:
    """results/README.md: what is where, never a table of results."""
    results_dir = Path(results_dir)
    records = load_records(results_dir) if records is None else records
    out = ["# Results", "", "Committed run records (JSON, with their logs) per device. Each device folder has its "
           "own README of tables, generated by `bloomery results` from the records in it (do not edit them by hand); "
           "a plot lies beside the record it plots, the plots over several records at the top of the device folder.",
           ""]
    for d in dirs:
        recs = [r for _, r in under(records, d.name) if is_record(r)]
        gates = sum("gate" in r for r in recs)
        benches = sum("bench" in r for r in recs)
        out.append(f"- [{d.name}/README.md]({d.name}/README.md): {len(recs)} records ({gates} gate runs, "
                   f"{benches} benches)")
    others = [d for d in sorted(results_dir.iterdir()) if d.is_dir() and d not in dirs]
    for d in others:
        files = sorted(f.relative_to(results_dir).as_posix() for f in d.rglob("*") if f.is_file())
        out.append(f"- `{d.name}/`: " + ", ".join(f"[{f}]({f})" for f in files[:8]) +
                   (f" and {len(files) - 8} more" if len(files) > 8 else ""))
    top = [p for p, r in records if len(p.parts) == 1 and is_record(r)]
    if top:
        out += ["", "Records at the top of this folder (not in a device folder):", ""]
        out += [f"- [{p.name}]({p.as_posix()})" for p in top]
    notes = sorted(p.relative_to(results_dir).as_posix() for p in results_dir.rglob("NOTE.md"))
    if notes:
        out += ["", "Notes written beside their records:", ""] + [f"- [{n}]({n})" for n in notes]
    return "\n".join(out) + "\n"


def write_one(folder: Path, plots: bool = True, title: str = "Results",
              records: list[Record] | None = None) -> tuple[Path, list[str]]:
    """Write the README of ``folder`` (the tables of every record under it; the PNGs when asked and matplotlib imports,
    else the PNGs already there are linked); returns (path, linked pngs, relative to folder)."""
    folder = Path(folder)
    records = load_records(folder) if records is None else records
    pngs: list[str] = []
    if plots:
        from .plots import make_plots
        pngs = make_plots(folder, records)
    if not pngs:                                   # no matplotlib here: link the plots already in the folder
        pngs = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png"))
    path = folder / "README.md"
    write_text_atomic(path, render(folder, pngs, title, records))
    return path, pngs


def write(results_dir: Path, plots: bool = True, records: list[Record] | None = None) -> tuple[Path, list[str]]:
    """Write the README of every device folder of results_dir (one with records) and the README of results_dir,
    their index; a results_dir with no such folder (its records at its top) gets its tables in its own README. Returns
    (the top README, every linked png relative to results_dir)."""
    results_dir = Path(results_dir)
    records = load_records(results_dir) if records is None else records      # read once for every README
    dirs = device_dirs(results_dir, records)
    if not dirs:
        return write_one(results_dir, plots, records=records)
    pngs: list[str] = []
    for d in dirs:
        _, names = write_one(d, plots, title=f"Results: {d.name}", records=under(records, d.name))
        pngs += [f"{d.name}/{n}" for n in names]
    path = results_dir / "README.md"
    write_text_atomic(path, render_index(results_dir, dirs, records))
    return path, pngs


def results_command(
        results_dir: Annotated[Path, typer.Option("--dir", help="The results folder (JSON records).")]
        = Path("results"),
        plots: Annotated[bool, typer.Option("--plots/--no-plots", help="PNG plots (when matplotlib imports).")] = True,
        readme: Annotated[Path | None, typer.Option("--readme", help="Also rewrite the acceptance table between the "
                                                    "markers of this README (default: README.md beside the results "
                                                    "folder, when it has them).")] = None,
) -> None:
    """Regenerate results/<device>/README.md and results/README.md, their index, from the records.

    Tables, and PNG plots when matplotlib is installed."""
    from bloomery_gates.errors import InputError

    from .accept import BEGIN, marked_block

    if not Path(results_dir).is_dir():
        typer.echo(f"error: {results_dir}: no such folder (expected the results folder with JSON records)", err=True)
        raise typer.Exit(2)
    try:                                   # every check before the first write: a bad input changes nothing
        records = load_records(results_dir)
        if readme is not None and marked_block(readme) is None:
            raise InputError(readme, f"no '{BEGIN}' ... end markers; expected them around the acceptance table")
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    path, pngs = write(results_dir, plots, records)
    dirs = [d / "README.md" for d in device_dirs(Path(results_dir), records)]
    typer.echo(f"wrote {path}" + "".join(f", {p}" for p in dirs) + (f" and {len(pngs)} plots" if pngs else ""))
    readme_step(Path(results_dir), readme, records)


def readme_step(results_dir: Path, readme: Path | None, records: list[Record] | None = None) -> None:
    """The acceptance table into the README's marked block (results_accept); a README named by --readme must have
    the markers (exit 2), the default one is left as it is without them (a note)."""
    from bloomery_gates.errors import InputError

    from .accept import BEGIN, update_readme

    target = readme if readme is not None else results_dir.resolve().parent / "README.md"
    if readme is None and not target.is_file():
        return
    try:
        done = update_readme(target, load_records(results_dir) if records is None else records)
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if done:
        typer.echo(f"wrote the acceptance table into {target}")
    elif readme is not None:
        typer.echo(f"error: {target}: no '{BEGIN}' ... end markers; expected them around the acceptance table",
                   err=True)
        raise typer.Exit(2)
    else:
        typer.echo(f"note: {target} has no acceptance markers ({BEGIN}); left as it is")
