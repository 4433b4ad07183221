"""``bloomery plan`` for a deepseek41 (DeepSeek V4.1) target, as its engine holds it
(``kernels/families/deepseek41/model.py``, ``Deepseek41Target.__init__``), from the GGUF's header only (the family is
GGUF-only: ``reader_gguf.deepseek41_from_gguf`` reads no weight). Each term is one line of that constructor, e the
run dtype's bytes, cap = max_len + rows (the verify's rows), L layers, d the K = V head width:

    self.t[n]      every ``model.layers.{l < L}.*`` tensor: F32_SUFFIXES in f32, the rest in e    (weight_elems, f32)
                   (the engram sites' tables ``engram.{embed, wkv, k_norm, q_norm}`` among them: their bytes are
                   printed as a note; the norms end in ``norm.weight``: f32)
    self.embed     [V, H] e                                                                         (weight_elems)
    self.head      [V, H] e: ``lm_head`` or, tied, its own cast copy of the embedding          (core's tied rule:
                   the reader hands every tensor as float32, ``embed_dtype`` "f32": on the host an f32 run shares
                   one storage for embed and head, a bf16 run casts two copies)
    self.final_w   [H] f32                                                                    (weight_elems, f32)
    self.cache[l]  ``V4Cache.empty(cap, "sliding", d, di)``: kv [cap, d] e at EVERY layer, not capped at the
                   window W (the cache is by position)                      AttnGroup(L, 1 K = V head, d, no V)
    self.stream_cache[l]  ``StreamCache.empty(cap, d, gated)`` ONLY at a kv source (streams[l].kv_source == l):
                   k [cap, d] e, and z [cap, d] e when the source has ``compressor.gate_proj``   (position_elems)
    self.routings  one ``Routing`` per MoE layer, replaced every pass                (held_row_bytes, per row)

So per position p_t = e (L d + sum over kv sources s of (1 + gated_s) d), no key positions (the engine holds no
position tensor: ``key_position_bytes`` 0) and no RoPE tables (the angles are made per pass).
Transient (``plan.core.workspace``): the taps [L + 1, R, S + 1, H] e hold the S hyper-connection streams AND the
lagged mix's lag row (``pack_lag``), so the residual streams are S + 1; the sink attention's scores
(SCORE_BYTES); the routed experts' gathered tiles.
The draft: the seed engine's V4.1 DSpark (a ``dflash``-arch GGUF), counted as deepseek4's DSpark
(``deepseek4.plan.deepseek4_dspark_draft``: the same kernel holds it).
"""

from __future__ import annotations

from math import prod
from pathlib import Path

from bloomery_gates.errors import InputError

from ...plan.types import AttnGroup, Experts, PlanDraft, PlanModel, routing_held
from ..deepseek4.plan import SCORE_BYTES

FAMILY = "deepseek41"
TOP = "model."


def weight_terms(spec) -> dict[str, int]:
    """The engine's weights by how it holds them (module doc): run-dtype elements (f32 ones included, as core
    counts them), the f32 elements, the embedding's elements, the engram tables' elements."""
    from bloomery_gates.kernels.families.deepseek4.model import F32_SUFFIXES

    out = {"elems": 0, "f32": 0, "embed": 0, "engram": 0}
    for n in spec.tensors:
        numel = prod(spec.tensors.shape_of(n))
        if n.startswith(TOP + "layers."):
            if int(n.split(".")[2]) >= spec.num_layers:
                continue                                           # not loaded (no MTP in a V4.1 file)
            out["elems"] += numel
            out["f32"] += numel if n.endswith(F32_SUFFIXES) else 0
            out["engram"] += numel if ".engram." in n else 0
        elif n == TOP + "norm.weight":
            out["elems"] += numel
            out["f32"] += numel
        elif n == TOP + "embed_tokens.weight":
            out["elems"] += numel
            out["embed"] = numel
        elif n == "lm_head.weight":
            out["elems"] += numel
    return out


def stream_cache_elems(spec) -> int:
    """Elements per position of the StreamCaches: k [d] (+ z [d] when gated) at each kv source layer only."""
    d = spec.attn.head_dim
    return sum(d * (1 + (f"{TOP}layers.{l}.self_attn.compressor.gate_proj.weight" in spec.tensors))
               for l in range(spec.num_layers) if (s := spec.stream(l)) is not None and s.kv_source == l)


def deepseek41_gguf_target(path: Path, inv_model) -> PlanModel:
    """The plan model of a deepseek41 GGUF (module doc)."""
    from .reader_gguf import deepseek41_from_gguf

    spec = deepseek41_from_gguf(path)
    w, a, moe, L = weight_terms(spec), spec.attn, spec.moe, spec.num_layers
    ratios = [s.ratio for s in spec.streams if s is not None]
    kv_sources = [l for l in range(L) if (s := spec.stream(l)) is not None and s.kv_source == l]
    meta = {"arch": FAMILY, "layer_types": list(spec.layer_types), "kv_sources": kv_sources,
            "engram_elems": w["engram"]}
    notes = (f"{FAMILY}: the engine keeps every position of its window layers (kv: cap x {a.head_dim} a layer), "
             f"not capped at the window of {a.window}; stream caches at the kv sources {kv_sources} only",)
    if w["engram"]:
        notes += (f"{FAMILY}: the engram sites' tables hold {w['engram']:,} elements of the weights",)
    return PlanModel(path.name, FAMILY, "gguf", spec.hidden_size, a.num_heads, spec.vocab_size,
                     max(moe.top_k * moe.expert_ff, moe.shared_ff or 0), spec.max_position, w["elems"],
                     inv_model.total_bytes, spec.tie_word_embeddings, w["embed"],
                     (AttnGroup(L, 1, a.head_dim, None, 0),), 0, (), 0, 0, meta=meta,
                     embed_dtype="f32", rope_tables=0, f32_elems=w["f32"],
                     experts=Experts(moe.top_k, moe.expert_ff, False), notes=notes,
                     residual_streams=spec.hc.count + 1, position_elems=stream_cache_elems(spec),
                     score_bytes=SCORE_BYTES, entry_rate=min(ratios, default=0),
                     held_row_bytes=routing_held(moe, L), key_position_bytes=0)


def deepseek41_dspark_draft(path: Path, target: PlanModel) -> PlanDraft:
    """The seed engine's V4.1 DSpark GGUF (arch ``dflash``) beside a deepseek41 target: deepseek4's DSpark term (its
    stages' weights, f32 by F32_SUFFIXES; per position each stage's context K = V [d] and an int64 key position,
    cap = max_len + B + 2; a verify of B + 1 rows); the file has no embedding / head of its own."""
    from ...inventory.read import _HeaderGGUF
    from ..deepseek4.plan import deepseek4_dspark_draft
    from .reader_dspark import NOT_IN_52

    if target.family != FAMILY:
        raise InputError(path, f"a V4.1 DSpark draft needs a deepseek41 target, not {target.family}")
    own = sorted({t.name for t in _HeaderGGUF(path).reader.tensors} & set(NOT_IN_52))
    if own:
        raise InputError(path, f"holds {own[0]}: {NOT_IN_52[own[0]]} (a DSV4 DSpark, FAMILIES_MOE.md 5.1); expected "
                               "the V4.1 DSpark (5.2) for a deepseek41 target")
    return deepseek4_dspark_draft(path, target)
