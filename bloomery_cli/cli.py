"""The `bloomery` command line (typer + rich).

Exit codes: 0 every check passed, 1 a check failed, 2 the run could not start (bad input).
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bloomery_gates.errors import EXIT_INPUT, InputError

from .engine_cli import engine_app
from .exits import err, fail_input, print_error
from .gatekit import OWN_ENGINES
from .helptext import reflow
from .oneline import OneLineGroup
from .threads import Threads, apply_threads

app = typer.Typer(help="bloomery gates: gate and benchmark speculative-decoding drafts against a float64 "
                       "reference.\n\nExit codes: 0 passed, 1 a check failed, 2 bad input.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  cls=OneLineGroup)
gate_app = typer.Typer(help="List and run single gates.", no_args_is_help=True)
fixtures_app = typer.Typer(help="Build or verify the bundled fixtures (small trained checkpoints).",
                           no_args_is_help=True)
app.add_typer(gate_app, name="gate")
app.add_typer(fixtures_app, name="fixtures")
app.add_typer(engine_app, name="engine")
out = Console()


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("bloomery-gates")
        except PackageNotFoundError:                # run from a checkout that was never installed
            v = "unknown (not installed)"
        typer.echo(f"bloomery-gates {v}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", help="Print the installed version and exit.",
                                                is_eager=True, callback=_version)] = False) -> None:
    pass


def shown(path: Path) -> str:
    """A path relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def registry():
    from bloomery_gates.gates import GATES
    return GATES


def lookup(name: str):
    gates = registry()
    if name not in gates:
        fail_input(InputError(f"gate {name!r}", f"unknown; registered gates: {', '.join(sorted(gates))}"))
    return gates[name]


@gate_app.command("list")
def gate_list(wide: Annotated[bool, typer.Option("--wide", help="Also the default files and what each checks.")]
              = False,
              as_json: Annotated[bool, typer.Option("--json", help="A JSON array instead: per gate its name, family "
                                                    "(target), drafter kind, n, default files and what it checks.")]
              = False) -> None:
    """Show the registered gates: name, target family, drafter, n (``--wide``: default files and a description).
    The plain list fits an 80-column terminal."""
    if as_json:
        import json
        typer.echo(json.dumps([{"name": g.name, "family": g.family, "draft_kind": g.draft_kind, "n": g.n,
                                "target": shown(g.target), "draft": shown(g.draft), "about": g.about}
                               for g in registry().values()], indent=2))
        return
    table = Table(title="registered gates")
    cols = ("gate", "target", "drafter", "n") + (("default target", "default draft", "what") if wide else ())
    for col in cols:
        table.add_column(col, no_wrap=not wide or col in ("gate", "drafter"))
    for g in registry().values():
        row = (g.name, g.family, g.draft_kind, str(g.n))
        table.add_row(*row, *((shown(g.target), shown(g.draft), g.about) if wide else ()))
    out.print(table)
    if not wide:
        out.print("bloomery gate list --wide: default files and what each gate checks")


Target = Annotated[Path | None, typer.Option("--target", help="Target checkpoint: HF dir or *.gguf "
                                             "(default: the gate's fixture).")]
DraftOpt = Annotated[Path | None, typer.Option("--draft", help="Drafter checkpoint (HF dir) (default: fixture).")]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:<i>.")]
Dtype = Annotated[str, typer.Option("--dtype", help="Compute/storage dtype on the device: f32, bf16, f16.")]
N = Annotated[int | None, typer.Option("-n", help="Greedy ids compared per prompt (default: the gate's, 256).")]
Prompts = Annotated[Path | None, typer.Option("--prompts", help="JSONL prompts ('text' or 'ids' per line).")]
Json = Annotated[Path | None, typer.Option("--json", help="Write the run's record (JSON) here, atomically.")]
Temperature = Annotated[float | None, typer.Option("--temperature", help="Sample at T > 0 (0: greedy): the gate adds "
                                                  "the (s) check (plain vs drafted sampling, per position) and prints "
                                                  "accept_mean at T; the greedy (w) check still runs.")]
TopP = Annotated[float | None, typer.Option("--top-p", help="With --temperature: nucleus mass in (0, 1] (default 1).")]
TopK = Annotated[int | None, typer.Option("--top-k", help="With --temperature: keep the K likeliest ids (0: all).")]
Seed = Annotated[int | None, typer.Option("--seed", help="With --temperature: the runs' seed (default 0).")]
RefDevice = Annotated[str, typer.Option("--reference-device", help="Where the float64 reference runs: cpu (NumPy) "
                                        "or cuda / cuda:<i> (CuPy, the gpu extra; layer by layer, the same code).")]
