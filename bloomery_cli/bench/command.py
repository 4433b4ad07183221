"""``bloomery bench NAME``: decode speed on the device, against the bandwidth roofline and HF transformers.

    bloomery bench qwen3-dflash --shape qwen3-8b --device cuda          (random bf16 weights made on the device)
    bloomery bench qwen3-dflash                                          (the gate's checkpoints: its fixtures)

One run reports, each figure with its conditions (device, dtype, prompt length, batch 1, width policy):
- copy bandwidth (a device copy of a large buffer, read + write counted) and the roofline tok/s = bandwidth /
  weight bytes (every weight read once per step; ``roofline_read`` counts only the bytes a step reads);
- plain decode tok/s (the loop with no draft, one row a pass, CUDA-graph passes) over the roofline;
- the cost of a verify of R rows, R = 1..B, relative to one plain step (graph replays, device events);
- the DFlash draft's cost per block and per context extension at its real shape;
- drafted tok/s over a sweep of synthetic acceptance: a replay draft runs the real draft (its cost) and then
  proposes the target's own continuation (made first, at the drafted width), each proposal kept with
  probability a; tau = E(kept) = sum_{j<B} a^j. Speedup = plain time per id / drafted time per id, prefill
  excluded. At tau = 6 the bench says whether drafted >= 0.85 x accept_mean x plain (issue 11's criterion;
  reported, not asserted);
- the cost width policy at acceptance near 0 and near 1 (which widths it picked);
- HF transformers' eager ``generate`` on the same tensors in the same process, and our ratio to it;
- with ``--llama-cpp DIR``: llama.cpp's llama-bench on the same weights at the same depth and n (``bench_llamacpp``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from bloomery_gates.errors import InputError

from ..gatekit import resolve_device
from ..preflight import check_output_file
from ..results.records import conditions, write_atomic
from ..threads import Threads, apply_threads
from ..width import CostWidth, width_policy
from .accept import device_ok, measured_row
from .chain import host_share
from .common import (
    DTYPES,
    TAUS,
    ReplayDraft,
    accept_for_tau,
    criterion_bound,
    first_engine,
    guarded,
    hf_compare,
    padded_reference,
    plain_row,
    roofline,
    stages,
    sync,
    timed_generate,
    verify_costs,
)
from .dflash2 import copy_bandwidth
from .flags import DEFAULT_MTP_WIDTH, check_bench_flags, is_oom
from .hybrid import bench_hybrid
from .hybrid_shapes import HYBRID_SHAPES
from .llamacpp import LLAMA_CPP_HELP, compare, find_llama_bench
from .moe import bench_moe, plot_moe
from .moe_draft_shapes import parse_drafts
from .moe_shapes import MOE_SHAPES
from .shapes import SHAPES, random_pair, read_per_step, weight_bytes
from .sweep import Point, run_sweep

# the pieces the benches share (bench_hybrid, results_table) are in bench_common
HYBRID_NAMES = ("qwen38-dflash2", "qwen38-mtp")


def build_engines(tspec, dspec, dev, dtype, max_len: int, b: int, log, graphs: bool = True, impl: str = "auto"):
    """(target, draft, mode) with the fastest path that runs: Triton ops + graphs, torch ops + graphs, eager."""
    from bloomery_gates.kernels.drafts.dflash import FastDFlashDraft
    from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target

    taps = tuple(l + 1 for l in dspec.target_layer_ids) if dspec is not None else None
    tries = [(impl, graphs), ("torch", graphs), ("torch", False)] if dev.type == "cuda" else [("torch", False)]

    def build(im, gr):
        t = FastQwen3Target(tspec, dev, dtype, max_len, max_width=b, tap_ids=taps, graphs=gr, impl=im)
        d = FastDFlashDraft(dspec, t, max_len, graphs=gr) if dspec is not None else None
        first = t.prefill([1, 2, 3])
        if d is not None:
            d.prompt(first.taps)
        t0 = time.perf_counter()
        t.capture(range(1, b + 1))
        if d is not None:
            d.capture(first.argmax[-1])
            d.propose(first.argmax[-1])
            d.accept(1, t.verify([first.argmax[-1]]).taps)
        sync(dev)
        return t, d, f"ops={t.ops.name} graphs={'on' if t.graphs.enabled else 'off'}", time.perf_counter() - t0

    return first_engine(tries, build, lambda p: f"ops={p[0]} graphs={p[1]}", dev, log)


def bench(name: str, shape: str | None = None, device: str = "auto", dtype: str = "bf16", prompt_len: int = 512,
          n: int = 256, width: str = "fixed", taus=TAUS, hf_tokens: int = 32, iters: int | None = None,
          emit=print, quiet: bool = False, save=lambda rec: None, profile: bool = False,
          llama_bench: Path | None = None) -> dict[str, Any]:
    """Run the bench; ``save(rec)`` is called with the record so far after each stage (a run cut short still
    leaves what it measured). ``llama_bench``: also llama.cpp's plain decode (``bench_llamacpp.compare``)."""
    dev = resolve_device("cuda" if device == "auto" and torch.cuda.is_available() else
                         ("cpu" if device == "auto" else device))
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    dt = DTYPES[dtype]
    iters = iters or (20 if dev.type == "cuda" else 3)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        emit(line)

    rec: dict[str, Any] = {"bench": name, "shape": shape or "checkpoint", "complete": False, "lines": lines}
    cond = {"device": str(dev), "dtype": dtype, "prompt_len": prompt_len, "batch": 1, "width": width, "n": n}
    with stages(11 + (shape is None) + profile + (llama_bench is not None), quiet) as step:
        step("bandwidth")
        bw = copy_bandwidth(dev, (2 << 30) if dev.type == "cuda" else (1 << 26))
        step("weights")
        t0 = time.perf_counter()
        tspec, dspec, prompt = _load(name, shape, dev, dt, prompt_len)
        cond["prompt_len"] = prompt_len = len(prompt)
        sync(dev)
        wb = weight_bytes(tspec.tensors)
        read = read_per_step(tspec)
        b = dspec.block_size
        log(f"bench {name} shape={shape or tspec.source} device={dev} device_name={conditions(dev)['device_name']!r} "
            f"dtype={dtype} prompt_len={prompt_len} batch=1 width={width} n={n} block={b}")
        log(f"weights bytes={wb} read_per_step={read} made_s={time.perf_counter() - t0:.1f} "
            f"draft_bytes={weight_bytes(dspec.tensors)} draft_layers={dspec.num_layers} "
            f"target_layers={list(dspec.target_layer_ids)}")
        roof = roofline(bw, wb, read, log)
        step("capture")
        max_len = prompt_len + n + 4 * b
        target, draft, mode = build_engines(tspec, dspec, dev, dt, max_len, b, log)
        cond["engine"] = mode
        rec.update(conditions=conditions(dev) | cond, bandwidth=roof, weights={"bytes": wb, "read_per_step": read})

        step("plain decode")
        plain, plain_tok_s = timed_generate(target, None, prompt, n)
        rec["plain"] = plain_row(plain, plain_tok_s, roof, log)
        step("host share")
        guarded(rec, "host", log, lambda: host_share(target, prompt, plain.ids, 1e3 / plain_tok_s, iters=iters,
                                                     log=log, roofline_read_tok_s=roof["roofline_read_tok_s"]))
        if llama_bench is not None:
            step("llama.cpp")
            compare(rec, llama_bench, tspec, dtype, prompt_len, n, dev, log)

        step("verify widths")
        save(rec)
        rec["verify"] = verify_costs(target, prompt, b, iters, log)
        step("draft cost")
        rec["draft"] = _draft_costs(target, draft, prompt, b, iters, rec["verify"][0]["ms"], log)
        rec["bound"] = criterion_bound(rec["verify"], b, weight_bytes(dspec.tensors) +
                                       weight_bytes({"head": tspec.head_weight()}), roof["copy_GBps"], log)
        if profile:
            from .profile import profile_engine

            step("profile")
            rec["profile"] = profile_engine(target, draft, prompt, rec["verify"], rec["draft"]["block_ms"],
                                            roof["copy_GBps"], log)

        step("reference")
        ref = padded_reference(target, prompt, n, b, plain, rec, log)

        save(rec)
        step("acceptance sweep")
        rec["sweep"] = []
        points = [_point(t, b) for t in taus if t <= b]
        guarded(rec, "sweep_run", log, lambda: run_sweep(target, draft, ref, prompt, n, width, b, points,
                                                         plain_tok_s, rec, log, save, profile))
        step("transformers")
        rec["hf"] = hf_compare(tspec, target, dev, prompt, hf_tokens, plain, plain_tok_s, log)
        save(rec)
        step("cost policy")
        guarded(rec, "cost_policy", log, lambda: _cost_policy(target, draft, ref, prompt, n, b, log))
        if shape is None:
            step("measured acceptance")
            guarded(rec, "measured", log,
                    lambda: _measured(target, draft, prompt, n, plain, ref, plain_tok_s, width, b, log))
            if width == "fixed" and "measured" in rec:
                guarded(rec, "device_measured", log, lambda: measured_row(target, draft, prompt, n, b, plain.ids,
                                                                          plain_tok_s, rec["measured"], log))
    rec["complete"] = True
    save(rec)
    return rec


