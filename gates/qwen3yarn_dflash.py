"""Gate qwen3yarn-dflash: a Qwen3 target with yarn RoPE (rope_scaling yarn, factor 4, original 128) and a
DFlash drafter whose own RoPE is the same yarn (``formats.rope_scaling``)."""

from __future__ import annotations

from dataclasses import replace

from .fixtures import FIXTURES
from .qwen3_dflash import GATE as DFLASH

GATE = replace(
    DFLASH, name="qwen3yarn-dflash", target=FIXTURES / "qwen3yarn-tiny", draft=FIXTURES / "qwen3yarn-tiny-dflash-b8",
    about="Qwen3 target with yarn RoPE (factor 4, original 128) + DFlash drafter with the same yarn",
    anchors=(),
)
