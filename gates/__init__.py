"""The registered gates: one module per (target family x drafter) pair."""

from __future__ import annotations

from . import qwen3_dflash

GATES = {g.name: g for g in (qwen3_dflash.GATE,)}
