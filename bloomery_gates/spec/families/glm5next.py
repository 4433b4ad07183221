"""The glm5next family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import ModelSpec
from ..shapes import DSAShape, HCShape, KDAShape, MLAShape, MoEShape


@dataclass(frozen=True)
class Glm5NextSpec(ModelSpec):
    """A glm5next target (GLM-5.3): ``layer_types`` "linear_attention" (KDA) or "indexed_attention" (MLA + DSA),
    ``mlp_types`` "dense" (``layer.intermediate_size``) or "sparse" (``moe``: R2 sigmoid + bias router, shared expert,
    SwiGLU clamp ``swiglu_limit``), mHC ``hc`` streams collapsed by their mean then the final norm; NoPE throughout.
    ``nextn_layers``: NextN blocks after the trunk in the same file (plain residual MLA + DSA + MoE, no mHC)."""

    layer_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    mla: MLAShape
    dsa: DSAShape
    kda: KDAShape
    moe: MoEShape
    hc: HCShape
    swiglu_limit: float
    nextn_layers: int
