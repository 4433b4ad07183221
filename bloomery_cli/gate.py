"""One gate run, for any (target family, drafter) pair: load, check against the f64 reference,
run plain and drafted, print the contract, write the record. Pairs supply a `GateDef`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import InputError

from .contract import Report
from .cost import Phases, peak_device_bytes, peak_host_rss_bytes
from .gate_plan import decide_draft, policy_of
from .gatekit import DTYPES, DraftCheck, GateDef, resolve_device
from .loading import load_target, load_tokenizer
from .metrics import Tally
from .preflight import check_fits, check_n, check_output_file
from .prompts import read_prompts
from .records import write_report
from .speculative import generate
from .state_check import check_state
from .width import width_policy

# GateDef, DraftCheck, DTYPES and resolve_device live in gatekit, below this runner: the gates import them there.


@dataclass
class GateOptions:
    target: Path | None = None
    draft: Path | None = None
    device: str = "cpu"
    dtype: str = "f32"
    n: int | None = None
    prompts: Path | None = None
    json: Path | None = None
    oracle: bool = False
    max_prompts: int | None = None
    draft_options: dict[str, Any] = field(default_factory=dict)   # e.g. {"confidence_cut": 0.5}
    width: str = "fixed"                                          # verify width policy: fixed | cost
    draft_policy: str | None = None                               # auto | on | off (None: on with --draft, else auto)
    gpu_mem: str | None = None                                    # the plan's budget (default: the device's free)
    sampling: Any = None                                          # a sampling.Sampling (T > 0), None: greedy only
    reference_device: str = "cpu"                                 # where the f64 reference runs: cpu | cuda[:i]
    reference_compare: bool = False                               # also run it on the host; (r) line: worst rel
    draft_device: str | None = None                               # the draft on a device of its own (draft_device)
    tp: int = 1                                                   # the target split over tp processes (tp)
    record: Path | None = None                                    # the engine-agnostic record (engines.record)
    engine: str = "ours"                                          # ours | fast (the bench's engines: fast_engine)


def tensor_bytes(tensors) -> int:
    """Stored bytes of a spec's tensors, from the headers (no weight read)."""
    from .formats.lazy import stored_bytes

    return stored_bytes(tensors)


@contextmanager
def progress_bar(what: str, total: int):
    """A transient rich bar on a terminal; nothing at all when stdout is not a tty (CI logs, pipes)."""
    if not sys.stdout.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)


def run_gate(gate: GateDef, opts: GateOptions, emit: Callable[[str], None] | None = None) -> tuple[int, Report]:
    """Raises InputError before anything is printed past the header when the run cannot start (the reference
    device first: ``refdev.reference_selection``). Worker processes a ``--tp`` engine started are ended when the
    gate ends, passed, failed or raised (``tp.closing``)."""
    from bloomery_gates.reference.xp import select

    from .refdev import reference_selection
    from .tp import closing

    selection = reference_selection(opts.reference_device, opts.reference_compare)
    with closing(), select(selection):
        return _run_gate(gate, opts, emit, selection)


def _cost(report: Report, phases: dict[str, float], device: torch.device, selection: Any) -> None:
    """The reference's facts (and its compare line), then the cost line."""
    from .refdev import finish, peak_reference_bytes

    finish(report, selection)
    report.cost(phases, peak_host_rss_bytes(), peak_device_bytes(device),
                reference=(selection.device.name, selection.seconds, peak_reference_bytes(selection)))


