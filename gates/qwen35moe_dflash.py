"""Gate qwen35moe-dflash: a qwen35moe (Qwen3.5/3.6-MoE hybrid) target with a DFlash block drafter (z-lab layout).

qwen38-dflash's gate (``gates.qwen38_dflash``) on the MoE hybrid: the drafter code is qwen3-dflash's, unchanged; its
context features are the hybrid's layer outputs (here three Gated DeltaNet layers, each with its MoE FFN); the
target's check adds the tier-1 chosen-experts lines (``gates.moe_checks``).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.gatekit import GateDef
from bloomery_cli.loading import load_dflash

from ..kernels.drafts.dflash import DFlashDraft
from .draft_oracle import check_dflash
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dflash import check_draft, describe
from .state_decls import DFLASH_STATE

GATE = GateDef(
    name="qwen35moe-dflash", family="qwen35moe", draft_kind="dflash",
    target=FIXTURES / "qwen35moe-tiny", draft=FIXTURES / "qwen35moe-tiny-dflash-b8", prompts=PROMPTS,
    about="qwen35moe (MoE hybrid) target + DFlash block drafter (features from the hybrid stack, B-1 drafts per block)",
    load_draft=lambda path, target: load_dflash(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlashDraft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft, check_draft_oracle=check_dflash,
    draft_state=DFLASH_STATE,
)