def _point(tau: float, b: int) -> Point:
    """The sweep's point at nominal tau (a = ``accept_for_tau``), the criterion at tau = 6."""
    a = accept_for_tau(tau, b)
    return Point(a, tau, int(tau * 100), f"tau={tau:g} a={a:.4f}", "tau=6" if tau == 6.0 else None)


def _cost_policy(target, draft, ref, prompt, n, b, log) -> list[dict[str, Any]]:
    """The cost width policy with acceptance near 0 and near 1: which widths it ran."""
    out = []
    for a in (0.02, 0.98):
        pol = CostWidth(b)
        run, tok_s = timed_generate(target, ReplayDraft(draft, ref.ids, a, target.spec.vocab_size, 7), prompt, n, pol)
        hist = pol.histogram()
        top = max(range(b), key=lambda i: hist[i]) + 1
        same = run.ids == ref.ids[:n]
        out.append({"a": a, "tok_s": tok_s, "widths": hist, "most_chosen": top, "ids_identical": same})
        log(f"width_cost a={a} most_chosen={top} widths={hist} tok_s={tok_s:.1f} ids_identical={same}")
    return out


def _load(name: str, shape: str | None, dev, dt, prompt_len: int):
    if shape is not None:
        if shape not in SHAPES:
            raise ValueError(f"--shape {shape!r}: expected one of {', '.join(SHAPES)}")
        if name != "qwen3-dflash":
            raise ValueError(f"--shape runs the qwen3-dflash pair (the DFlash drafter at the shape's size), "
                             f"not {name!r}")
        tspec, dspec = random_pair(SHAPES[shape], dev, dt)
        gen = torch.Generator().manual_seed(1)
        return tspec, dspec, torch.randint(0, tspec.vocab_size, (prompt_len,), generator=gen).tolist()
    from bloomery_gates.gates import GATES

    from ..loading import load_target, load_tokenizer
    from ..prompts import read_prompts

    if name not in GATES:
        raise ValueError(f"gate {name!r}: unknown; registered gates: {', '.join(sorted(GATES))}")
    g = GATES[name]
    if g.draft_kind != "dflash":
        raise ValueError(f"the checkpoint bench runs DFlash pairs; {name} drafts with {g.draft_kind}")
    tspec = load_target(g.target)
    dspec = g.load_draft(g.draft, tspec)
    prompt = read_prompts(g.prompts, lambda: load_tokenizer(g.target), 1)[0]
    return tspec, dspec, prompt


