"""``bloomery gate run NAME --engine llama.cpp`` and ``bloomery engine judge``: another engine's greedy runs of a
gate's pair, judged with the gate's lines (``judge``). Every check that can refuse (the pair, the driver, the
files, the flags) runs before any model work."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bloomery_gates.errors import InputError

from ..contract import Report, stdout_emit
from ..fixturegen.derived import stored_or_derived
from ..loading import load_target, load_tokenizer
from ..preflight import check_n, check_output_file
from ..prompts import read_prompts
from ..results.records import write_report
from . import llamacpp
from . import record as rec
from .judge import Judge
from .replay import PROPOSE, lookup


@dataclass
class EngineOptions:
    engine: str = "llama.cpp"
    llama_cpp: Path | None = None
    device: str = "cpu"
    dtype: str = "f32"
    n: int | None = None
    prompts: Path | None = None
    json: Path | None = None
    record: Path | None = None          # the engine record (JSONL) is written here as well
    max_prompts: int | None = None


def _specs(gate, gguf: Path | None = None):
    """The judge's target and draft specs: the gate's, or (``gguf``: a pair whose llama.cpp target is a fixture GGUF
    of its own, ``Pair.gguf``) that file's; an in-file draft (the gate's draft is its target) is read beside it by
    the gate's loader, a draft file of its own stays the gate's."""
    target_spec = load_target(gguf or gate.target)
    in_file = Path(gate.draft).resolve() == Path(gate.target).resolve()
    return target_spec, gate.load_draft(gguf if gguf is not None and in_file else gate.draft, target_spec)


def judgeable(gate) -> None:
    """Exit 2 before any work when the f64 reference has no replay of the gate's drafter."""
    if lookup(PROPOSE, gate.family, gate.draft_kind) is None:
        raise InputError(gate.name, f"no float64 replay for a {gate.family} {gate.draft_kind} draft")


def _judge(report: Report, gate, record: rec.Record, target_spec, draft_spec) -> int:
    Judge(report, record, gate.family, gate.draft_kind, target_spec, draft_spec).run()
    return report.finish()


def _write_json(report: Report, path: Path | None, device: str = "cpu") -> None:
    """The verdict's record (atomically), with the run's conditions (device, commit, date, versions)."""
    if path is not None:
        dev = torch.device("cuda" if device.startswith("cuda") and torch.cuda.is_available() else "cpu")
        write_report(path, report.facts, report.lines, dev)


def run_engine_gate(gate, opts: EngineOptions, emit: Callable[[str], None] | None = None) -> tuple[int, Report]:
    if opts.engine != "llama.cpp":
        raise InputError("--engine", f"{opts.engine!r}: expected ours or llama.cpp")
    if opts.dtype not in ("f32", "bf16"):
        raise InputError("--dtype", f"{opts.dtype!r}: the llama.cpp engine gate runs f32 or bf16")
    if opts.device != "cpu" and not opts.device.startswith("cuda"):
        raise InputError("--device", f"{opts.device!r}: expected cpu or cuda")
    p = llamacpp.pair(gate.name)                               # a pair it cannot run: exit 2 before any work
    judgeable(gate)
    drv = llamacpp.find_driver(opts.llama_cpp)
    n = check_n(gate.n if opts.n is None else opts.n)
    check_output_file(opts.json, "--json")
    check_output_file(opts.record, "--record")
    gguf = gate.target.with_suffix(".gguf") if gate.target.suffix != ".gguf" else gate.target
    if p.gguf:
        gguf = gate.target.parent / p.gguf
    gguf = stored_or_derived(gguf)                              # qwen3-tiny.gguf is made, not stored
    if not gguf.is_file():
        raise InputError(gguf, "no GGUF of the gate's target beside it (the llama.cpp engine reads the target as GGUF)")
    target_spec, draft_spec = _specs(gate, gguf if p.gguf else None)
    prompts = read_prompts(Path(opts.prompts or gate.prompts), lambda: load_tokenizer(gate.target),
                           opts.max_prompts, target_spec.vocab_size)
    width = gate.block(draft_spec) - 1
    report = Report(gate.name, emit=emit or stdout_emit)
    report.header(str(gguf), str(draft_spec.source if p.gguf else gate.draft), opts.device, opts.dtype, n,
                  len(prompts))
    source = {"target": "in-file", "file": "as given", "mtp-file": "mtp-file beside the target"}.get(
        p.draft, "llama.cpp-converter")
    report.load(gate.draft_kind, engine="llama.cpp", spec_type=p.spec_type, width=width, draft_gguf=source,
                driver=str(drv))
    t0 = time.perf_counter()
    try:
        record = llamacpp.run(gate, gate.target, gguf, gate.draft, [list(x) for x in prompts], n, opts.dtype,
                              opts.device, width, drv, torch.get_num_threads(), progress=report.note)
    except llamacpp.EngineAborted as e:              # fails closed: nothing was judged
        report.check(f"(w) {e}", False)
        code = report.finish()
        _write_json(report, opts.json, opts.device)
        return code, report
    engine_s = time.perf_counter() - t0
    if opts.record is not None:
        rec.write(record, opts.record)
    code = _judge(report, gate, record, target_spec, draft_spec)
    report.facts["engine_s"] = round(engine_s, 2)
    report.facts["judge_s"] = round(time.perf_counter() - t0 - engine_s, 2)
    _write_json(report, opts.json, opts.device)
    return code, report


def judge_record(gate, path: Path, json_out: Path | None = None,
                 emit: Callable[[str], None] | None = None) -> tuple[int, Report]:
    """``bloomery engine judge``: a record written by any engine, judged as the engine gate judges llama.cpp's."""
    check_output_file(json_out, "--json")
    judgeable(gate)
    p = llamacpp.PAIRS.get(gate.name)
    target_spec, draft_spec = _specs(gate, gate.target.parent / p.gguf if p is not None and p.gguf else None)
    record = rec.read(path, target_spec.vocab_size)
    if record.header.gate != gate.name:
        raise InputError(path, f"the record is of gate {record.header.gate!r}, not {gate.name!r}")
    report = Report(gate.name, emit=emit or stdout_emit)
    report.header(str(gate.target), str(gate.draft), record.header.device, record.header.dtype, record.header.n,
                  len(record.prompts))
    report.load(gate.draft_kind, engine=record.header.engine.replace(" ", "_"), width=record.header.width,
                record=str(path))
    code = _judge(report, gate, record, target_spec, draft_spec)
    _write_json(report, json_out)
    return code, report
