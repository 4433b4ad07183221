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

from bloomery_gates.dtypes import run_dtype
from bloomery_gates.errors import InputError

from .contract import Report
from .cost import Phases, peak_device_bytes, peak_host_rss_bytes
from .gatekit import DTYPES, OWN_ENGINES, DraftCheck, GateDef, resolve_device
from .loading import load_target, load_tokenizer
from .metrics import Tally
from .plan.core import parse_bytes
from .plan.decide import decide_draft, policy_of
from .preflight import check_fits, check_n, check_not_an_input, check_output_file
from .prompts import read_prompts
from .results.records import write_report
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
    oracle_where_exists: bool = False                             # --oracle on every gate: a family with no outside
                                                                  # oracle gets an (o) note, not exit 2
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

    from .parallel.tp import closing
    from .refdev import reference_selection

    selection = reference_selection(opts.reference_device, opts.reference_compare)
    with closing(), select(selection):
        return _run_gate(gate, opts, emit, selection)


def _cost(report: Report, phases: dict[str, float], device: torch.device, selection: Any) -> None:
    """The reference's facts (and its compare line), then the cost line."""
    from .refdev import finish, peak_reference_bytes

    finish(report, selection)
    report.cost(phases, peak_host_rss_bytes(), peak_device_bytes(device),
                reference=(selection.device.name, selection.seconds, peak_reference_bytes(selection)))


@dataclass
class Run:
    """What the stages of one gate run share: the inputs checked by ``prepare``, then what each stage adds."""

    gate: GateDef
    opts: GateOptions
    selection: Any                       # where the f64 reference runs (refdev)
    t0: float
    phases: Phases
    device: torch.device
    family: Any                          # the registry entry
    n: int
    longest: int                         # the most ids one run emits (n, the (s) runs, the gate's own checks)
    target_path: Path
    draft_path: Path
    target_spec: Any
    draft_spec: Any
    prompts: list[list[int]]
    decision: Any                        # gate_plan.decide_draft: is the draft on
    draft_dev: Any = None                # --draft-device, parsed
    report: Report | None = None
    engine: Any = None
    draft: Any = None
    cross: dict[str, Any] = field(default_factory=dict)
    ref: Any = None
    prefill: Any = None
    plain_runs: list[list[int]] = field(default_factory=list)
    runs: list[tuple] = field(default_factory=list)
    per_prompt: list[Tally] = field(default_factory=list)
    pooled: Tally = field(default_factory=Tally)
    all_same: bool = True

    @property
    def drafted(self) -> bool:
        return self.decision.on

    @property
    def b(self) -> int:
        return self.gate.block(self.draft_spec)

    def check(self) -> DraftCheck:
        return DraftCheck(self.target_spec, self.draft_spec, self.engine, self.draft, self.prompts[0], self.prefill,
                          self.ref, self.opts.dtype)