def _run_gate(gate: GateDef, opts: GateOptions, emit: Callable[[str], None] | None,
              selection: Any) -> tuple[int, Report]:
    from bloomery_gates.gates.targets import check_target
    from bloomery_gates.reference.xp import run as on_reference
    from bloomery_gates.registry import FAMILIES

    from .draft_device import check_supported, parse_device
    from .tp import check_tp

    t0 = time.perf_counter()
    phases = Phases()                    # wall seconds per phase: each lap ends the phase before it
    device = resolve_device(opts.device)
    if opts.dtype not in DTYPES:
        raise InputError("--dtype", f"{opts.dtype!r}: expected one of {', '.join(DTYPES)}")
    unknown = sorted(set(opts.draft_options) - set(gate.options))
    if unknown:
        flag = "--" + unknown[0].replace("_", "-")
        raise InputError(flag, f"gate {gate.name} does not act on it (it takes: "
                               f"{', '.join('--' + k.replace('_', '-') for k in gate.options) or 'no draft options'})")
    if opts.sampling is not None and opts.sampling.draft_temperature is not None:
        from .sampling import check_sampleable
        check_sampleable(gate.name, gate.draft_kind)
    if opts.engine == "fast":
        from .fast_engine import check
        check(gate, opts.tp, opts.draft_device, opts.sampling)
    elif opts.engine != "ours":
        raise InputError("--engine", f"{opts.engine!r}: expected ours, fast or llama.cpp")
    draft_dev = None
    if opts.draft_device is not None:
        check_supported(gate.name, gate.family, gate.draft_kind)
        draft_dev = parse_device("--draft-device", opts.draft_device)
    n = check_n(gate.n if opts.n is None else opts.n)
    check_output_file(opts.json, "--json")
    check_output_file(opts.record, "--record")
    target_path, draft_path = Path(opts.target or gate.target), Path(opts.draft or gate.draft)
    target_spec = load_target(target_path)
    if target_spec.family != gate.family:
        raise InputError(target_path, f"is a {target_spec.family} target; gate {gate.name} needs {gate.family}")
    check_tp(opts.tp, target_spec, device, target_path)
    draft_spec = gate.load_draft(draft_path, target_spec)
    if opts.engine == "fast":
        from .fast_engine import check_draft
        check_draft(gate, draft_spec)
    prompts = read_prompts(Path(opts.prompts or gate.prompts), lambda: load_tokenizer(target_path), opts.max_prompts,
                           vocab=target_spec.vocab_size)
    longest = n if opts.sampling is None else max(n, sampled_length())      # the (s) runs may be longer than n
    longest = max(longest, gate.own_ids)                 # so may the gate's own checks (qwen3-eagle3's state run)
    check_fits(prompts, longest, gate.block(draft_spec), target_spec, draft_spec, DTYPES[opts.dtype], device)
    family = FAMILIES[gate.family]
    if opts.oracle and family.oracle is None:
        raise InputError("--oracle", f"no external oracle for family {gate.family}")
    decision = decide_draft(target_path, draft_path, opts.dtype, str(device),
                            policy_of(opts.draft_policy, opts.draft is not None), opts.gpu_mem)
    if not decision.on:
        return run_plain_only(gate, opts, family, target_spec, prompts, n, device, target_path, draft_path,
                              decision, t0, emit, selection)

    report = Report(gate.name, **({"emit": emit} if emit else {}))
    report.header(str(target_path), str(draft_path), str(device), opts.dtype, n, len(prompts))
    b = gate.block(draft_spec)
    max_len = max(len(p) for p in prompts) + longest + b + 1
    engine, tp_facts = build_engine(opts, family, target_spec, device, max_len, b, target_path)
    cross: dict[str, Any] = {}
    if opts.engine == "fast":
        draft = gate.make_fast_draft(draft_spec, engine, max_len, **opts.draft_options)
    elif draft_dev is None:
        draft = gate.make_draft(draft_spec, engine, max_len, **opts.draft_options)
    else:
        from .draft_device import bind
        draft, cross = bind(gate.make_draft, gate.draft_kind, draft_spec, engine, max_len, draft_dev,
                            **opts.draft_options)
    draft_spec = getattr(draft, "run_spec", draft_spec)    # a draft that binds a run option into its spec (mimo2-mtp)
    report.load(gate.draft_kind, resident=tensor_bytes(draft_spec.tensors) + cross.get("draft_shared_copy_bytes", 0),
                target_resident=tensor_bytes(target_spec.tensors), **gate.describe(draft_spec, **opts.draft_options),
                **decision.facts, **cross, **tp_facts, reference=selection.device.name)
    if decision.note:
        report.note(decision.note)
    for line in gate.anchors:
        report.note(line)
    phases.lap("load", device)

    # (r) the kernels against the float64 reference (on --reference-device), on the first prompt
    ref = on_reference(lambda: family.reference(target_spec, prompts[0]))
    phases.lap("reference", device)
    prefill = engine.prefill(prompts[0], logits=True)
    check_target(report, family, target_spec, prefill, ref, opts.dtype, prompts[0])
    gate.check_draft(report, DraftCheck(target_spec, draft_spec, engine, draft, prompts[0], prefill, ref, opts.dtype))
    phases.lap("checks", device)

    # (w) lossless: drafted ids == plain ids, per prompt
    per_prompt: list[Tally] = []
    all_same = True
    plain_runs, runs = [], []
    with progress_bar(f"{gate.name}: plain + drafted runs", len(prompts)) as advance:
        for i, p in enumerate(prompts):
            plain = generate(engine, None, p, n)
            plain_runs.append(plain.ids)
            try:
                drafted = generate(engine, draft, p, n, width=width_policy(opts.width, b))
            except (RuntimeError, ValueError, IndexError) as e:      # a broken loop or draft is a failed check
                all_same &= report.check(f"(w) prompt {i}: drafted run broke after the plain run: "
                                         f"{type(e).__name__}: {e}", False)
                continue
            finally:
                advance()
            all_same &= report.ids(i, plain.ids, drafted.ids)
            per_prompt.append(drafted.tally)
            runs.append((p, plain, drafted))
    pooled = Tally()
    for t in per_prompt:
        pooled = pooled.merge(t)
    phases.lap("runs", device)
    if opts.record is not None:
        from .engines.record import own_record, write
        write(own_record(gate.name, opts.dtype, opts.device, n, b - 1, runs), opts.record)
    report.branches(pooled)
    check_state(report, family, gate, engine, draft, target_spec, draft_spec, prompts[0], n,
                width_policy(opts.width, b), opts.dtype)
    phases.lap("state", device)
    if all_same:
        report.identical(n)
    if cross:
        report.crossing(pooled, draft.prompt_crossed)
    if opts.sampling is None:
        report.acceptance(pooled, per_prompt, b)
    else:
        sampled_part(report, engine, draft, prompts, n, opts, b, pooled)
        phases.lap("sampling", device)
    report.facts["width_policy"] = opts.width
    if opts.oracle:
        check_oracle(report, family, target_spec, prompts[0], plain_runs[0], prefill, opts.dtype)
        if gate.check_draft_oracle is not None:
            gate.check_draft_oracle(report, DraftCheck(target_spec, draft_spec, engine, draft, prompts[0],
                                                       prefill, ref, opts.dtype), plain_runs[0])
        phases.lap("oracle", device)
    _cost(report, phases.facts(), device, selection)
    code = report.finish()
    report.facts["wall_s"] = round(time.perf_counter() - t0, 3)
    if opts.json:
        write_report(opts.json, report.facts, report.lines, device)
    return code, report


