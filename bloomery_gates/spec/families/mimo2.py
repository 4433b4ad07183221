"""The mimo2 family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core import ModelSpec, Tensors
from ..shapes import AttnShape, MoEShape


@dataclass(frozen=True)
class MimoShape:
    """The mimo2 extras: per layer its attention kind (``layer_types[l]`` "full_attention" | "sliding_attention")
    and MLP kind (``mlp_types[l]`` "dense" | "sparse"), the two attention shapes, the value scale applied to v
    before attention, the routed experts (None when every layer is dense) and the shipped MTP layers
    (``model.mtp.layers.{k}``, 0 when absent: SWA attention + dense MLP each, chained)."""

    layer_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    full: AttnShape
    swa: AttnShape
    value_scale: float
    partial_rotary_factor: float
    moe: MoEShape | None
    mtp_layers: int = 0

    def attn(self, layer: int) -> AttnShape:
        return self.swa if self.layer_types[layer] == "sliding_attention" else self.full


@dataclass(frozen=True)
class Mimo2Spec(ModelSpec):
    """A mimo2 target (family ``"mimo2"``, HF model_type ``mimo_v2_flash``): ``layer`` holds the full-attention
    numbers (heads, kv heads, q/k head_dim, dense MLP width, eps, full rope_theta) so shared band code reads it;
    ``mimo`` everything else. Tensor names are the shipped checkpoint's (``self_attn.attention_sink_bias``,
    ``mlp.gate.weight`` / ``mlp.gate.e_score_correction_bias``, ``mlp.experts.{e}.{gate,up,down}_proj.weight``,
    ``model.mtp.layers.{k}.*``); norms are plain gains w."""

    mimo: MimoShape


@dataclass(frozen=True)
class Mimo2MTPSpec:
    """The MTP head shipped in a mimo2 checkpoint: ``num_layers`` chained next-token layers
    ``model.mtp.layers.{k}.*`` (MiMo-V2-Flash: 3), each enorm, hnorm [H], eh_proj [H, 2H] (input [E(tok) ; h],
    embedding first), one SWA decoder layer of the trunk's SWA shape ``attn`` (input_layernorm, self_attn.* with
    sinks, pre_mlp_layernorm, dense mlp.* of ``intermediate_size``) and final_layernorm [H]. Layer k drafts the
    (k+1)-th token of a window. The embedding and head are the target's. ``hidden``: the engines' two conventions,
    "post" (HF MtpModel, vLLM: the post-final-norm target row in, final_layernorm's output recycled; the checkpoint's
    own) or "pre" (llama.cpp: the row before model.norm in, the pre-norm layer output recycled)."""

    kind: str                      # "mimo2-mtp"
    source: Path
    source_format: str             # "hf"
    attn: AttnShape
    hidden_size: int
    intermediate_size: int
    rms_eps: float
    value_scale: float
    num_layers: int
    vocab_size: int
    tensors: Tensors = field(repr=False)
    hidden: str = "post"           # which target hidden layer 0 reads and each layer recycles: post | pre
