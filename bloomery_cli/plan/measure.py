"""``bloomery plan ... --measure --ctx N``: the planned bytes against a real run of this harness's engine.

The target and the draft are built on the device with ``max_len = N`` (their caches at the planned context),
a prompt of P = min(512, N / 2) ids is prefilled and 32 ids are drafted (``speculative.generate``). On CUDA the
measurement is ``torch.cuda.max_memory_allocated`` from before the engine is built (the host-side spec tensors
live on the CPU and are not counted), compared with the plan's total at N with P prefill rows; on the host,
where no allocator keeps a peak, the resident bytes after the build (distinct storages held by the engine and the
draft) plus the peak of the bytes the run's ops hold at once (``plan_peak``) are compared with the plan's total
(its runtime arena is 0 on the host). The record also carries the resident bytes beside the plan's resident terms
(everything but the transient term: the workspace and the verify's per-row states, which a commit frees).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError

from .core import ELEM, PlanResult, bytes_at

TOLERANCE = 0.05
DRAFT_IDS = 32


def _resident(*objs: Any) -> int:
    """Bytes of the distinct tensor storages reachable from the objects' attributes (lists, tuples, dicts)."""
    import torch

    seen: set[int] = set()
    total = 0
    stack = [o.__dict__ for o in objs]
    visited: set[int] = set()
    while stack:
        x = stack.pop()
        if id(x) in visited:
            continue
        visited.add(id(x))
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
        elif hasattr(x, "__dict__") and type(x).__module__.startswith("bloomery_gates"):
            stack.append(x.__dict__)
    return total


def _build(target: Path | None, draft: Path | None, shape: str | None, device, dtype, max_len: int):
    """(engine, draft, verify rows, vocab) built on ``device``; the gate registry supplies the draft's loader."""
    if shape == "qwen38-27b":
        from bloomery_gates.kernels.drafts.mtp import MTPDraft
        from bloomery_gates.kernels.families.qwen38.model import Qwen38Target

        from ..families.qwen38.plan_shape import random_specs
        tspec, mspec = random_specs(device, dtype)
        eng = Qwen38Target(tspec, device, dtype, max_len, rows=4)
        return eng, MTPDraft(mspec, eng, max_len, 3), 4, tspec.vocab_size
    if shape is not None:
        from bloomery_gates.kernels.drafts.dflash import DFlashDraft
        from bloomery_gates.kernels.families.qwen3.model import Qwen3Target

        from ..bench.shapes import SHAPES, random_pair
        if shape not in SHAPES:
            raise InputError("--shape", f"{shape!r}: --measure runs qwen38-27b and the qwen3 bench shapes "
                                        f"({', '.join(SHAPES)})")
        tspec, dspec = random_pair(SHAPES[shape], device, dtype)
        eng = Qwen3Target(tspec, device, dtype, max_len, rows=dspec.block_size)
        return eng, DFlashDraft(dspec, eng, max_len), dspec.block_size, tspec.vocab_size
    from bloomery_gates.gates import GATES
    from bloomery_gates.registry import FAMILIES

    from ..loading import load_target
    from .model import read_draft, read_target

    tspec = load_target(Path(target))
    kind = read_draft(Path(draft), read_target(Path(target)), Path(target)).kind if draft else None
    gate = next((g for g in GATES.values() if g.family == tspec.family and g.draft_kind == kind), None)
    if gate is None:
        raise InputError("--draft", f"no gate runs a {kind} draft on a {tspec.family} target here")
    dspec = gate.load_draft(Path(draft), tspec)
    b = gate.block(dspec)
    eng = FAMILIES[tspec.family].engine(tspec, device, dtype, max_len, rows=b)
    return eng, gate.make_draft(dspec, eng, max_len), b, tspec.vocab_size


