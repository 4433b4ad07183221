"""The registered gates: one module per (target family x drafter) pair."""

from __future__ import annotations

from . import (
               deepseek4_dspark,
               deepseek4_mtp,
               deepseek41_dspark,
               glm5next_mtp,
               mimo2_mtp,
               qwen3_dflash,
               qwen3_dflash2,
               qwen3_dflash_swa,
               qwen3_dflash_swa_spec,
               qwen3_dspark,
               qwen3_eagle3,
               qwen3yarn_dflash,
               qwen4exp_mtp,
               qwen35moe_dflash,
               qwen35moe_mtp,
               qwen38_dflash,
               qwen38_dflash2,
               qwen38_dspark,
               qwen38_mtp,
)

GATES = {g.name: g for g in (qwen3_dflash.GATE, qwen3_dspark.GATE, qwen3_dflash2.GATE, qwen38_mtp.GATE,
                              qwen38_dflash.GATE, qwen38_dflash2.GATE, qwen3_eagle3.GATE, qwen38_dspark.GATE,
                              qwen3yarn_dflash.GATE, qwen3_dflash_swa.GATE, qwen3_dflash_swa_spec.GATE,
                              qwen35moe_mtp.GATE, qwen35moe_dflash.GATE)}
GATES[mimo2_mtp.GATE.name] = mimo2_mtp.GATE
GATES[glm5next_mtp.GATE.name] = glm5next_mtp.GATE
GATES[deepseek4_mtp.GATE.name] = deepseek4_mtp.GATE
GATES[deepseek4_dspark.GATE.name] = deepseek4_dspark.GATE
GATES[deepseek41_dspark.GATE.name] = deepseek41_dspark.GATE
GATES[qwen4exp_mtp.GATE.name] = qwen4exp_mtp.GATE
