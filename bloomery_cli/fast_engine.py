"""``--engine fast``: a gate's pair on the engines ``bloomery bench`` measures, under the gate's own lines.

The fast engine is our engine built from other classes: the family's ``fast_engine`` role (``FastQwen3Target``,
``FastQwen38Target``: fused weights, ``kernels.dispatch.decode_ops``, CUDA graphs per pass width) and the gate's
``make_fast_draft`` (``FastDFlashDraft``, ``FastMTPDraft``, ``FastDFlash2Draft``: graphed propose / extension). The
runner (``bloomery_cli.gate``) builds these instead of ``family.engine`` / ``gate.make_draft``, and every line of the
gate runs unchanged on them: (r) target and draft lines, (w), (b), the state lines, acceptance, the record.

Which path runs: on CUDA the Triton ops (where triton imports) and CUDA graphs, as the bench; elsewhere the torch
ops (``kernels.graphs.TorchOps``), eagerly: that is the path the CPU gates hold in CI. The load line says which
(``ops=``, ``graphs=``; qwen38: ``delta_rule=``, ``attention=``).

Differences from the bench, stated: every verify is padded to the gate's block rows (``rows=b``, as the eager
gate's engine), so a plain run's pass has the drafted run's shape; the target keeps every layer's taps (the (r)
lines read them all; the bench keeps only the draft's). A draft's ``propose(detail=True)`` (the draft and state
checks' one block) runs the same pass function eagerly to record its layer outputs; every other propose replays.

Refused with exit 2 before any work: a pair with no fast engine or no fast draft (``why_not``), and the flags the
fast engines do not take (``--tp``, ``--draft-device``, ``--temperature``).
"""

from __future__ import annotations

from typing import Any

import torch

from bloomery_gates.errors import InputError


def why_not(gate: Any) -> str | None:
    """Why ``--engine fast`` cannot run this gate's pair, or None when it can."""
    from bloomery_gates.registry import FAMILIES

    if not FAMILIES[gate.family].has("fast_engine"):
        return f"no fast engine for a {gate.family} target (the bench runs it on its eager engine only)"
    if getattr(gate, "make_fast_draft", None) is None:
        return f"no fast {gate.draft_kind} draft for this pair (the bench does not run it)"
    return None


def check(gate: Any, tp: int, draft_device: str | None, sampling: Any) -> None:
    """Exit 2 (InputError) before any work when the fast engine cannot run this gate as asked."""
    why = why_not(gate)
    if why is not None:
        raise InputError(f"--engine fast, gate {gate.name}", why)
    for flag, used in (("--tp", tp != 1), ("--draft-device", draft_device is not None),
                       ("--temperature", sampling is not None)):
        if used:
            raise InputError(flag, "not supported with --engine fast (the fast engines run one process, the draft "
                                   "on the target's device, greedy)")


def check_draft(gate: Any, draft_spec: Any) -> None:
    """Exit 2 before any work for a draft the fast classes refuse (sliding-window DFlash layers: ``--draft``)."""
    if any(w is not None for w in getattr(draft_spec, "windows", ()) or ()):
        raise InputError(f"--engine fast, gate {gate.name}", "the draft has sliding-window layers; the fast DFlash "
                                                             "drafts have none (run it on --engine ours)")


def make_engine(family: Any, spec: Any, device: torch.device, dtype: torch.dtype, max_len: int,
                rows: int | None) -> tuple[Any, dict[str, Any]]:
    """The family's fast engine, every verify padded to ``rows`` -> (engine, load-line facts)."""
    engine = family.fast_engine(spec, device, dtype, max_len, rows=rows, max_width=max(16, rows or 0))
    facts: dict[str, Any] = {"engine": "fast", "ops": engine.ops.name,
                             "graphs": "on" if engine.graphs.enabled else "off"}
    for key, attr in (("delta_rule", "impl"), ("attention", "attention")):
        if isinstance(getattr(engine, attr, None), str):
            facts[key] = getattr(engine, attr)
    return engine, facts