def _draft_costs(target, draft, prompt, b, iters, step_ms, log) -> dict[str, Any]:
    from bloomery_gates.kernels.graphs import time_replays

    first = target.prefill(prompt)
    draft.prompt(first.taps)
    draft.inp.put([draft.ctx_len, first.argmax[-1]])
    block = time_replays(lambda: draft.propose_graph.run(0), target.device, iters) * 1e3
    draft.ext.put([draft.ctx_len])
    ext = time_replays(lambda: draft.extend_graphs.run(b), target.device, iters) * 1e3
    log(f"draft block_ms={block:.3f} extend_ms={ext:.3f} rel_plain_step={(block + ext) / step_ms:.3f} "
        f"layers={draft.spec.num_layers} block={b}")
    return {"block_ms": block, "extend_ms": ext, "rel_plain_step": (block + ext) / step_ms}


def _measured(target, draft, prompt, n, plain, ref, plain_tok_s, width, b, log) -> dict[str, Any]:
    """The real draft at its measured acceptance; ids against the plain run (width 1) and against the plain
    run padded to the drafted width (equal by construction under the fixed policy: same shapes)."""
    run, tok_s = timed_generate(target, draft, prompt, n, width_policy(width, b))
    out = {"accept_mean": run.tally.accept_mean, "tok_s": tok_s, "speedup": tok_s / plain_tok_s,
           "draft_share": run.tally.draft_share, "ids_identical": run.ids == plain.ids,
           "ids_identical_padded": run.ids == ref.ids[:n]}
    log(f"measured accept_mean={out['accept_mean']:.3f} tok_s={tok_s:.1f} speedup={out['speedup']:.2f} "
        f"draft_share={out['draft_share']:.3f} ids_identical_plain={out['ids_identical']} "
        f"ids_identical_padded={out['ids_identical_padded']}")
    return out


