"""deepseek41 has no HF layout (docs/V41.md 1: no outside code, transformers included, implements V4.1; the only
files are the seed engine's GGUF): the registry's ``read_hf`` role refuses by name (exit 2)."""

from __future__ import annotations

from pathlib import Path

from bloomery_gates.errors import Refused


def deepseek41_from_hf(path: Path):
    raise Refused(path, "deepseek41 (DeepSeek V4.1) has no HF layout here; give the seed engine's GGUF "
                        "(general.architecture deepseek41, docs/V41.md)")
