"""``bloomery plan`` for a mimo2 (MiMo-V2-Flash) target and its shipped MTP head, as this harness's engine
allocates them (``kernels/families/mimo2/model.py``, ``kernels/families/mimo2/mtp.py``). Config through
``formats.mimo2.read_shapes`` (the same key rules as the loader, config only), tensors from the headers.

Target, per layer l of kind k(l) (full or SWA, each with its own kv heads nkv_k; q/k heads of d, v heads of dv):

    KV per position   e nkv_k (d + dv)           k [nkv, cap, d] and v [nkv, cap, dv]: K and V bytes differ
    RoPE              2 tables (one per layer kind, its own theta) x cos/sin [cap, rot] f32, + int64 key positions
    weights           e x (trunk elements) + (4 - e) x (router weight and score bias, final norm: kept f32)

    The SWA layers keep every position (cap = max_len + R): their window is a mask on the reads, not a cap on the
    store, so the plan counts them as full-length KV (a note says so).

Draft (the L_m chained MTP layers, the trunk's SWA shape), per position of its store (cap = max_len + L_m + 2):

    e L_m nkv_swa (d + dv)  +  e (L_m + 2) H  +  2 x 4 rot  +  8     (K/V per layer; its recycled rows G_k, the
                                                                       embeddings E and target rows X; RoPE; keys)
    weights           e x (model.mtp.* elements); the embedding, head and final norm are the target's

Transient: the general workspace with sink attention's scores (``score_bytes``: the f32 scores, their masked copy,
the sink-extended copy and its softmax alive at once, and the cast) and the routed experts' gathered weights.
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError

from ...formats.config import Cfg
from ...plan.types import AttnGroup, Experts, PlanDraft, PlanModel, _elems, _embed_dtype

FAMILY = "mimo2"
SCORE_BYTES = 12          # per score alive at once in sink attention: the f32 scores, [scores ; sink] f32 and its
#                           softmax f32 (the cast to the run dtype comes after the concatenation is freed)
SWA_NOTE = ("mimo2: the engine keeps every position of its SWA layers (the window is a mask on the reads, not a cap "
            "on the KV store), so SWA KV is planned at full length, not capped at the window of {window}")


F32_SUFFIXES = {"hf": ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"),
                "gguf": ("ffn_gate_inp.weight", "exp_probs_b.bias")}
FINAL_NORM = {"hf": "model.norm.weight", "gguf": "output_norm.weight"}


def _f32_elems(inv_model, fmt: str = "hf") -> int:
    """The router weights and score biases and the final norm: the engine keeps them float32."""
    names = F32_SUFFIXES[fmt]
    return sum(prod(t.shape) for t in inv_model.tensors
               if t.group != "mtp_nextn" and (t.name.endswith(names) or t.name == FINAL_NORM[fmt]))


def mimo2_target(path: Path, inv_model, c: Cfg, where: Path) -> PlanModel:
    """The plan model of a mimo2 HF checkpoint (``c``: its config)."""
    from .reader import read_shapes

    layer, m = read_shapes(c, c.int("num_hidden_layers"))
    mtp_layers = len({t.name.split(".")[3] for t in inv_model.tensors if t.name.startswith("model.mtp.layers.")})
    return _plan_model(path, inv_model, layer, m, "hf", c.int("vocab_size"), c.int("max_position_embeddings"),
                       c.bool("tie_word_embeddings", False), mtp_layers,
                       {"model_type": str(c.get("model_type")), "config": str(where)})


def mimo2_gguf_target(path: Path, inv_model) -> PlanModel:
    """The plan model of a llama.cpp mimo2 GGUF: its shapes from the loader's own header reader (no weight read)."""
    from .reader_gguf import mimo2_from_gguf

    spec = mimo2_from_gguf(path)
    return _plan_model(path, inv_model, spec.layer, spec.mimo, "gguf", spec.vocab_size, spec.max_position,
                       spec.tie_word_embeddings, spec.mimo.mtp_layers, {"arch": "mimo2"})


def _plan_model(path: Path, inv_model, layer, m, fmt: str, vocab: int, maxpos: int, tied: bool, mtp_layers: int,
                meta: dict[str, Any]) -> PlanModel:
    groups = []
    for kind, a in (("full_attention", m.full), ("sliding_attention", m.swa)):
        n = sum(k == kind for k in m.layer_types)
        if n:
            groups.append(AttnGroup(n, a.num_kv_heads, a.head_dim, None, a.v_head_dim))
    inter = layer.intermediate_size
    experts = None
    if m.moe is not None:
        experts = Experts(m.moe.top_k, m.moe.expert_ff)
        inter = max(inter, m.moe.top_k * m.moe.expert_ff)
    notes = (SWA_NOTE.format(window=m.swa.window),) if "sliding_attention" in m.layer_types else ()
    meta = {**meta, "swa": {"layers": sum(k == "sliding_attention" for k in m.layer_types),
                            "kv_heads": m.swa.num_kv_heads, "head_dim": m.swa.head_dim,
                            "v_head_dim": m.swa.v_head_dim, "rotary_dim": m.swa.rotary_dim, "window": m.swa.window}}
    return PlanModel(path.name, FAMILY, fmt, layer.hidden_size, layer.num_heads, vocab, inter, maxpos,
                     _elems(inv_model, exclude=("mtp_nextn",)), inv_model.total_bytes, tied,
                     _elems(inv_model, ("token_embd",)), tuple(groups), m.full.rotary_dim, (),
                     _elems(inv_model, ("mtp_nextn",)), mtp_layers, meta=meta,
                     embed_dtype=_embed_dtype(inv_model) if fmt == "hf" else "f32",
                     rope_tables=len(set(m.layer_types)), f32_elems=_f32_elems(inv_model, fmt),
                     score_bytes=SCORE_BYTES, experts=experts, notes=notes)


def mimo2_draft(path: Path, target: PlanModel, own: PlanModel | None) -> PlanDraft:
    """The shipped MTP layers as the draft term: read from ``path`` (the target itself, or a mimo2 directory of
    the same trunk) by their headers. ``own``: ``path`` read as a target (``plan_model.read_target``), None when
    it is the target file itself."""
    if own is None:
        elems, layers = target.draft_elems, target.draft_layers
    else:
        if own.family != FAMILY or (own.hidden, own.vocab, own.meta.get("swa")) != (
                target.hidden, target.vocab, target.meta.get("swa")):
            raise InputError(path, "expected the target's own mimo2 directory (or one with the same trunk) for its "
                                   "MTP layers")
        elems, layers = own.draft_elems, own.draft_layers
    if not elems:
        raise InputError(path, "holds no model.mtp.layers.* tensors; expected the MTP layers of a mimo2 checkpoint")
    swa: dict[str, Any] = target.meta["swa"]           # the MTP layers take the trunk's SWA shape
    return PlanDraft(path.name, "mtp", elems, layers, swa["kv_heads"], swa["head_dim"], swa["rotary_dim"],
                     layers + 1, target.vocab, v_head_dim=swa["v_head_dim"], store_elems=(layers + 2) * target.hidden,
                     extra_positions=layers + 2)
