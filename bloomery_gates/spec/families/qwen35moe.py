"""The qwen35moe family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass

from ..shapes import MoEShape
from .qwen38 import Qwen38Spec


@dataclass(frozen=True)
class Qwen35MoeSpec(Qwen38Spec):
    """A qwen35moe target (family ``"qwen35moe"``, Qwen3.5/3.6-MoE): the qwen38 hybrid whose every FFN is the MoE
    ``moe`` (softmax router, one sigmoid-gated shared expert). ``layer.intermediate_size`` holds the expert width
    (the reduction length the bands count for the expert down projection)."""

    moe: MoEShape