def prepare(gate: GateDef, opts: GateOptions, selection: Any) -> Run:
    """Every input checked, before any weight is read past the headers: exit 2 (``InputError``) on a bad one."""
    from bloomery_gates.registry import FAMILIES

    from .parallel.draft_device import check_supported, parse_device
    from .parallel.tp import check_tp

    t0 = time.perf_counter()
    device = resolve_device(opts.device)
    run_dtype(opts.dtype)
    unknown = sorted(set(opts.draft_options) - set(gate.options))
    if unknown:
        flag = "--" + unknown[0].replace("_", "-")
        raise InputError(flag, f"gate {gate.name} does not act on it (it takes: "
                               f"{', '.join('--' + k.replace('_', '-') for k in gate.options) or 'no draft options'})")
    if opts.sampling is not None and opts.sampling.draft_temperature is not None:
        from .sampling.rule import check_sampleable
        check_sampleable(gate.name, gate.draft_kind)
    if opts.engine == "fast":
        from .fast_engine import check
        check(gate, opts.tp, opts.draft_device, opts.sampling)
    elif opts.engine not in OWN_ENGINES:
        raise InputError("--engine", f"{opts.engine!r}: expected {', '.join(OWN_ENGINES)} or llama.cpp")
    draft_dev = None
    if opts.draft_device is not None:
        check_supported(gate.name, gate.family, gate.draft_kind)
        draft_dev = parse_device("--draft-device", opts.draft_device)
    n = check_n(gate.n if opts.n is None else opts.n)
    check_output_file(opts.json, "--json")
    check_output_file(opts.record, "--record")
    if opts.gpu_mem is not None:
        parse_bytes(opts.gpu_mem)                 # the budget's spelling, refused here rather than as a plan note
    target_path, draft_path = Path(opts.target or gate.target), Path(opts.draft or gate.draft)
    inputs = [target_path, draft_path, Path(opts.prompts or gate.prompts)]
    check_not_an_input(opts.json, "--json", inputs + [opts.record])
    check_not_an_input(opts.record, "--record", inputs)
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
    if opts.oracle and family.oracle is None and not opts.oracle_where_exists:
        raise InputError("--oracle", f"no external oracle for family {gate.family}")
    decision = decide_draft(target_path, draft_path, opts.dtype, str(device),
                            policy_of(opts.draft_policy, opts.draft is not None), opts.gpu_mem)
    return Run(gate, opts, selection, t0, Phases(), device, family, n, longest, target_path, draft_path, target_spec,
               draft_spec, prompts, decision, draft_dev)


def build(run: Run, emit: Callable[[str], None] | None) -> None:
    """The header and the load line; the target engine and (drafted) the draft on its device."""
    gate, opts = run.gate, run.opts
    run.report = report = Report(gate.name, **({"emit": emit} if emit else {}))
    report.header(str(run.target_path), str(run.draft_path), str(run.device), opts.dtype, run.n, len(run.prompts))
    b = run.b if run.drafted else None
    max_len = max(len(p) for p in run.prompts) + (run.longest + run.b + 1 if run.drafted else run.n + 1)
    run.engine, tp_facts = build_engine(opts, run.family, run.target_spec, run.device, max_len, b, run.target_path)
    target_resident = tensor_bytes(run.target_spec.tensors)
    if not run.drafted:
        report.load_off(run.decision.reason, target_resident=target_resident,
                        reference=run.selection.device.name, **tp_facts)
        report.note(f"draft off: plain-only checks (the target's (r) lines and {len(run.prompts)} plain runs of "
                    f"{run.n} ids); no (w), (b), state or acceptance lines")
        return
    if opts.engine == "fast":
        run.draft = gate.make_fast_draft(run.draft_spec, run.engine, max_len, **opts.draft_options)
    elif run.draft_dev is None:
        run.draft = gate.make_draft(run.draft_spec, run.engine, max_len, **opts.draft_options)
    else:
        from .parallel.draft_device import bind
        run.draft, run.cross = bind(gate.make_draft, gate.draft_kind, run.draft_spec, run.engine, max_len,
                                    run.draft_dev, **opts.draft_options)
    run.draft_spec = getattr(run.draft, "run_spec", run.draft_spec)  # a draft binding a run option (mimo2-mtp)
    report.load(gate.draft_kind,
                resident=tensor_bytes(run.draft_spec.tensors) + run.cross.get("draft_shared_copy_bytes", 0),
                target_resident=target_resident, **gate.describe(run.draft_spec, **opts.draft_options),
                **run.decision.facts, **run.cross, **tp_facts, reference=run.selection.device.name)
    if run.decision.note:
        report.note(run.decision.note)
    for line in gate.anchors:
        report.note(line)


