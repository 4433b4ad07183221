"""Shapes more than one family reuses (hybrid GDN, MoE, attention kinds, hyper-connections, MLA, DSA, KDA)."""

from __future__ import annotations

from dataclasses import dataclass


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
