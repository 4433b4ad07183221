"""Gate qwen3-dflash-swa: the Qwen3 target with a DFlash drafter whose layers are sliding-window
(z-lab layout ``layer_types`` / ``sliding_window``, vLLM's rule: ``formats.sliding``)."""

from __future__ import annotations

from dataclasses import replace

from .fixtures import FIXTURES
from .qwen3_dflash import GATE as DFLASH
from .swa_oracle import check_swa

GATE = replace(
    DFLASH, name="qwen3-dflash-swa", draft=FIXTURES / "qwen3-tiny-dflash-b8-swa",
    about="Qwen3 target + DFlash drafter with sliding-window layers (W=16, causal, p - W < j <= p)",
    check_draft_oracle=check_swa, anchors=(),
    make_fast_draft=None,             # FastDFlashDraft has no sliding-window layers (the bench runs none)
)