def build_engine(opts: GateOptions, family, spec, device, max_len: int, rows: int | None,
                 target_path: Path) -> tuple[Any, dict[str, Any]]:
    """The target engine the run asked for: ours (split with --tp) or the bench's (``--engine fast``) -> (engine,
    load-line facts)."""
    if opts.engine == "fast":
        from .fast_engine import make_engine as make_fast
        return make_fast(family, spec, device, DTYPES[opts.dtype], max_len, rows)
    from .parallel.tp import make_engine
    return make_engine(family, spec, device, DTYPES[opts.dtype], max_len, rows, opts.tp, target_path)


def check_reference(run: Run) -> None:
    """(r): the kernels against the float64 reference (on --reference-device), on the first prompt."""
    from bloomery_gates.gates.targets import check_target
    from bloomery_gates.reference.xp import run as on_reference

    run.ref = on_reference(lambda: run.family.reference(run.target_spec, run.prompts[0]))
    run.phases.lap("reference", run.device)
    run.prefill = run.engine.prefill(run.prompts[0], logits=True)
    check_target(run.report, run.family, run.target_spec, run.prefill, run.ref, run.opts.dtype, run.prompts[0])
    if run.drafted:
        run.gate.check_draft(run.report, run.check())


def plain_and_drafted(run: Run) -> None:
    """(w) lossless: drafted ids == plain ids, per prompt (plain-only: the plain runs)."""
    gate, report, n = run.gate, run.report, run.n
    if not run.drafted:
        run.plain_runs = [generate(run.engine, None, p, n).ids for p in run.prompts]
        report.note(f"plain runs: {len(run.plain_runs)} prompts x {n} ids (no draft to compare them with)")
        return
    width = width_policy(run.opts.width, run.b)
    with progress_bar(f"{gate.name}: plain + drafted runs", len(run.prompts)) as advance:
        for i, p in enumerate(run.prompts):
            plain = generate(run.engine, None, p, n)
            run.plain_runs.append(plain.ids)
            try:
                drafted = generate(run.engine, run.draft, p, n, width=width)
            except (RuntimeError, ValueError, IndexError) as e:      # a broken loop or draft is a failed check
                run.all_same &= report.check(f"(w) prompt {i}: drafted run broke after the plain run: "
                                             f"{type(e).__name__}: {e}", False)
                continue
            finally:
                advance()
            run.all_same &= report.ids(i, plain.ids, drafted.ids)
            run.per_prompt.append(drafted.tally)
            run.runs.append((p, plain, drafted))
    for t in run.per_prompt:
        run.pooled = run.pooled.merge(t)
    if run.opts.record is not None:
        from .engines.record import own_record, write
        write(own_record(gate.name, run.opts.dtype, run.opts.device, n, run.b - 1, run.runs), run.opts.record)
    report.branches(run.pooled)


def state(run: Run) -> None:
    """The engine's and the draft's state after the loop (state_check), its fresh runs with the kernel's
    choices (routing_flips)."""
    from bloomery_gates.gates.routing_flips import state_choices

    check_state(run.report, run.family, run.gate, run.engine, run.draft, run.target_spec, run.draft_spec,
                run.prompts[0], run.n, width_policy(run.opts.width, run.b), run.opts.dtype, state_choices)


def acceptance(run: Run) -> None:
    """ids identical, the draft device's crossing, accept_mean (greedy, or at T > 0 with the (s) check)."""
    report = run.report
    if run.all_same:
        report.identical(run.n)
    if run.cross:
        report.crossing(run.pooled, run.draft.prompt_crossed)
    rederived(report, [r[2] for r in run.runs], run.pooled)
    if run.opts.sampling is None:
        report.acceptance(run.pooled, run.per_prompt, run.b)
    else:
        sampled_part(report, run.engine, run.draft, run.prompts, run.n, run.opts, run.b, run.pooled)
        run.phases.lap("sampling", run.device)
    report.facts["width_policy"] = run.opts.width


