"""The plan's view of a checkpoint (``PlanModel``, ``PlanDraft`` and their parts) and the element counts read off an
inventory: what ``plan_model`` (the dense and hybrid families) and ``plan_mimo2`` both build, apart from both so
that plan_model can hand a mimo2 checkpoint to plan_mimo2 without the two importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any


@dataclass(frozen=True)
class AttnGroup:
    """``layers`` attention layers sharing one KV row shape; ``window`` caps the positions they keep."""

    layers: int
    kv_heads: int
    head_dim: int
    window: int | None = None
    v_head_dim: int | None = None   # V's head width when it differs from K's (mimo2); None: head_dim

    @property
    def kv_width(self) -> int:
        """K plus V elements per kv head and position."""
        return self.head_dim + (self.head_dim if self.v_head_dim is None else self.v_head_dim)


@dataclass(frozen=True)
class Recurrent:
    """Per-slot recurrent state of ``layers`` layers: ``state_f32`` f32 elements and ``conv`` run-dtype
    elements each (the conv tail); ``kind`` names it (deltanet, mamba2)."""

    kind: str
    layers: int
    state_f32: int
    conv: int
    channels: int = 0          # the conv's channels C (conv = (k - 1) C): a verify keeps [k - 1 + R, C] per layer


@dataclass(frozen=True)
class Experts:
    """Routed experts as ``routed_experts`` runs them: each (row, choice) pair gathers its expert's gate_up
    [2 ff, H] and down [H, ff] (``top_k`` pairs per row, chunked to ``GATHER_BUDGET`` bytes)."""

    top_k: int
    expert_ff: int
    mxfp4: bool = False        # kept packed and decoded per chunk (kernels.ops.mxfp4.routed_experts_mxfp4)


@dataclass
class PlanModel:
    """The plan's view of one checkpoint (target or draft). Weight element counts exclude ``draft_elems``
    (an in-file MTP / NextN layer: the draft's weights, not the target's)."""

    label: str
    family: str
    fmt: str                                   # "hf" | "gguf" | "shape"
    hidden: int
    heads: int
    vocab: int
    intermediate: int
    max_position: int
    weight_elems: int
    stored_bytes: int
    tied: bool
    embed_elems: int
    attn: tuple[AttnGroup, ...]
    rotary_dim: int
    recurrent: tuple[Recurrent, ...] = ()
    draft_elems: int = 0                       # in-file MTP / NextN tensors
    draft_layers: int = 0
    draft_kind: str | None = None              # the inventory's verdict kind for a draft file
    embed_dtype: str = "f32"                   # the dtype the token embedding reaches the engine in
    meta: dict[str, Any] = field(default_factory=dict)
    rope_tables: int = 1                       # cos/sin table pairs of rotary_dim (mimo2: one per layer kind)
    f32_elems: int = 0                         # weight elements the engine keeps in f32 whatever the run dtype
    score_bytes: int | None = None             # bytes per attention score alive at once (None: the module doc's)
    experts: Experts | None = None             # routed experts run by gathering (kernels.ops.moe.routed_experts)
    notes: tuple[str, ...] = ()                # what the plan's reader should know (printed with the plan)
    residual_streams: int = 1                  # hyper-connections: each layer's output is this many rows of H
    fixed_bytes: int = 0                       # weight bytes whatever the run dtype, outside weight_elems (packed
    #                                            MXFP4 experts at 4.25 bits a weight, int64 tables)
    position_elems: int = 0                    # run-dtype elements per position besides the attention groups' K/V
    #                                            (deepseek4: the compressor's and indexer's projections)
    keys_to_end: bool = False                  # attention scores span the positions written so far (a pass of r
    #                                            rows ending at key L: [r, L]), not the whole cache (glm5next)
    prefill_scratch: tuple[int, int, int, int] = (0, 0, 0, 0)   # a chunked prefill's (chunk C, bytes a chunk
    #                                            holds when the pass is one chunk, when it is more (the previous
    #                                            chunk's matrices live beside the next's), bytes per row padded to C)
    held_row_bytes: int = 0                    # bytes per row a pass keeps from layer to layer besides the taps
    #                                            (each MoE layer's recorded Routing: ids, weights, choice)
    masks_held: bool = False                   # the pass's causal mask and its selected copy [r, C] bool, and the
    #                                            last indexer's selection, live through every phase (qwen4exp)
    entry_rate: int = 0                        # compressed attention (deepseek4): a pass's keys are the cache [C] and
    #                                            its entry slots [C / m] (m the smallest compress rate), masked
    index_pool: int = 0                        # a DSA / QSA indexer of pools of this many keys: a pass ending at key
    #                                            L holds its pool scores [r, L / p] f32 and token mask [r, L + 1] bool
    key_position_bytes: int = 8                # bytes per position of the engine's key positions (int64: 8; 0 for
    #                                            an engine that holds none, deepseek41)

    @property
    def attention_layers(self) -> int:
        return sum(g.layers for g in self.attn)


def routing_held(moe, layers: int) -> int:
    """Bytes per row of the Routing each of ``layers`` MoE layers records for the pass (``kernels.ops.moe.Routing``):
    the ids (a view of the int64 sort [E]), the k float32 weights and the float32 choice [E]: 12 E + 4 k."""
    return layers * (12 * moe.num_experts + 4 * moe.top_k)


def _elems(inv_model, groups: tuple[str, ...] | None = None, exclude: tuple[str, ...] = ()) -> int:
    return sum(prod(t.shape) for t in inv_model.tensors
               if (groups is None or t.group in groups) and t.group not in exclude)


def _embed_dtype(inv_model) -> str:
    """The stored dtype of the token embedding as the engine receives it (GGUF tensors arrive as f32)."""
    st = next((t.dtype for t in inv_model.tensors if t.group == "token_embd"), "F32")
    return {"BF16": "bf16", "F16": "f16"}.get(st, "f32")


@dataclass
class PlanDraft:
    """A draft's plan-relevant numbers: its own weights, its own KV store and the rows a verify runs."""

    label: str
    kind: str                 # dflash, dflash2, dspark, eagle3, mtp
    weight_elems: int
    layers: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    verify_rows: int
    vocab: int
    own_embed: bool = False   # a DSpark copy of embed / head (held besides the target's)
    v_head_dim: int | None = None          # V's head width when it differs from K's (mimo2); None: head_dim
    store_elems: int = 0                   # run-dtype elements per position besides K/V (mimo2: E, X, G_k rows)
    extra_positions: int | None = None     # positions its store holds past the context (None: 2 verify_rows)
    f32_elems: int = 0                     # of weight_elems, those the engine keeps in f32 whatever the run dtype