RefCompare = Annotated[bool, typer.Option("--reference-compare", help="With --reference-device cuda: also run every "
                                          "exact reference computation on the host; an (r) line checks their worst "
                                          "rel <= 1e-12.")]
DraftDevice = Annotated[str | None, typer.Option(
    "--draft-device", help="Run the draft on this device (cpu, cuda, cuda:<i>) (default: the target's): its "
    "weights, store and own copies of the embedding / head live there; the taps cross once per window.")]
Oracle = Annotated[bool, typer.Option("--oracle", help="Also compare against transformers' modeling code for the "
                                      "target and speculators' for DFlash/DFlash2/DSpark drafts (float64, CPU): "
                                      "tier 3.")]


Engine = Annotated[str, typer.Option("--engine", help="Which engine runs the pair: ours (default), fast (the "
                                      "engines `bloomery bench` measures, under every line of the gate) or llama.cpp "
                                      "(its own speculative decoding, judged against the float64 reference).")]
LlamaCpp = Annotated[Path | None, typer.Option("--llama-cpp", help="With --engine llama.cpp: a `bloomery engine "
                                               "build --out DIR` folder (default: $BLOOMERY_LLAMA_CPP, else "
                                               "~/.cache/bloomery/llama.cpp).")]
RecordOut = Annotated[Path | None, typer.Option("--record", help="Also write the engine's greedy runs as the "
                                                "engine-agnostic record (JSONL, docs/ENGINES.md) here; `bloomery "
                                                "engine judge` reads it.")]


def gate_flags(func: Callable[..., None]) -> Callable[..., None]:
    """One flag per option the registered gates declare (``GateDef.options``: ``--confidence-cut`` for the DSpark
    gates, ``--mtp-hidden`` for mimo2-mtp), with the declaring gate's help; their text reaches ``func`` as
    ``gate_options`` and is parsed there by the gate that runs. A gate adds a flag by declaring it, not here."""
    declared: dict[str, Any] = {}
    for g in registry().values():
        for key, opt in g.options.items():
            declared.setdefault(key, opt)
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "gate_options"]
    flags = [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        str | None, typer.Option("--" + key.replace("_", "-"), help=opt.help, metavar=opt.metavar)])
        for key, opt in sorted(declared.items())]

    @functools.wraps(func)
    def run(**kw: Any) -> None:
        given = {key: kw.pop(key) for key in declared}
        return func(**kw, gate_options={k: v for k, v in given.items() if v is not None})

    run.__signature__ = sig.replace(parameters=own + flags)          # typer reads the signature
    run.__annotations__ = {p.name: p.annotation for p in own + flags}
    return run


