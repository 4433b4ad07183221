"""Gate qwen3-dflash-swa-spec: the sliding-window DFlash drafter in the speculators layout, under speculators' own
window rule (``formats.sliding.speculators_windows``: the W context rows before the block start for every block
row, the block causally since sliding_window_non_causal is false). Tier 3: speculators' DFlashDraftModel with the
same layer_types and sliding_window builds its own mask (``create_anchor_block_mask_mod``)."""

from __future__ import annotations

from dataclasses import replace

from .fixtures import FIXTURES
from .qwen3_dflash import GATE as DFLASH

GATE = replace(
    DFLASH, name="qwen3-dflash-swa-spec", draft=FIXTURES / "qwen3-tiny-dflash-b8-swa-speculators",
    about="Qwen3 target + sliding-window DFlash, speculators layout and rule (W=16 context rows before the block)",
    anchors=(),
    make_fast_draft=None,             # FastDFlashDraft has no sliding-window layers (the bench runs none)
)