def oracles(run: Run) -> None:
    """Tier 3 (--oracle): transformers / llama.cpp on the target, the gate's own draft oracle."""
    if run.family.oracle is None:          # only with oracle_where_exists (prepare refuses a single --oracle run)
        run.report.note(f"(o) none: no outside code runs family {run.family.key}; the float64 reference is the "
                        "only check of target and draft")
        return
    check_oracle(run.report, run.family, run.target_spec, run.prompts[0], run.plain_runs[0], run.prefill,
                 run.opts.dtype)
    if run.drafted and run.gate.check_draft_oracle is not None:
        run.gate.check_draft_oracle(run.report, run.check(), run.plain_runs[0])


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: the phase its wall time is booked to (None: to the next phase booked), whether it
    needs the draft, and whether the run asked for it."""

    phase: str | None
    step: Callable[[Run], None]
    drafted_only: bool = False
    when: Callable[[Run], bool] = lambda run: True


# The one pipeline: a plain-only run (the draft off by the plan's rule, or asked off) is the same list minus the
# stages that need the draft; the stages themselves print nothing about a draft they do not have.
PIPELINE = (Stage("checks", check_reference), Stage("runs", plain_and_drafted),
            Stage("state", state, drafted_only=True), Stage(None, acceptance, drafted_only=True),
            Stage("oracle", oracles, when=lambda run: run.opts.oracle))


def _run_gate(gate: GateDef, opts: GateOptions, emit: Callable[[str], None] | None,
              selection: Any) -> tuple[int, Report]:
    run = prepare(gate, opts, selection)
    build(run, emit)
    run.phases.lap("load", run.device)
    for stage in PIPELINE:
        if (stage.drafted_only and not run.drafted) or not stage.when(run):
            continue
        stage.step(run)
        if stage.phase is not None:
            run.phases.lap(stage.phase, run.device)
    report = run.report
    _cost(report, run.phases.facts(), run.device, selection)
    code = report.finish()
    report.facts["wall_s"] = round(time.perf_counter() - run.t0, 3)
    if opts.json:
        write_report(opts.json, report.facts, report.lines, run.device)
    return code, report


def sampled_length() -> int:
    """The ids a (s) drafted run emits (``sampling_gate``)."""
    from .sampling.gate import PIT_POSITIONS, POSITIONS
    return max(POSITIONS, PIT_POSITIONS) + 1


def sampled_part(report: Report, engine, draft, prompts: list[list[int]], n: int, opts: GateOptions, b: int,
                 greedy: Tally) -> None:
    """T > 0: the greedy acceptance as a note, the sampling conditions, the (s) check on the first prompt, and
    accept_mean at T over every prompt (``sampling_gate``)."""
    from .sampling.gate import check_sampling, sampled_acceptance
    from .sampling.replay import check_replay

    report.greedy_acceptance(greedy)
    report.sampling_conditions(opts.sampling.facts())
    check_sampling(report, engine, draft, prompts[0], opts.sampling, width_policy(opts.width, b))
    report.sampling_replay(check_replay(engine, draft, prompts, n, opts.sampling, width_policy(opts.width, b), b))
    pooled, per_prompt, runs = sampled_acceptance(engine, draft, prompts, n, opts.sampling,
                                                  width_policy(opts.width, b))
    rederived(report, runs, pooled)
    report.acceptance(pooled, per_prompt, b)


def rederived(report: Report, runs: list, pooled: Tally) -> bool:
    """(a) the acceptance figures re-derived from the runs' emitted ids and window boundaries (``acceptance_check``)."""
    from .acceptance_check import compare

    got, differ = compare(runs, pooled)
    return report.acceptance_rederived(len(runs), len(got.kept), got.ids, differ)


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
    from .oracle.llamacpp import check_target, is_gguf_target
    if is_gguf_target(spec):            # llama.cpp on the same GGUF, beside transformers (a note if not importable)
        (family.oracle_llamacpp or check_target)(report, spec, seq, ref.logits, p, plain_ids[:m])