def build_engine(opts: GateOptions, family, spec, device, max_len: int, rows: int | None,
                 target_path: Path) -> tuple[Any, dict[str, Any]]:
    """The target engine the run asked for: ours (split with --tp) or the bench's (``--engine fast``) -> (engine,
    load-line facts)."""
    if opts.engine == "fast":
        from .fast_engine import make_engine as make_fast
        return make_fast(family, spec, device, DTYPES[opts.dtype], max_len, rows)
    from .tp import make_engine
    return make_engine(family, spec, device, DTYPES[opts.dtype], max_len, rows, opts.tp, target_path)


def run_plain_only(gate: GateDef, opts: GateOptions, family, target_spec, prompts, n: int, device, target_path: Path,
                   draft_path: Path, decision, t0: float, emit, selection: Any) -> tuple[int, Report]:
    """The draft is off (the plan's rule, or asked off): the target's (r) checks and the plain runs only; no
    draft is built, and the report says so."""
    from bloomery_gates.gates.targets import check_target
    from bloomery_gates.reference.xp import run as on_reference

    report = Report(gate.name, **({"emit": emit} if emit else {}))
    report.header(str(target_path), str(draft_path), str(device), opts.dtype, n, len(prompts))
    max_len = max(len(p) for p in prompts) + n + 1
    engine, tp_facts = build_engine(opts, family, target_spec, device, max_len, None, target_path)
    report.load_off(decision.reason, target_resident=tensor_bytes(target_spec.tensors),
                    reference=selection.device.name, **tp_facts)
    report.note(f"draft off: plain-only checks (the target's (r) lines and {len(prompts)} plain runs of {n} ids); "
                "no (w), (b), state or acceptance lines")
    ref = on_reference(lambda: family.reference(target_spec, prompts[0]))
    prefill = engine.prefill(prompts[0], logits=True)
    check_target(report, family, target_spec, prefill, ref, opts.dtype, prompts[0])
    plain_runs = [generate(engine, None, p, n).ids for p in prompts]
    report.note(f"plain runs: {len(plain_runs)} prompts x {n} ids (no draft to compare them with)")
    if opts.oracle:
        check_oracle(report, family, target_spec, prompts[0], plain_runs[0], prefill, opts.dtype)
    _cost(report, {"all": time.perf_counter() - t0}, device, selection)
    code = report.finish()
    report.facts["wall_s"] = round(time.perf_counter() - t0, 3)
    if opts.json:
        write_report(opts.json, report.facts, report.lines, device)
    return code, report