@gate_app.command("run")
@gate_flags
def gate_run(name: Annotated[str, typer.Argument(help="Gate name (see `bloomery gate list`).")],
             target: Target = None, draft: DraftOpt = None, device: Device = "cpu", dtype: Dtype = "f32",
             n: N = None, prompts: Prompts = None, json: Json = None, oracle: Oracle = False,
             width: Annotated[str, typer.Option("--width", help="Verify width policy: fixed (every proposal) or "
                                                 "cost (per window, by measured cost and running acceptance; "
                                                 "may change which rows run, never a token).")] = "fixed",
             draft_policy: Annotated[str | None, typer.Option(
                 "--draft-policy", help="auto (the plan's ctx-first rule may turn the draft off; the default "
                 "without --draft), on (the default with --draft: never turned off), off (plain-only).")] = None,
             gpu_mem: Annotated[str | None, typer.Option(
                 "--gpu-mem", help="The plan's memory budget (80G, 24GiB, ...) (default: the device's free "
                 "memory).")] = None,
             threads: Threads = None,
             temperature: Temperature = None, top_p: TopP = None, top_k: TopK = None, seed: Seed = None,
             draft_temperature: Annotated[float | None, typer.Option(
                 "--draft-temperature", help="With --temperature, DFlash gates: the drafter samples its block "
                 "from q = softmax(logits / T_d) instead of proposing its argmax (q a point mass).")] = None,
             draft_top_k: Annotated[int | None, typer.Option(
                 "--draft-top-k", help="With --draft-temperature: q restricted to the drafter's top K.")] = None,
             reference_device: RefDevice = "cpu", reference_compare: RefCompare = False,
             draft_device: DraftDevice = None,
             tp: Annotated[int, typer.Option(
                 "--tp", help="Split the target over N processes (tensor parallel: gloo on the CPU, NCCL over "
                 "cuda:<i>..cuda:<i+N-1>); qwen3 family targets.")] = 1,
             engine: Engine = "ours", llama_cpp: LlamaCpp = None, record: RecordOut = None,
             gate_options: dict[str, str] | None = None) -> None:
    """Run one gate and print the contract lines; the exit code is the verdict.

    With --engine llama.cpp the pair runs in llama.cpp's own speculative decoding (built by `bloomery engine
    build`) and is judged against the float64 reference: (w) ids identical, (e) plain ids vs f64, (a) drafts and
    acceptance vs an f64 replay of the same windows (docs/ENGINES.md)."""
    from .gate import GateOptions, run_gate
    from .sampling.rule import sampling_options

    if engine not in OWN_ENGINES:
        others = {"--target": target, "--draft": draft, "--oracle": oracle or None, "--temperature": temperature,
                  **{"--" + k.replace("_", "-"): v for k, v in (gate_options or {}).items()},
                  "--draft-policy": draft_policy,
                  "--gpu-mem": gpu_mem, "--draft-device": draft_device, "--tp": tp if tp != 1 else None,
                  "--width": width if width != "fixed" else None,
                  "--reference-device": reference_device if reference_device != "cpu" else None}
        from .engine_cli import engine_gate_run
        engine_gate_run(lookup(name), engine, llama_cpp, record, device, dtype, n, prompts, json, threads,
                        [k for k, v in others.items() if v is not None])
        return
    if llama_cpp is not None:
        fail_input(InputError("--llama-cpp", "only with --engine llama.cpp"))

    try:
        sampling = sampling_options(temperature, top_p, top_k, seed, draft_temperature, draft_top_k)
    except InputError as e:
        fail_input(e)

    try:
        apply_threads(threads, device)
    except InputError as e:
        fail_input(e)

    gate = lookup(name)
    extra: dict[str, Any] = {}
    for key, text in (gate_options or {}).items():       # the gate's own flags: its GateOption parses them
        own = gate.options.get(key)                       # one it does not declare: the run names it (exit 2)
        try:
            extra[key] = text if own is None else own.value("--" + key.replace("_", "-"), text)
        except InputError as e:
            fail_input(e)
    if width not in ("fixed", "cost"):
        fail_input(InputError("--width", f"{width!r}: expected fixed or cost"))
    opts = GateOptions(target, draft, device, dtype, n, prompts, json, oracle, draft_options=extra, width=width,
                       draft_policy=draft_policy, gpu_mem=gpu_mem,
                       sampling=sampling, reference_device=reference_device, reference_compare=reference_compare,
                       draft_device=draft_device, tp=tp, record=record, engine=engine)
    try:
        code, _ = run_gate(gate, opts)
    except InputError as e:
        fail_input(e)
    raise typer.Exit(code)


def draft_device_ok(g) -> bool:
    from .parallel.draft_device import FAMILIES, KINDS
    return g.family in FAMILIES and g.draft_kind in KINDS


