"""The gate's use of the plan: whether the draft runs (the ctx-first rule, ``plan.decide``) and the plan facts
for the load line.

Policy: ``auto`` when the draft is not asked for by name (no ``--draft``): the rule may turn it off, and the gate
then runs plain-only checks and says so. ``on`` (``--draft PATH`` or ``--draft-policy on``): the draft runs, never
yields. ``off``: plain-only. The budget is ``--gpu-mem`` or the device's free memory; one slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError

POLICIES = ("auto", "on", "off")


@dataclass
class DraftDecision:
    on: bool
    reason: str
    facts: dict[str, Any]
    note: str | None = None


def policy_of(asked: str | None, draft_given: bool) -> str:
    if asked is not None and asked not in POLICIES:
        raise InputError("--draft-policy", f"{asked!r}: expected one of {', '.join(POLICIES)}")
    if asked is None:
        return "on" if draft_given else "auto"
    return asked


def decide_draft(target: Path, draft: Path, dtype: str, device: str, policy: str,
                 gpu_mem: str | None) -> DraftDecision:
    """Plan the pair from headers and apply the rule. A pair the planner does not model (a family it has no terms
    for) keeps its draft under ``auto`` and ``on`` alike, and the load line's note says why: the rule
    cannot decide, so it does not turn anything off (an unreadable file is refused earlier, by the loaders)."""
    from .core import budget_of, load_line, plan_paths

    dev = "cpu" if device == "cpu" else "cuda"
    try:
        budget, source = budget_of(gpu_mem, device)
        res = plan_paths(target, draft, dtype=dtype, device=dev, budget=budget, budget_source=source,
                         policy=policy)
    except InputError as e:
        return DraftDecision(policy != "off", "asked off (--draft-policy off)" if policy == "off" else "asked",
                             {}, note=f"plan: not planned ({e})")
    state, facts = load_line(res)
    return DraftDecision(state == "on", res.reason, facts if state == "on" else {})
