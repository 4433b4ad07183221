"""Family-agnostic, validated specs that both kernels/ and reference/ consume.

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
class HybridShape:
    """The qwen38 hybrid's extra numbers (HF model_type ``qwen3_5`` text config; GGUF arch ``qwen35``).

    ``layer_types[l]`` is ``"linear_attention"`` (a Gated DeltaNet layer) or ``"full_attention"`` (gated
    attention: the q projection also yields the output gate). Attention layers rotate the first
    ``rotary_dim = int(head_dim * partial_rotary_factor)`` channels of each head (rotate-half within them).
    Gated DeltaNet: nk key heads of width dk, nv value heads of width dv (value head j reads key head
    j // (nv / nk)), a depthwise causal conv of ``linear_conv_kernel_dim`` K taps over the
    ``conv_dim = 2 nk dk + nv dv`` projected channels. ``mtp_num_hidden_layers`` counts the shipped
    next-token layers (``mtp.*``; 0 when absent); they are not part of the trunk.
    """

    layer_types: tuple[str, ...]
    partial_rotary_factor: float
    rotary_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    mtp_num_hidden_layers: int = 0

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == "linear_attention"


@dataclass(frozen=True)
class Qwen38Spec(ModelSpec):
    """A qwen38 target (family ``"qwen38"``): a ``ModelSpec`` whose ``layer`` holds the full-attention
    layers' numbers (heads, head_dim, MLP width, eps, rope_theta) plus ``hybrid``. Norm weights are stored
    zero-centred as HF stores them (gain 1 + w), except the Gated DeltaNet's output norm (gain w)."""

    hybrid: HybridShape


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts FFN (``kernels.ops.moe`` / ``reference.ops.moe``): ``num_experts`` E routed experts of
    width ``expert_ff`` (HF fused ``mlp.experts.gate_up_proj`` [E, 2 ff, H], ``mlp.experts.down_proj`` [E, H, ff]),
    ``top_k`` chosen per row by ``router``:
      "softmax": softmax over all experts, top-k, renormalised (Qwen3.5/3.6-MoE; ``mlp.gate.weight`` [E, H]);
      "sigmoid": sigmoid scores, + ``mlp.gate.e_score_correction_bias`` [E] for the choice only, the best
                 ``topk_group`` of ``n_group`` groups (by the sum of each group's 2 best), top-k, renormalised
                 when ``norm_topk``, times ``routed_scale`` (DeepSeek-V3 style: MiMo-V2, GLM-5).
    ``shared_ff``: the shared expert's width (``mlp.shared_expert.{gate,up,down}_proj``), None when there is none;
    ``shared_gated``: scaled by sigmoid(x ``mlp.shared_expert_gate.weight``^T) (Qwen) or not."""

    num_experts: int
    top_k: int
    expert_ff: int
    shared_ff: int | None = None
    shared_gated: bool = False
    router: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    norm_topk: bool = True
    routed_scale: float = 1.0


@dataclass(frozen=True)
class Qwen35MoeSpec(Qwen38Spec):
    """A qwen35moe target (family ``"qwen35moe"``, Qwen3.5/3.6-MoE): the qwen38 hybrid whose every FFN is the MoE
    ``moe`` (softmax router, one sigmoid-gated shared expert). ``layer.intermediate_size`` holds the expert width
    (the reduction length the bands count for the expert down projection)."""

    moe: MoEShape


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


@dataclass(frozen=True)
class AttnShape:
    """One attention kind of a mimo2 (MiMo-V2) target: nh query heads, nkv kv heads, q/k heads of ``head_dim``,
    v heads of ``v_head_dim``, RoPE on the first ``rotary_dim`` channels of each q/k head (theta ``rope_theta``),
    ``window`` keys per query counting itself (None: full causal), per-head attention sinks when ``sinks``."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    rope_theta: float
    rotary_dim: int
    window: int | None
    sinks: bool


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


# --- the third wave's shapes (issue 25; docs/FAMILIES_MOE.md 4.3, 4.5, 6): files only, no engine yet --------------


@dataclass(frozen=True)
class HCShape:
    """Hyper-connections: the residual is ``count`` streams x [T, count, H] instead of one [T, H].

    qwen4exp's gated low-rank form (``low_rank`` r > 0): per sublayer a grouped zero-centred norm over the count*H
    elements, ``mix = sigmoid(up(silu(down(x^)/count)))`` with down [r, count*H], ``inject = 2 sigmoid(...)``.
    GLM's mHC (``sinkhorn_iters`` > 0): ``fn`` [(2 + count) count, count H], Sinkhorn-normalised mixing with ``eps``.
    """

    count: int
    low_rank: int = 0
    sinkhorn_iters: int = 0
    eps: float = 0.0


@dataclass(frozen=True)
class PLEShape:
    """qwen4exp's hashed n-gram embeddings (PLE) on ``layers`` (0-based, linear layers only): for n in 2..ngram_size
    ``heads_per_ngram`` hashed heads, each a table of ``embed_dim / heads`` columns, a dilated depthwise conv of
    ``conv_kernel`` taps and a per-stream sigmoid gate. HF gives the hashing's inputs (``vocab_base``,
    ``divisible_by``, ``seed``, ``split_parts``); a GGUF gives its outputs (``head_vocab_sizes``); the other side's
    fields are 0 / ()."""

    layers: tuple[int, ...]
    embed_dim: int
    conv_kernel: int
    ngram_size: int
    heads_per_ngram: int
    vocab_base: int = 0
    divisible_by: int = 0
    seed: int = 0
    split_parts: int = 0
    head_vocab_sizes: tuple[int, ...] = ()
    eos_token_id: int = -1         # the id that ends an n-gram segment and fills a sequence's start (-1: unknown)


@dataclass(frozen=True)
class QSAShape:
    """qwen4exp's QSA block mask on its indexed-attention layers: ``num_heads`` indexer heads of ``head_dim`` over
    one kv head; each query keeps ``budget / compress_ratio`` blocks of ``compress_ratio`` mean-pooled keys, plus the
    incomplete tail."""

    num_heads: int
    kv_heads: int
    head_dim: int
    budget: int
    compress_ratio: int


@dataclass(frozen=True)
class Qwen4ExpSpec(Qwen35MoeSpec):
    """A qwen4exp target (Qwen3.8-Flash-Next): the qwen35moe hybrid (GDN + gated attention, R1 softmax MoE) with no
    block norms, every sublayer wrapped in gated low-rank hyper-connections ``hc``, QSA on the indexed layers
    (``hybrid.layer_types`` says "full_attention" for them) and PLE on one linear layer."""

    hc: HCShape
    qsa: QSAShape
    ple: PLEShape | None
    output_gate: str = ""          # the GDN output gate's activation, "sigmoid" | "silu" ("": the file does not say)


@dataclass(frozen=True)
class Qwen4ExpMTPSpec(MTPSpec):
    """qwen4exp's MTP head from its separate GGUF (FAMILIES_MOE.md 6): one nextn block ``block`` (= the target's layer
    count) fed the 4 raw streams: per stream s ``[rms(e) enorm | rms(h_s) hnorm_s]`` (hnorm [count*H]), eh_proj
    [H, 2H], an HC dense gated-GQA attention and an HC MoE, then ``nextn.hc_head``. ``borrows``: the file carries
    neither token_embd nor output and takes the target's (``nextn_shared_target_tensors``). Tensors keep GGUF names."""

    block: int
    hc: HCShape
    moe: MoEShape
    borrows: bool


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention without RoPE: q = q_b(norm(q_a x)) [heads, nope]; the KV cache holds the latent
    [kv_lora_rank] per token, expanded by kv_b [heads (nope + v), kv_lora_rank]."""

    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class DSAShape:
    """The DSA k-pool indexer on the indexed layers: ``num_heads`` x ``head_dim`` scores over keys pooled by ``kpool``;
    each query keeps ``topk`` keys (the incomplete tail pool kept when ``select_tail``). ``types`` per layer: "full"
    (its own indexer), "shared" (the previous full layer's choice) or "" (a KDA layer)."""

    num_heads: int
    head_dim: int
    topk: int
    kpool: int
    select_tail: bool
    types: tuple[str, ...]


@dataclass(frozen=True)
class KDAShape:
    """Kimi delta attention: ``num_heads`` x ``head_dim`` recurrent state S [heads, d, d] f32 per layer, short convs
    of ``conv_kernel`` taps on q, k, v, the per-channel gate bounded below by ``lower_bound``."""

    num_heads: int
    head_dim: int
    conv_kernel: int
    lower_bound: float


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