@app.command("gates")
def gates_all(device: Device = "cpu", dtype: Dtype = "f32", n: N = None,
              results: Annotated[Path | None, typer.Option("--results", help="Write one JSON record per gate "
                                                           "into this folder.")] = None,
              oracle: Annotated[bool | None, typer.Option("--oracle/--no-oracle", help="Tier 3 (outside oracles) on "
                                                          "every gate; default: on when transformers imports (the "
                                                          "draft and GGUF oracles add their lines where "
                                                          "speculators / llama_cpp import, else a note).")] = None,
              threads: Threads = None,
              temperature: Temperature = None, top_p: TopP = None, top_k: TopK = None, seed: Seed = None,
              reference_device: RefDevice = "cpu", reference_compare: RefCompare = False,
              draft_device: DraftDevice = None,
              engine: Engine = "ours", llama_cpp: LlamaCpp = None,
              expect: Annotated[Path | None, typer.Option(
                  "--expect", help="With --engine llama.cpp: a JSON file of the verdicts the engine is known to get "
                  "({gate: {verdict, failing: [line prefixes]}}); exit 0 when every verdict and failing line is "
                  "the expected one (a known engine discrepancy stays visible and cannot change unseen).")] = None,
              ) -> None:
    """Run every registered gate in turn on its fixtures, then a summary table; exit 1 if any failed.

    With --engine llama.cpp: every pair llama.cpp runs, in llama.cpp, judged against the float64 reference;
    the pairs it cannot run are listed with the reason."""
    import importlib.util

    if engine not in OWN_ENGINES:
        from .engine_cli import engine_gates
        engine_gates(registry(), engine, llama_cpp, device, dtype, n, results, threads, expect)
        return

    from .gate import GateOptions, run_gate

    try:
        n_threads = apply_threads(threads, device)
    except InputError as e:
        fail_input(e)

    if oracle is None:
        oracle = importlib.util.find_spec("transformers") is not None
    from .preflight import check_n, check_output_dir
    from .sampling.rule import sampling_options

    try:
        sampling = sampling_options(temperature, top_p, top_k, seed, None, None)
    except InputError as e:
        fail_input(e)
    tag = f"-t{sampling.temperature:g}" if sampling else ""
    fast = engine == "fast"
    if fast and (sampling is not None or draft_device is not None):
        fail_input(InputError("--temperature" if sampling is not None else "--draft-device",
                              "not supported with --engine fast"))
    from .fast_engine import why_not
    skipped = {g.name: why for g in registry().values() if fast and (why := why_not(g))}
    names = {g.name: f"{g.name}-{'fast-' if fast else ''}{device.replace(':', '')}-{dtype}{tag}.json"
             for g in registry().values() if g.name not in skipped}
    try:                                   # the flags every gate shares: checked once, before the first gate runs
        if n is not None:
            check_n(n)
        check_output_dir(results, list(names.values()))
        from bloomery_gates.dtypes import run_dtype

        from .gatekit import resolve_device
        resolve_device(device)
        run_dtype(dtype)
        if draft_device is not None:
            from .parallel.draft_device import parse_device
            parse_device("--draft-device", draft_device)
        from .refdev import reference_selection
        reference_selection(reference_device, reference_compare)
    except InputError as e:
        fail_input(e)
    rows, worst, marginal = [], 0, []
    for g in registry().values():
        if g.name in skipped:
            rows.append((g.name, "n/a", "-", "-", "-", "-", "-"))
            continue
        t0 = time.perf_counter()
        moved = draft_device if draft_device is not None and draft_device_ok(g) else None
        if draft_device is not None and moved is None:
            out.print(f"{g.name}: the draft stays on {device} (no --draft-device support for a {g.family} "
                      f"{g.draft_kind} pair)", highlight=False, soft_wrap=True)
        opts = GateOptions(device=device, dtype=dtype, n=n, json=(results / names[g.name]) if results else None,
                           oracle=oracle, oracle_where_exists=True, sampling=sampling,
                           reference_device=reference_device,
                           reference_compare=reference_compare, draft_device=moved, engine=engine)
        try:
            code, rep = run_gate(g, opts)
        except InputError as e:
            print_error(e, g.name)
            rows.append((g.name, "ERROR", "-", "-", "-", "-", f"{time.perf_counter() - t0:.1f}s"))
            worst = max(worst, EXIT_INPUT)
            continue
        acc = rep.facts.get("acceptance", {})
        same = str(rep.facts["n"]) if any(line.startswith("ids identical") for line in rep.lines) else "no"
        use = rep.worst_margin()
        rows.append((g.name, "PASSED" if code == 0 else "FAILED", same, f"{acc.get('accept_mean', 0):.3f}",
                     f"{acc.get('draft_share', 0):.3f}", "-" if use is None else f"{use:.2f}",
                     f"{time.perf_counter() - t0:.1f}s"))
        marginal += [(g.name, line, m) for line, m in rep.marginal()]
        worst = max(worst, code)
    table = Table(title=f"gates{' on the fast engine' if fast else ''} on {device} {dtype}"
                  + (f" at T={sampling.temperature:g}" if sampling else "")
                  + f", {n_threads} CPU thread(s) (bloomery_cli.threads)",
                  caption="ids: ids identical per prompt, accept: accept_mean, share: draft_share, "
                          "band: the largest statistic / band of the gate's banded lines")
    for col in ("gate", "verdict", "ids", "accept", "share", "band", "wall"):
        table.add_column(col, no_wrap=True, justify="left" if col in ("gate", "verdict") else "right")
    for r in rows:
        style = {"PASSED": "green", "n/a": "dim"}.get(r[1], "red")
        table.add_row(*r, style=style)
    out.print(table)
    for name, why in skipped.items():
        out.print(f"n/a {name}: {escape(why)}", highlight=False, soft_wrap=True)
    print_marginal(marginal)
    raise typer.Exit(1 if worst == 1 else worst)