def measure(res: PlanResult, target: Path | None, draft: Path | None, shape: str | None, device_name: str,
            dtype_name: str, ctx: int) -> dict[str, Any]:
    import torch

    from ..gatekit import DTYPES, resolve_device
    from ..speculative import generate
    from .model import read_draft, read_target
    from .shapes import plan_shape

    device, dtype = resolve_device(device_name), DTYPES[dtype_name]
    prompt_len = max(1, min(512, ctx // 2))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    eng, drf, rows, vocab = _build(target, draft, shape, device, dtype, ctx)
    built = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    if device.type == "cuda" and shape is not None:
        base = 0                                   # random shape weights are made on the device: they count
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, vocab, (prompt_len,), generator=g).tolist()
    n = max(2, min(DRAFT_IDS, ctx - prompt_len - 2 * rows - 2))
    resident_built = _resident(eng, drf)
    if device.type == "cuda":
        run = generate(eng, drf, prompt, n)
        torch.cuda.synchronize(device)
        measured = torch.cuda.max_memory_allocated(device) - base
        what = "torch.cuda.max_memory_allocated"
    else:
        from .peak import peak_of
        run, during = peak_of(lambda: generate(eng, drf, prompt, n))
        measured = resident_built + during
        what = "resident bytes after the build + the peak of the run's op allocations (plan_peak)"
    if shape is not None:
        t, d = plan_shape(shape)
    else:
        t = read_target(Path(target))
        d = read_draft(Path(draft), t, Path(target)) if draft else None
    from .core import terms_of
    terms = terms_of(t, d, dtype_name, device.type)
    planned = bytes_at(t, terms, ctx, 1, d is not None, ELEM[dtype_name], prefill_rows=prompt_len)
    compare = planned["total"]
    resident_planned = planned["total"] - planned["workspace"]
    rel = (compare - measured) / measured if measured else float("inf")
    return {"plan_measure": res.target, "draft": res.draft, "shape": shape, "device": str(device), "dtype": dtype_name,
            "ctx": ctx, "prompt_len": prompt_len, "drafted_ids": n, "verify_rows": rows,
            "accept_mean": round(run.tally.accept_mean, 4), "planned": planned, "planned_compared": compare,
            "measured": measured, "measured_what": what,
            "allocated_after_build": None if built is None else built - base, "rel_err": round(rel, 5),
            "resident_after_build": resident_built, "resident_planned": resident_planned,
            "tolerance": TOLERANCE,
            "within": abs(rel) <= TOLERANCE, "wall_s": round(time.perf_counter() - t0, 3)}


def check_measurable(res: PlanResult, device: str, ctx: int) -> None:
    """Refuse before any allocation: a context too short for the run ``measure`` makes (a prompt of 1, 2 drafted
    ids and two verify windows of ``verify_rows``), or one whose planned bytes pass what the device has free."""
    import torch

    from ..preflight import available_bytes

    least = 2 * res.terms.verify_rows + 5
    if ctx < least:
        raise InputError("--ctx", f"{ctx}: --measure runs a prompt, 2 drafted ids and two verify windows of "
                                  f"{res.terms.verify_rows} rows; expected --ctx >= {least}")
    planned = max(v["total"] for v in res.at_ctx.values() if isinstance(v, dict))
    have = available_bytes(torch.device(device)) if device == "cpu" or torch.cuda.is_available() else None
    if have is not None and planned > have:
        raise InputError("--ctx", f"{ctx}: the plan needs {planned:,} bytes at this context, past the {have:,} "
                                  f"free on {device}; expected a context that fits")


def measure_command(res: PlanResult, target, draft, shape, device: str, dtype: str, ctx: int, record: Path | None,
                    console) -> None:
    import typer

    from ..preflight import check_output_file
    from ..results.records import conditions, write_atomic

    check_output_file(record, "--record")
    check_measurable(res, device, ctx)
    import torch
    rec = measure(res, target, draft, shape, device, dtype, ctx)
    rec["conditions"] = conditions(torch.device("cuda" if device.startswith("cuda") else "cpu"))
    rec["conditions"].setdefault("host", platform.node())
    console.print(f"plan vs measured at ctx {ctx} ({rec['measured_what']}): planned {rec['planned_compared']:,} "
                  f"measured {rec['measured']:,} rel err {rec['rel_err']:+.4f} (tolerance {TOLERANCE}) "
                  + ("PASS" if rec["within"] else "FAIL"), highlight=False, soft_wrap=True)
    if record is not None:
        write_atomic(record, rec)
    raise typer.Exit(0 if rec["within"] else 1)
