"""The registered gates: one module per (target family x drafter) pair."""

from __future__ import annotations

from . import (
               qwen3_dflash,
               qwen3_dflash2,
               qwen3_dspark,
               qwen3_eagle3,
               qwen35moe_dflash,
               qwen35moe_mtp,
               qwen38_dflash,
               qwen38_dflash2,
               qwen38_dspark,
               qwen38_mtp,
)

GATES = {g.name: g for g in (qwen3_dflash.GATE, qwen3_dspark.GATE, qwen3_dflash2.GATE, qwen38_mtp.GATE,
                              qwen38_dflash.GATE, qwen38_dflash2.GATE, qwen3_eagle3.GATE, qwen38_dspark.GATE,
                              qwen35moe_mtp.GATE, qwen35moe_dflash.GATE)}
