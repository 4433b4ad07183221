"""Gate qwen38-dflash: a qwen38 (Qwen3.5/3.8 dense hybrid) target with a DFlash block drafter (z-lab layout).

The drafter code is qwen3-dflash's, unchanged (``kernels.drafts.dflash``, ``reference.drafts.dflash``): its
context features are the hybrid stack's layer outputs (Gated DeltaNet or gated-attention layers alike), and
a feature from the last layer goes through the target's zero-centred final norm (the engine's
``final_norm`` is the gain 1 + w). The (r) lines check the first block after the prompt against the f64
reference run on the engine's own taps.
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
    name="qwen38-dflash", family="qwen38", draft_kind="dflash",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny-dflash-b8", prompts=PROMPTS,
    about="qwen38 hybrid target + DFlash block drafter (features from the hybrid stack, B-1 drafts per block)",
    load_draft=lambda path, target: load_dflash(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlashDraft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft, check_draft_oracle=check_dflash,
    anchors=("anchor (external, DFlash2 blog, Qwen3.8-27B B=8, T=1): DFlash2 4.80, MTP 4.28 (no DFlash figure "
             "published for this target)",),
    draft_state=DFLASH_STATE,
)