def sampled_length() -> int:
    """The ids a (s) drafted run emits (``sampling_gate``)."""
    from .sampling_gate import PIT_POSITIONS, POSITIONS
    return max(POSITIONS, PIT_POSITIONS) + 1


def sampled_part(report: Report, engine, draft, prompts: list[list[int]], n: int, opts: GateOptions, b: int,
                 greedy: Tally) -> None:
    """T > 0: the greedy acceptance as a note, the sampling conditions, the (s) check on the first prompt, and
    accept_mean at T over every prompt (``sampling_gate``)."""
    from .sampling_gate import check_sampling, sampled_acceptance

    report.greedy_acceptance(greedy)
    report.sampling_conditions(opts.sampling.facts())
    check_sampling(report, engine, draft, prompts[0], opts.sampling, width_policy(opts.width, b))
    pooled, per_prompt = sampled_acceptance(engine, draft, prompts, n, opts.sampling, width_policy(opts.width, b))
    report.acceptance(pooled, per_prompt, b)


def check_oracle(report: Report, family, spec, prompt: list[int], plain_ids: list[int], prefill, dtype: str) -> None:
    """Tier 3: transformers' own modeling code, float64 on CPU, on the same weights: our reference's
    logits, the kernel's logits, and the plain run's greedy ids (teacher-forced) against it; for a GGUF
    target also llama.cpp's own graph on the file (``oracle_llamacpp``)."""
    from bloomery_gates.gates.targets import greedy_flips, to_np
    from bloomery_gates.reference.xp import run as on_reference

    from .bands import flip_excused, logits_band, worst_rel

    seq = prompt + plain_ids[:64]
    hf = family.oracle(spec, seq)
    ref = on_reference(lambda: family.reference(spec, seq))
    band = logits_band("f64", spec.layer, spec.num_layers, len(seq))
    w = worst_rel(ref.logits, hf)
    report.reference("host f64 logits", hf.size, w, band.value, tag="(o)", ref="transformers f64")
    kband = logits_band(dtype, spec.layer, spec.num_layers, len(seq))
    got = to_np(prefill.logits)
    w = worst_rel(got, hf[: len(prompt)])
    report.reference("kernel logits", got.size, w, kband.value, tag="(o)", ref="transformers f64")
    differ, excused = greedy_flips(got, hf[: len(prompt)], kband)
    report.integer_match("kernel greedy ids", len(prompt), differ, excused, tag="(o)", ref="transformers f64")
    # plain_ids[j] was the argmax after row P-1+j; transformers, teacher-forced on seq, must agree
    p, m = len(prompt), len(seq) - len(prompt)
    bad = [j for j in range(m) if int(hf[p - 1 + j].argmax()) != plain_ids[j]]
    excused = sum(flip_excused(hf[p - 1 + j], kband) for j in bad)
    report.integer_match("plain run greedy ids", m, len(bad), excused, tag="(o)", ref="transformers f64")
    from .oracle_llamacpp import check_target, is_gguf_target
    if is_gguf_target(spec):            # llama.cpp on the same GGUF, beside transformers (a note if not importable)
        check_target(report, spec, seq, ref.logits, p, plain_ids[:m])
