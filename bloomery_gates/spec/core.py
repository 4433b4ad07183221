"""The specs every family shares: the layer shape, the target ModelSpec, the block drafts (DFlash, DSpark,
DFlash2), the MTP head and EAGLE-3.

Family-agnostic, validated specs that both kernels/ and reference/ consume.

A spec is plain data: the architecture numbers plus a mapping from canonical tensor names (the HF
names, e.g. ``model.layers.0.self_attn.q_proj.weight``) to CPU torch tensors in their stored dtype
(GGUF tensors arrive already dequantized to float32). Readers in ``bloomery_cli.formats`` build
them; neither kernels/ nor reference/ ever sees a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class RopeScaling:
    """A non-default RoPE (HF ``rope_parameters`` / ``rope_scaling``), as read; the math is in
    ``kernels/ops/rope.py`` and ``reference/ops/rope.py`` (``inv_freq``, ``attention_factor``).

    kind "linear": every inverse frequency divided by ``factor``.
    kind "yarn": transformers' ``_compute_yarn_parameters`` (factor, original_max_position, beta_fast,
    beta_slow, truncate; the cos/sin scale from attention_factor, else from mscale / mscale_all_dim, else
    0.1 ln(factor) + 1).
    """

    kind: str                               # "linear" | "yarn"
    factor: float
    original_max_position: int = 0          # yarn only
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class LayerShape:
    """One Qwen3-style decoder layer: GQA attention with q/k RMSNorm, SwiGLU MLP. ``rope_scaling`` None is
    default RoPE."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A target model. ``tensors`` uses HF names; ``lm_head.weight`` is absent when tied."""

    family: str                    # "qwen3"
    source: Path                   # the file or directory it was read from
    source_format: str             # "hf" | "gguf"
    layer: LayerShape
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position: int
    tensors: Tensors = field(repr=False)

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    def head_weight(self) -> torch.Tensor:
        return self.tensors["model.embed_tokens.weight" if self.tie_word_embeddings else "lm_head.weight"]


@dataclass(frozen=True)
class DFlashSpec:
    """A DFlash block drafter (DRAFTERS.md section 2). Tensors use z-lab's names (no ``model.`` prefix).

    ``target_layer_ids[j]`` names the target layer whose OUTPUT feeds feature j
    (HF ``hidden_states[l_j + 1]``).
    """

    kind: str                      # "dflash"
    source: Path
    layer: LayerShape
    num_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    vocab_size: int
    tensors: Tensors = field(repr=False)
    windows: tuple[int | None, ...] = ()   # per draft layer: a sliding window W, or None (full); () all full
    # which keys a window W lets the block row at position p = s + r see (``formats.sliding``):
    #   "query"        p - W < j <= p                                  (vLLM; the z-lab layout)
    #   "anchor"       s - W <= j < s, and block rows 0..r             (speculators, sliding_window_non_causal false)
    #   "anchor-bidir" s - W <= j < s, and the whole block             (speculators, sliding_window_non_causal true)
    window_rule: str = "query"


@dataclass(frozen=True, kw_only=True)
class DSparkSpec(DFlashSpec):
    """A DSpark block drafter (DRAFTERS.md section 4, DeepSpec layout): the DFlash backbone plus the Markov
    head (``markov_rank`` r, type ``markov_head_type``) and the optional confidence head. Tensors may carry
    ``embed_tokens.weight`` / ``lm_head.weight`` copies; absent, the target's are used. Anchor-first: B rows
    give B drafts.
    """

    markov_rank: int
    markov_head_type: str
    confidence: bool


@dataclass(frozen=True, kw_only=True)
class DFlash2Spec(DFlashSpec):
    """A DFlash2 block drafter (DRAFTERS.md section 3): the DFlash backbone fields (same names, so
    DFlash's context-feature code reads it) plus the grouped dynamic depthwise conv (kernel size
    ``conv_kernel_size`` T, group ``conv_group_size`` g, G = H / g kernels per side and tap) and the
    low-rank top-K path selector (rank ``selector_rank`` r, ``selector_top_k`` K). Head logits are
    ``head(h) * output_multiplier``, then ``c * tanh(l / c)`` when ``final_logit_softcapping`` c is set;
    block rows enter as ``E(y) * input_embedding_scale``. B-1 drafts per block (DFlash's convention).
    """

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0


@dataclass(frozen=True)
class MTPSpec:
    """An MTP / NextN head shipped with a qwen38 (Qwen3.5/3.8) target (DRAFTERS.md section 1).

    Canonical HF names under ``mtp.``: ``mtp.fc.weight`` [H, 2H] (input [E(tok) ; h], embedding
    first), ``mtp.pre_fc_norm_embedding.weight``, ``mtp.pre_fc_norm_hidden.weight``, ``mtp.norm.weight``
    [H], and one gated full-attention decoder layer ``mtp.layers.0.*`` (q_proj [2*nh*d, H] = query and
    output gate per head, k/v/o, q/k_norm, input/post_attention_layernorm, mlp). Every norm weight is
    zero-centred (applied as 1 + w); a GGUF's baked-in +1 is taken off by the reader. ``rotary_dim``:
    the first channels of each head that RoPE rotates (partial RoPE). The embedding and head are the
    target's.
    """

    kind: str                      # "mtp"
    source: Path
    source_format: str             # "hf" | "gguf"
    layer: LayerShape
    rotary_dim: int
    num_layers: int                # nextn layers (1 is what the kernels implement)
    vocab_size: int
    tensors: Tensors = field(repr=False)


@dataclass(frozen=True)
class Eagle3Spec:
    """An EAGLE-3 drafter (DRAFTERS.md section 5, the speculators ``eagle3`` layout): one decoder layer whose
    q/k/v read the 2H columns [rms(E(tok), input_layernorm) ; rms(h, hidden_norm)] (embedding first), fed the
    target's auxiliary hidden rows through ``fc.weight`` [H, n*H], with its own head ``lm_head.weight``
    [draft_vocab_size, H] over a draft vocabulary mapped to target ids by ``d2t``.

    ``aux_layer_ids`` are speculators' ids: id l reads the target's hidden state ENTERING layer l (HF
    ``hidden_states[l]``: 0 the embedding rows, l the output of layer l-1, L the last layer's output before the
    final norm), i.e. index l of the engine's taps. ``qk_norm``: a Qwen3 draft layer (per-head q_norm / k_norm)
    or a Llama one (none). ``d2t`` [draft_vocab_size] int64 offsets, target id = d + d2t[d]; None when the draft
    vocabulary is the target's. ``speculative_tokens``: the chain length K the checkpoint declares (its greedy
    proposal method). The embedding is the target's (a shipped ``embed_tokens.weight`` must equal it).
    """

    kind: str                      # "eagle3"
    source: Path
    layer: LayerShape              # the draft layer's numbers (hidden_size H: its residual stream)
    qk_norm: bool
    aux_layer_ids: tuple[int, ...]
    draft_vocab_size: int
    vocab_size: int                # the target's
    norm_before_residual: bool     # the residual is rms(h, hidden_norm) instead of h
    norm_output: bool              # the chain feeds rms(y, norm) back instead of y
    speculative_tokens: int
    tensors: Tensors = field(repr=False)
    d2t: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_layers(self) -> int:
        """One decoder layer: the only EAGLE-3 depth the kernels implement (the reader refuses more)."""
        return 1

    def target_ids(self) -> torch.Tensor:
        """[draft_vocab_size] int64: the target id of every draft id (arange + d2t; the identity without d2t)."""
        base = torch.arange(self.draft_vocab_size, dtype=torch.long)
        return base if self.d2t is None else base + self.d2t.long()
