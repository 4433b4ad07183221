"""The engine commands: ``bloomery gate run NAME --engine llama.cpp``, ``bloomery gates --engine llama.cpp``,
``bloomery engine build`` (llama.cpp's tools from the sdist) and ``bloomery engine judge`` (any engine's record)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bloomery_gates.errors import EXIT_INPUT, InputError

from .exits import fail_input, print_error
from .threads import Threads, apply_threads

engine_app = typer.Typer(help="Other engines under the gate: build llama.cpp, judge an engine's record.",
                         no_args_is_help=True)
out = Console()


def engine_gate_run(gate, engine: str, llama_cpp: Path | None, record: Path | None, device: str, dtype: str,
                    n: int | None, prompts: Path | None, json_out: Path | None, threads: int | None,
                    unsupported: list[str]) -> None:
    from .engines.gate import EngineOptions, run_engine_gate

    try:
        if unsupported:
            raise InputError(unsupported[0], f"not supported with --engine {engine} (it takes --device, --dtype, "
                                             "-n, --prompts, --json, --record, --llama-cpp, --threads)")
        apply_threads(threads, device)
        code, _ = run_engine_gate(gate, EngineOptions(engine, llama_cpp, device, dtype, n, prompts, json_out, record))
    except InputError as e:
        fail_input(e)
    raise typer.Exit(code)


def check_expect(path: Path | None) -> dict:
    if path is None:
        return {}
    from .files import parse_json, read_text
    data = parse_json(read_text(path, "--expect file"), path, "expected verdicts")
    if not isinstance(data, dict) or not all(isinstance(v, dict) and v.get("verdict") in ("PASSED", "FAILED")
                                             for v in data.values()):
        raise InputError(path, "expected {gate: {\"verdict\": \"PASSED\"|\"FAILED\", \"failing\": [...]}}")
    return data


def failing(lines: list[str]) -> list[str]:
    return [line for line in lines if line.endswith(" FAIL")]


def matches(expected: dict, verdict: str, lines: list[str]) -> bool:
    """The verdict is the expected one and every failing line starts with one of the expected prefixes, each
    prefix matched by a failing line."""
    if expected.get("verdict") != verdict:
        return False
    want, got = expected.get("failing", []), failing(lines)
    return (all(any(g.startswith(w) for w in want) for g in got) and
            all(any(g.startswith(w) for g in got) for w in want))


def engine_gates(gates: dict, engine: str, llama_cpp: Path | None, device: str, dtype: str, n: int | None,
                 results: Path | None, threads: int | None, expect: Path | None) -> None:
    from .engines import llamacpp
    from .engines.gate import EngineOptions, run_engine_gate
    from .preflight import check_n, check_output_dir

    try:
        if engine != "llama.cpp":
            raise InputError("--engine", f"{engine!r}: expected ours or llama.cpp")
        apply_threads(threads, device)
        llamacpp.find_driver(llama_cpp)
        if n is not None:
            check_n(n)
        names = {g: f"{g}-llamacpp-{device.replace(':', '')}-{dtype}" for g in gates}
        check_output_dir(results, [f"{v}.json" for v in names.values()] + [f"{v}.jsonl" for v in names.values()])
        known = check_expect(expect)
    except InputError as e:
        fail_input(e)
    rows, worst, unexpected, skipped = [], 0, [], []
    for name, g in gates.items():
        why = llamacpp.why_not(name)
        if why:
            rows.append((name, "n/a", "-", "-", "-", "-"))
            skipped.append((name, why))
            continue
        t0 = time.perf_counter()
        opts = EngineOptions(engine, llama_cpp, device, dtype, n,
                             json=(results / f"{names[name]}.json") if results else None,
                             record=(results / f"{names[name]}.jsonl") if results else None)
        try:
            code, rep = run_engine_gate(g, opts)
        except InputError as e:
            print_error(e, name)
            rows.append((name, "ERROR", "-", "-", "-", f"{time.perf_counter() - t0:.0f}s"))
            worst = max(worst, EXIT_INPUT)
            continue
        verdict = "PASSED" if code == 0 else "FAILED"
        acc = rep.facts.get("engine_acceptance", {})
        if known and not matches(known.get(name, {"verdict": "PASSED"}), verdict, rep.lines):
            unexpected.append(name)
        rows.append((name, verdict, f"{acc.get('engine_accept_mean', 0):.3f}",
                     f"{acc.get('reference_accept_mean', 0):.3f}", f"{acc.get('p', 1):.2g}",
                     f"{time.perf_counter() - t0:.0f}s"))
        worst = max(worst, code)
    table = Table(title=f"llama.cpp engine gates on {device} {dtype}",
                  caption="accept: the engine's accept_mean on its windows; ref: the f64 replay on the same "
                          "windows; p: the (a) sign test")
    for col in ("gate", "verdict", "accept", "ref", "p", "wall"):
        table.add_column(col, no_wrap=True, justify="left" if col in ("gate", "verdict") else "right")
    for r in rows:
        table.add_row(*r, style={"PASSED": "green", "n/a": "dim"}.get(r[1], "red"))
    out.print(table)
    for name, why in skipped:
        out.print(f"n/a {name}: {escape(why)}", highlight=False, soft_wrap=True)
    if known:
        if unexpected:
            out.print(f"expected verdicts ({expect}): {', '.join(unexpected)} differ from them", highlight=False)
            raise typer.Exit(1)
        out.print(f"expected verdicts ({expect}): every gate got its expected verdict and failing lines",
                  highlight=False)
        raise typer.Exit(0 if worst != EXIT_INPUT else worst)
    raise typer.Exit(1 if worst == 1 else worst)


@engine_app.command("build")
def engine_build(out_dir: Annotated[Path, typer.Option("--out", help="Folder for the sdist, the build and its log "
                                                       "(default: ~/.cache/bloomery/llama.cpp).")] =
                 Path.home() / ".cache" / "bloomery" / "llama.cpp",
                 cuda: Annotated[bool, typer.Option("--cuda", help="Build with CUDA (nvcc on PATH).")] = False,
                 arch: Annotated[str, typer.Option("--arch", help="CUDA architectures (90: H100/H200).")] = "90",
                 jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel compile jobs.")] = 2,
                 bench: Annotated[bool, typer.Option("--bench", help="Also llama-bench (bloomery bench's peer).")]
                 = False,
                 source: Annotated[Path | None, typer.Option("--source", help="A llama.cpp tree, or a .tar.gz of one, "
                                                             "instead of downloading the sdist.")] = None) -> None:
    """Build llama.cpp's speculative decoding (the llama-cpp-python 0.3.36 sdist's tree, commit 0c1e57098) and
    bloomery's driver for it into --out: CPU by default, --cuda for the GPU. The only network use is the pip
    download of that sdist. Then: bloomery gate run NAME --engine llama.cpp --llama-cpp DIR."""
    from .engines.build import build

    if jobs < 1 or jobs > 256:
        fail_input(InputError("--jobs", f"{jobs}: expected 1..256"))
    t0 = time.perf_counter()
    try:
        path = build(out_dir, cuda=cuda, arch=arch, jobs=jobs, bench=bench, source=source)
    except InputError as e:
        fail_input(e)
    out.print(f"engine build: {path} ready in {time.perf_counter() - t0:.0f} s", highlight=False)


@engine_app.command("judge")
def engine_judge(name: Annotated[str, typer.Argument(help="The gate whose pair the record ran.")],
                 record: Annotated[Path, typer.Argument(help="The engine record (JSONL, docs/ENGINES.md).")],
                 json_out: Annotated[Path | None, typer.Option("--json", help="Write the verdict's record here.")]
                 = None, threads: Threads = None) -> None:
    """Judge a record written by any engine (vLLM, SGLang, ... or --engine llama.cpp --record) with the engine
    gate's lines against the float64 reference; the exit code is the verdict."""
    from bloomery_gates.gates import GATES

    from .engines.gate import judge_record

    try:
        if name not in GATES:
            raise InputError(f"gate {name!r}", f"unknown; registered gates: {', '.join(sorted(GATES))}")
        apply_threads(threads, "cpu")
        code, _ = judge_record(GATES[name], record, json_out)
    except InputError as e:
        fail_input(e)
    raise typer.Exit(code)



