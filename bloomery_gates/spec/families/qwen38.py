"""The qwen38 family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import ModelSpec
from ..shapes import HybridShape


@dataclass(frozen=True)
class Qwen38Spec(ModelSpec):
    """A qwen38 target (family ``"qwen38"``): a ``ModelSpec`` whose ``layer`` holds the full-attention
    layers' numbers (heads, head_dim, MLP width, eps, rope_theta) plus ``hybrid``. Norm weights are stored
    zero-centred as HF stores them (gain 1 + w), except the Gated DeltaNet's output norm (gain w)."""

    hybrid: HybridShape