def print_marginal(marginal: list[tuple[str, str, float]]) -> None:
    """The passing lines that use more than MARGINAL of their band: the next edge case, seen before it flips."""
    from .contract import MARGINAL

    if not marginal:
        out.print(f"marginal: no passing line uses more than {MARGINAL:g} of its band", highlight=False)
        return
    out.print(f"marginal: {len(marginal)} passing line(s) use more than {MARGINAL:g} of their band:", highlight=False)
    for gate, line, m in sorted(marginal, key=lambda x: -x[2]):
        what = line.split(" vs ")[0]
        out.print(f"  {m:.2f} {gate}: {escape(what)}", highlight=False, soft_wrap=True)


@app.command("bands")
def bands(shape: Annotated[str, typer.Option("--shape", help="A bench shape: qwen3-8b, qwen3-4b, tiny.")] = "qwen3-8b",
          device: Device = "cpu", dtype: Dtype = "bf16",
          prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt rows to check.")] = 64,
          json: Json = None) -> None:
    """The gate's (r) lines and their emulated bands on random weights of a real model's shape (qwen3-dflash)."""
    from .bench.band_probe import probe

    try:
        code, _ = probe(shape, device, dtype, prompt_len, json)
    except InputError as e:
        fail_input(e)
    raise typer.Exit(code)


@app.command("inventory")
def inventory(files: Annotated[list[Path], typer.Argument(help="GGUF / safetensors files, shards or HF dirs.")],
              markdown: Annotated[Path | None, typer.Option("--markdown", help="Also write the tables here "
                                                            "as markdown.")] = None) -> None:
    """Header-only inventory of checkpoint files, and which draft path each would take.

    Tensors by group, bytes, metadata, active bytes per token, and the draft path (MTP in-file, MTP sidecar, block
    draft, none) with the reason."""
    from .inventory import inventory_command

    try:
        inventory_command(files, markdown, console=out)
    except InputError as e:
        fail_input(e)


@fixtures_app.command("build")
def fixtures_build(out_dir: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("fixtures"),
                   device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
                   quick: Annotated[bool, typer.Option("--quick", help="A few steps only (pipeline test).")] = False
                   ) -> None:
    """Train the tokenizer, target and drafters on the Python standard library and export them."""
    import torch

    from .fixturegen.build import build
    from .gatekit import resolve_device
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    try:
        resolve_device(dev)
    except InputError as e:
        fail_input(e)
    build(out_dir, dev, quick=quick)


@fixtures_app.command("verify")
def fixtures_verify(out_dir: Annotated[Path, typer.Option("--out", help="Fixture folder.")] = Path("fixtures")
                    ) -> None:
    """Check every fixture file against the sha256 in MANIFEST.json."""
    from .fixturegen.build import verify

    try:
        problems = verify(out_dir)
    except InputError as e:
        fail_input(e)
    for p in problems:
        err.print(f"[red]{escape(p)}[/]", highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)
    out.print(f"fixtures in {out_dir}: every file matches MANIFEST.json")


@fixtures_app.command("derive")
def fixtures_derive(names: Annotated[list[str], typer.Argument(help="Derived fixtures (MANIFEST.json 'derived'), "
                                                               "e.g. qwen3-tiny.gguf.")],
                    fixtures: Annotated[Path, typer.Option("--fixtures", help="Fixture folder.")] = Path("fixtures")
                    ) -> None:
    """Make the fixtures that are not stored but made from the stored ones (the target's GGUF), each checked
    against its sha256; print their paths (in .fixtures-derived/ beside the folder, or $BLOOMERY_DERIVED)."""
    from .fixturegen.derived import derived

    try:
        paths = [derived(n, fixtures) for n in names]
    except InputError as e:
        fail_input(e)
    for p in paths:
        typer.echo(str(p))


def _register_late() -> None:
    """Commands whose modules pull in more (bench, results): imported when the app is built."""
    from .bench.command import bench_command
    from .plan.command import plan_command
    from .results.table import results_command

    app.command("bench")(bench_command)
    app.command("results")(results_command)
    app.command("plan")(plan_command)


_register_late()
reflow(app)                             # --help paragraphs wrapped by the terminal (bloomery_cli.helptext)


def main() -> None:
    try:
        apply_threads()                 # the thread rule (bloomery_cli.threads); --threads overrides it per command
        app()
    except InputError as e:   # a reader error outside a command's own handling
        err.print(f"error: {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INPUT)


if __name__ == "__main__":
    main()