def bench_command(
        name: Annotated[str, typer.Argument(help="Gate name (the pair); with --shape: qwen3-dflash, or for a hybrid "
                                            "shape qwen38-dflash2 / qwen38-mtp.")],
        shape: Annotated[str | None, typer.Option("--shape", help=f"Random weights of a model shape made on the "
                         f"device: {', '.join([*SHAPES, *HYBRID_SHAPES, *MOE_SHAPES])} (default: the gate's "
                         "checkpoints).")] = None,
        device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:<i>.")] = "auto",
        dtype: Annotated[str, typer.Option("--dtype", help="bf16, f16 or f32.")] = "bf16",
        prompt_len: Annotated[int | None, typer.Option("--prompt-len", help="Prompt length (--shape; default "
                                                       "512).")] = None,
        n: Annotated[int, typer.Option("-n", help="Ids decoded per run.")] = 256,
        json: Annotated[Path | None, typer.Option("--json", help="Write the record here, atomically.")] = None,
        width: Annotated[str, typer.Option("--width", help="Width policy of the drafted runs: fixed or cost.")]
        = "fixed",
        layers: Annotated[int | None, typer.Option("--layers", help="Hybrid shapes: run only the first N layers "
                                                   "(real width, fewer layers) (default: all).")] = None,
        block: Annotated[int | None, typer.Option("--block", help="qwen38-dflash2: the drafter's block B "
                                                  "(default: 8).")] = None,
        mtp_width: Annotated[int | None, typer.Option("--mtp-width", help="qwen38-mtp: chained drafts per window "
                                                      "(default 3).")] = None,
        hf: Annotated[bool, typer.Option("--hf", help="Hybrid shapes: also HF transformers' Qwen3_5ForCausalLM "
                                         "eager generate on the same weights.")] = False,
        threads: Threads = None,
        profile: Annotated[bool, typer.Option("--profile", help="Also where a plain step, the widest verify and "
                                              "the draft's block spend their time: kernels by device time, each "
                                              "matrix product's read rate (bloomery_cli/bench/profile.py).")]
        = False,
        llama_cpp: Annotated[Path | None, typer.Option("--llama-cpp", help=LLAMA_CPP_HELP)] = None,
        rows: Annotated[int, typer.Option("--rows", help="moe: verify widths 1..ROWS.")] = 16,
        reps: Annotated[int, typer.Option("--reps", help="moe: timed verifies per width (median).")] = 5,
        drafts: Annotated[str | None, typer.Option("--drafts", help="moe: the real drafts to run in the drafted "
                          "loop over the synthetic acceptance sweep and the cost policy, a comma list of mtp, dflash "
                          "(qwen35moe: mtp,dflash; mimo2: mtp), or none (default: every draft the shape has).")]
        = None,
        drafted_n: Annotated[int | None, typer.Option("--drafted-n", help="moe: ids per drafted run (1..-n; "
                             "default min(32, -n)).")] = None) -> None:
    """Decode speed against the roofline and HF transformers; drafted speed over synthetic acceptance.

    Engine settings from the environment, named in the record (conditions.knobs): BLOOMERY_PDL=off (programmatic
    dependent launch in the graphed passes, CUDA sm_90+, is on by default: on,early,l2=4; docs/SPEED.md),
    BLOOMERY_GEMV=off (every projection on cuBLAS), BLOOMERY_GEMV_CONFIGS=FILE (the projection kernel's tiles)."""
    if width not in ("fixed", "cost"):
        raise typer.BadParameter(f"{width!r}: expected fixed or cost", param_hint="--width")

    def save(rec: dict) -> None:
        if json:
            write_atomic(json, rec)

    try:
        moe = shape in MOE_SHAPES or name == "moe"
        hybrid = not moe and (shape in HYBRID_SHAPES or name in HYBRID_NAMES)
        if moe and hf:
            raise InputError("--hf", f"does not act on `bench {name}` (the MoE bench has no HF comparison)")
        prompt_len = check_bench_flags(name, shape, hybrid or moe, prompt_len, n, layers, block, mtp_width, hf)
        if not moe and (drafts is not None or drafted_n is not None):
            raise InputError("--drafts" if drafts is not None else "--drafted-n", f"does not act on `bench {name}` "
                             "(the MoE bench's drafted runs only)")
        kinds = parse_drafts(drafts, shape) if moe and shape in MOE_SHAPES else ()
        check_output_file(json, "--json")          # before the run, not after it
        peer = find_llama_bench(llama_cpp) if llama_cpp is not None else None
        apply_threads(threads, device)
        if moe:
            if shape not in MOE_SHAPES:
                raise ValueError(f"{name}: the MoE bench needs --shape ({', '.join(MOE_SHAPES)})")
            rec = bench_moe(shape, device, dtype, layers, prompt_len, n, rows, reps, drafts=kinds, drafted_n=drafted_n)
            save(rec)
            if json:
                plot_moe(json.with_name("plot-" + json.stem + ".png"), [rec], [])
            if not all(rec["checks"].values()):
                typer.echo("FAILED: a MoE bench check failed: " + ", ".join(k for k, v in rec["checks"].items()
                                                                           if not v), err=True)
                raise typer.Exit(1)
            return
        if hybrid:
            if shape is None:
                raise ValueError(f"{name}: the hybrid bench needs --shape ({', '.join(HYBRID_SHAPES)})")
            rec = bench_hybrid(name, shape, device, dtype, prompt_len, n, layers, block,
                               mtp_width or DEFAULT_MTP_WIDTH, width, hf,
                               quiet=json is not None, save=save, profile=profile, llama_bench=peer)
            if not rec.get("ids_identical_all"):
                typer.echo("FAILED: a drafted run's ids differ from the plain run's (or no drafted run finished)",
                           err=True)
                raise typer.Exit(1)
            if not rec.get("host", {}).get("ids_identical_all"):     # the chained plain decode, as below
                typer.echo("FAILED: the chained plain decode's ids differ from the plain run's (or it did not run)",
                           err=True)
                raise typer.Exit(1)
            _device_verdict(rec)
            return
        rec = bench(name, shape, device, dtype, prompt_len, n, width, quiet=json is not None, save=save,
                    profile=profile, llama_bench=peer)
        if not rec.get("host", {}).get("ids_identical_all"):         # fails closed: a chain that did not run too
            typer.echo("FAILED: the chained plain decode's ids differ from the plain run's (or it did not run)",
                       err=True)
            raise typer.Exit(1)
        _device_verdict(rec)
    except (ValueError, InputError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (MemoryError, RuntimeError) as e:    # torch's CPU allocator refuses with a plain RuntimeError
        if not is_oom(e):
            raise
        typer.echo(f"error: --prompt-len {prompt_len} -n {n}: out of memory on {device} "
                   f"({' '.join(str(e).split())[:160]})", err=True)
        raise typer.Exit(2) from None


def _device_verdict(rec: dict) -> None:
    """Exit 1 unless the device-accept loop ran every drafted row with the reference's ids (``bench.accept``)."""
    if not device_ok(rec):
        typer.echo("FAILED: a device-accept drafted run's ids differ from the plain run's (or it did not run)",
                   err=True)
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    from ..helptext import reflow

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(bench_command)
    reflow(app)
    app(argv)


if __name__ == "__main__":
    main()
