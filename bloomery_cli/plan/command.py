"""The ``bloomery plan`` command: arguments -> ``plan.make_plan`` -> a table (or JSON); ``--measure`` runs the real
engine at ``--ctx`` and puts the measured peak beside the planned bytes (``plan_measure``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bloomery_gates.errors import InputError

from ..exits import fail_input


def plan_command(
        target: Annotated[Path | None, typer.Argument(help="Target checkpoint: HF dir or *.gguf (or use --shape).")]
        = None,
        draft: Annotated[Path | None, typer.Option("--draft", help="Drafter checkpoint (HF dir; the target file "
                                                    "itself for its in-file MTP).")] = None,
        shape: Annotated[str | None, typer.Option("--shape", help="A bench shape instead of files: qwen3-8b, "
                                                   "qwen3-4b, qwen38-27b, tiny (with its draft).")] = None,
        gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="Memory budget in bytes (80G, 24GiB, ...) "
                                                     "(default: the device's free memory).")] = None,
        ctx: Annotated[int | None, typer.Option("--ctx", help="Also print every term at this context per slot.")]
        = None,
        slots: Annotated[int, typer.Option("--slots", help="Slots (sequences) sharing the budget.")] = 1,
        dtype: Annotated[str, typer.Option("--dtype", help="Run dtype: f32, bf16, f16.")] = "bf16",
        device: Annotated[str, typer.Option("--device", help="cpu or cuda (the host holds a tied head once).")]
        = "cuda",
        ctx_base: Annotated[int, typer.Option("--ctx-base", help="The ctx-first rule's base.")] = 4096,
        draft_policy: Annotated[str, typer.Option("--draft-policy", help="auto (the rule decides), on, off.")]
        = "auto",
        paged: Annotated[bool, typer.Option("--paged", help="A paged plan (turns an unset draft off).")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
        measure: Annotated[bool, typer.Option("--measure", help="Run the engine at --ctx on --device and record the "
                                               "measured peak beside the planned bytes.")] = False,
        record: Annotated[Path | None, typer.Option("--record", help="With --measure: write the record here.")]
        = None,
) -> None:
    """Context / memory plan from headers alone, the draft as one term (no weight byte read).

    Target weights, KV / recurrent state per slot, the draft, the largest context per slot with and without the
    draft, and the ctx-first rule's decision with its reason."""
    from .core import budget_of, make_plan, render, to_json

    out = Console()
    try:
        if (target is None) == (shape is None):
            raise InputError("plan", "expected a TARGET path or --shape NAME (one of them)")
        if ctx_base < 1:
            raise InputError("--ctx-base", f"{ctx_base}: expected at least one position")
        dev = "cpu" if device == "cpu" else "cuda" if device.startswith("cuda") else None
        if dev is None:
            raise InputError("--device", f"{device!r}: expected cpu or cuda")
        if measure and ctx is None:
            raise InputError("--measure", "expected --ctx N: the context the engine is run at")
        if shape is not None and draft is not None:
            raise InputError("--draft", "a --shape carries its own draft; expected no --draft with --shape")
        if shape is not None:               # the files (headers only) before the budget: a wrong path is named first
            from .shapes import plan_shape
            t, d = plan_shape(shape)
        else:
            from .model import read_draft, read_target
            t = read_target(target)
            d = read_draft(draft, t, target) if draft is not None else None
        budget, source = budget_of(gpu_mem, device)
        res = make_plan(t, d, dtype=dtype, device=dev, budget=budget, budget_source=source, slots=slots,
                        base=ctx_base, policy=draft_policy, paged=paged, ctx=ctx)
        if measure:
            from .measure import measure_command
            measure_command(res, target, draft, shape, device, dtype, ctx, record, out)
            return
    except InputError as e:
        fail_input(e)
    if json_out:
        typer.echo(to_json(res))
    else:
        render(res, out)
