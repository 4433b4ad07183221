"""The deepseek4 family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core import LayerShape, ModelSpec, RopeScaling, Tensors
from ..shapes import HCShape, MoEShape


@dataclass(frozen=True)
class V4AttnShape:
    """DeepSeek V4's attention (``kernels.ops.v4_attention``): ``num_heads`` query heads over one key = value head of
    ``head_dim``, the interleaved rope on the trailing ``rope_dim`` channels (``rope_theta`` on sliding layers,
    ``compress_theta`` / ``compress_scaling`` on CSA / HCA layers), a window of ``window`` keys, the grouped
    output (``o_groups`` x ``o_lora_rank``), the compress rates ``csa_rate`` / ``hca_rate`` and the CSA's lightning
    indexer (``index_heads`` x ``index_head_dim``, ``index_topk`` entries per query)."""

    num_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window: int
    rope_theta: float
    compress_theta: float
    compress_scaling: RopeScaling | None
    csa_rate: int
    hca_rate: int
    index_heads: int
    index_head_dim: int
    index_topk: int


@dataclass(frozen=True)
class Deepseek4Spec(ModelSpec):
    """A deepseek4 target (DeepSeek V4, HF ``deepseek_v4``): ``layer_types`` "sliding" | "csa" | "hca" (``attn``),
    ``mlp_types`` "hash" (experts from ``tid2eid[token]``) | "moe" (sqrt-softplus + bias top-k), both renormalised
    x ``moe.routed_scale``, an ungated shared expert, SwiGLU clamp ``swiglu_limit``; mHC ``hc`` streams collapsed by
    the trained HC head, then the final norm. ``mtp_layers``: the in-file MTP blocks (``mtp.*``, not read here).
    ``experts_mxfp4``: the routed experts are stored packed (DeepSeek's native FP4: e2m1 codes [E, R, K/2] uint8
    under ``mlp.experts.{gate_up,down}_proj`` and e8m0 scales [E, R, K/32] uint8 under ``..._scale_inv``;
    ``bloomery_gates.kernels.ops.mxfp4``), read as bytes and never widened."""

    layer_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    attn: V4AttnShape
    moe: MoEShape
    hc: HCShape
    swiglu_limit: float
    mtp_layers: int
    experts_mxfp4: bool = False


@dataclass(frozen=True)
class Deepseek4MTPSpec:
    """The in-file MTP block of a deepseek4 target (DeepSeek V4: ``num_nextn_predict_layers`` 1), HF-side names
    ``mtp.0.*`` (``bloomery_cli.families.deepseek4.reader_mtp``): enorm, hnorm, e_proj, h_proj [H, H] (llama.cpp's
    ``eh_proj = [e | h]``, embedding first), one mHC block of the trunk's shape (``attn_hc`` / ``ffn_hc``,
    input_layernorm, a sliding ``self_attn``, post_attention_layernorm, a sqrt-softplus non-hash ``mlp``), its own
    ``hc_head`` and ``norm`` (shared_head.norm). It reads the target's 4 raw streams and drafts with the target's
    embedding and head; ``tensors`` keep the checkpoint's names."""

    kind: str                      # "deepseek4-mtp"
    source: Path
    source_format: str             # "hf"
    num_layers: int                # 1 (the block is chained: its output streams are the next draft's hidden)
    vocab_size: int
    tensors: Tensors = field(repr=False)


COLLAPSES = ("hc_head", "last_mix")   # the HC collapse variants of a DSpark draft ("last_mix": V4.1, no trained head)
HC_MIXES = ("own", "lagged")          # a stage folds its input by its own pre (V4) or the previous sublayer's (V4.1)


@dataclass(frozen=True)
class Deepseek4DSparkSpec:
    """llama.cpp's DSV4 DSpark block draft (GGUF ``general.architecture`` "dflash" with
    ``dflash.hyper_connection.count`` > 0; docs/FAMILIES_MOE.md 5.1), read by
    ``bloomery_cli.families.deepseek4.reader_dspark``. ``num_layers`` full DSV4 stages (window-only attention of
    ``attn``, mHC ``hc``, sqrt-softplus MoE ``moe`` + one shared expert, SwiGLU clamp ``swiglu_limit``) behind
    ``fc`` [H, n H] over the hc-stream MEAN of the target's state entering layer l + 1 for l in
    ``target_layer_ids`` (the GGUF's ``dflash.target_layers`` minus one: the DSpark config's ids, the same
    convention as ``DSparkSpec``); block [anchor, mask x (B-1)], anchor-first (B drafts); the collapse ``collapse``
    (one of ``COLLAPSES``: "hc_head" = V4's trained ``hc_head.*``); Markov head of rank ``markov_rank`` and the
    optional confidence head. ``tensors`` under the HF-side names of ``kernels.families.deepseek4.dspark``
    (``layers.{i}.*`` as the trunk's layers; ``fc.weight``, ``enc_norm.weight``, ``norm.weight``,
    ``hc_head.*``, ``markov_head.*``, ``confidence_head.*``; ``embed_tokens.weight`` / ``lm_head.weight`` when the
    file carries its own, else the target's are used)."""

    kind: str                      # "deepseek4-dspark"
    source: Path
    source_format: str             # "gguf"
    num_layers: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    markov_rank: int
    confidence: bool
    collapse: str
    vocab_size: int
    layer: LayerShape
    attn: V4AttnShape
    moe: MoEShape
    hc: HCShape
    swiglu_limit: float
    tensors: Tensors = field(repr=False)
    hc_mix: str = "own"            # one of HC_MIXES
    q_head_norm: bool = True       # the per-head unweighted RMS of q before its rope (V4: yes, V4.1: no)

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size
