"""The (r) bands at a bench shape: qwen3-dflash's (r) lines on random weights of a real model's shape.

``bloomery bands --shape qwen3-8b --device cuda --dtype bf16`` builds the bench's random-weight Qwen3-8B
target and its 5-layer DFlash-b16 drafter (``bench_shapes.random_pair``), prefills a random prompt, and
prints every (r) line of the gate (each target layer from the kernel's input, the head, the logits end
to end, each draft layer, the draft logits and ids) with the emulated bands of ``bloomery_cli.bands``.
No (w)/(b) lines: random weights accept nothing. The record's ``band_max`` / ``layer_band_max`` say how
wide the widest band was, the numbers the band model must keep under 0.5 and 0.05 in bf16.

The float64 reference holds every weight of the target in float64 on the host (about 4x the bf16 bytes).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import InputError

from ..contract import Report
from ..gatekit import DTYPES, DraftCheck, resolve_device
from ..results.records import conditions, write_atomic
from .shapes import SHAPES, random_pair


def band_summary(facts: dict[str, Any]) -> dict[str, float]:
    bands = facts.get("bands", [])
    layer = [b["band"] for b in bands if b["what"].startswith("target layer")]
    return {"band_max": max((b["band"] for b in bands), default=0.0), "layer_band_max": max(layer, default=0.0),
            "rms_band_max": max((b["rms_band"] for b in bands), default=0.0)}


def probe(shape: str, device: str = "cuda", dtype: str = "bf16", prompt_len: int = 64, json: Path | None = None,
          emit=None) -> tuple[int, Report]:
    from bloomery_gates.gates.qwen3_dflash import check_draft
    from bloomery_gates.gates.targets import check_target
    from bloomery_gates.kernels.drafts.dflash import DFlashDraft
    from bloomery_gates.registry import FAMILIES

    if shape not in SHAPES:
        raise InputError("--shape", f"{shape!r}: expected one of {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise InputError("--dtype", f"{dtype!r}: expected one of {', '.join(DTYPES)}")
    if prompt_len < 2:
        raise InputError("--prompt-len", f"{prompt_len}: need at least 2")
    t0 = time.perf_counter()
    dev = resolve_device(device)
    tspec, dspec = random_pair(SHAPES[shape], dev, DTYPES[dtype])
    prompt = torch.randint(0, tspec.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    report = Report(f"bands-{shape}", **({"emit": emit} if emit else {}))
    report.header(f"random:{shape}", f"random:{shape}-dflash", str(dev), dtype, 0, 1)
    b = dspec.block_size
    engine = FAMILIES["qwen3"].engine(tspec, dev, DTYPES[dtype], prompt_len + b + 1, rows=b)
    draft = DFlashDraft(dspec, engine, prompt_len + b + 1)
    prefill = engine.prefill(prompt, logits=True)
    ref = FAMILIES["qwen3"].reference(tspec, prompt)
    check_target(report, FAMILIES["qwen3"], tspec, prefill, ref, dtype, prompt)
    check_draft(report, DraftCheck(tspec, dspec, engine, draft, prompt, prefill, ref, dtype))
    report.facts.update(band_summary(report.facts), shape=SHAPES[shape].facts(), prompt_len=prompt_len)
    summary = band_summary(report.facts)
    report.note("bands " + " ".join(f"{k}={v:.3e}" for k, v in summary.items()))
    code = report.finish()
    report.facts["wall_s"] = round(time.perf_counter() - t0, 3)
    if json:
        write_atomic(json, {**report.facts, "conditions": conditions(dev), "lines": report.lines})
    return code, report
