"""``bloomery plan`` for a deepseek4 (DeepSeek V4) target, as its engine holds it (kernels/families/deepseek4/model.py),
from config.json (the reader's own key rules, ``reader.read_shapes``) and the safetensors headers only.

Weights, per tensor as the engine loads it (the trunk's ``model.layers.{l < L}.*``, embed, head, final norm, HC head;
the in-file MTP ``mtp.*`` is the draft's, not counted here), e the run dtype's bytes:

    packed experts (MXFP4)   their stored bytes: codes n/2 + e8m0 scales n/32 = 4.25 bits a weight   (fixed_bytes)
    tid2eid                  8 bytes an entry (int64)                                                (fixed_bytes)
    F32_SUFFIXES, final norm, HC head      4 bytes an element (f32_elems)
    everything else          e bytes an element

State per position (``kernels.ops.v4_attention.V4Cache``, run dtype; no RoPE tables: the angles are made per pass):

    every layer   kv [d]            (one K = V head: an attention group of 1 head, width d, no V)
    CSA layer     k, z [2 d] each and the indexer's ik, iz [2 di] each      (position_elems)
    HCA layer     k, z [d] each                                             (position_elems)

Transient: the general workspace over the S = hc_mult streams (``residual_streams``), with the routed experts'
gathered (or MXFP4-decoded) tiles (``plan.core.gathered``).
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_gates.errors import InputError

from ...plan.types import AttnGroup, Experts, PlanDraft, PlanModel, _embed_dtype

FAMILY = "deepseek4"
SCORE_BYTES = 12    # sink attention (kernels.ops.attention.sink_attention): the f32 scores, [scores ; sink] and its
#                     softmax alive at once, as mimo2's
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "_scale_inv")
F32_TOP = ("model.norm.weight", "model.hc_head.hc_fn", "model.hc_head.hc_base", "model.hc_head.hc_scale")


def weight_terms(inv, layers: int, tied: bool, fp4: bool) -> dict[str, int]:
    """The engine's weights by how it holds them: run-dtype elements (f32 ones included, as core counts them),
    f32 elements, fixed bytes (packed experts, int64 tables), the packed experts' bytes alone, the embedding's
    elements, the draft's (in-file MTP) elements."""
    from bloomery_gates.kernels.families.deepseek4.model import F32_SUFFIXES

    out = {"elems": 0, "f32": 0, "fixed": 0, "packed": 0, "embed": 0, "draft": 0}
    for t in inv.tensors:
        n, numel = t.name, prod(t.shape)
        if n.startswith("model.layers."):
            if int(n.split(".")[2]) >= layers:
                out["draft"] += numel
            elif fp4 and n.endswith(PACKED):
                out["fixed"] += numel                                   # uint8 bytes as stored
                out["packed"] += numel
            elif n.endswith(".tid2eid"):
                out["fixed"] += 8 * numel
            else:
                out["elems"] += numel
                out["f32"] += numel if n.endswith(F32_SUFFIXES) else 0
        elif n in F32_TOP:
            out["elems"] += numel
            out["f32"] += numel
        elif n == "model.embed_tokens.weight":
            out["elems"] += numel
            out["embed"] = numel
        elif n == "lm_head.weight" and not tied:
            out["elems"] += numel
        elif n.startswith("mtp."):
            out["draft"] += numel
    return out


def deepseek4_target(path: Path, inv, c: Cfg, where: Path) -> PlanModel:
    """The plan model of a deepseek4 HF checkpoint (``c``: its config), float or MXFP4 experts."""
    from .reader import experts_fp4, read_shapes

    f = read_shapes(c, experts_fp4(c, c))
    meta: dict[str, Any] = {"model_type": str(c.get("model_type")), "config": str(where)}
    return _plan(path, inv, f, "hf", c.int("vocab_size"), c.int("max_position_embeddings", 1 << 20),
                 c.bool("tie_word_embeddings", False), meta, _embed_dtype(inv))


def deepseek4_gguf_target(path: Path, inv_model) -> PlanModel:
    """The plan model of a llama.cpp deepseek4 GGUF: the shapes from its reader (HF names, MXFP4 experts packed; no
    weight read), counted as the HF layout's. The converter's MTP-only file (``mtp-<name>.gguf``) plans as a
    model whose weights are all draft (``_sidecar``)."""
    from types import SimpleNamespace

    from ...formats.gguf_file import GGUFFile
    from .reader_gguf import deepseek4_from_gguf

    f = GGUFFile(path)
    if "blk.0.attn_norm.weight" not in f.tensor_names():
        return _sidecar(path, f, inv_model)
    spec = deepseek4_from_gguf(path)
    rows = SimpleNamespace(tensors=[SimpleNamespace(name=n, shape=spec.tensors.shape_of(n)) for n in spec.tensors],
                           total_bytes=inv_model.total_bytes)
    f = {k: getattr(spec, k) for k in ("layer", "num_layers", "layer_types", "mlp_types", "attn", "moe", "hc",
                                       "mtp_layers", "experts_mxfp4")}
    return _plan(path, rows, f, "gguf", spec.vocab_size, spec.max_position, False, {"arch": "deepseek4"},
                 _embed_dtype(inv_model))


def _sidecar(path: Path, g, inv_model) -> PlanModel:
    """The MTP-only GGUF: its block's elements (packed experts at their bytes, as the HF FP4 layout counts them) and
    its HC head are the draft; token_embd / output_norm / output are the target's copies (the engine drafts with
    the target's), not counted."""
    from .gguf_names import MTP_HEAD, NEXTN
    from .reader_gguf import block_entries, read_keys

    _, f, L, _ = read_keys(g)
    table = block_entries(g, L, "mtp.0.", f)
    raw = g.tensors(lambda s: s)
    extra = [f"blk.{L}.{n}" for n in (*NEXTN.values(), "nextn.eh_proj.weight")] + list(MTP_HEAD.values())
    elems = sum(prod(e[3]) for e in table.values()) + sum(prod(raw.shape_of(n)) for n in extra if n in raw)
    a = f["attn"]
    return PlanModel(path.name, FAMILY, "gguf", f["layer"].hidden_size, a.num_heads,
                     raw.shape_of("token_embd.weight")[0], f["moe"].expert_ff, 0, 0, inv_model.total_bytes, False, 0,
                     (), 0, (), elems, 1, meta={"arch": "deepseek4", "mtp_only": True,
                                                "attn_head_dim": a.head_dim, "rope_dim": a.rope_dim})


def deepseek4_draft(path: Path, target: PlanModel, own: PlanModel | None) -> PlanDraft:
    """The V4 MTP block as the draft term: the target's own in-file block (``own`` None: the HF checkpoint, the
    plan's generic MTP term), or the converter's MTP-only GGUF beside a deepseek4 GGUF target. One sliding layer of
    one K = V head, verify rows 4 (width 3)."""
    head_dim = target.attn[0].head_dim if target.attn else target.hidden // target.heads
    if own is None:
        if not target.draft_elems:
            raise InputError(path, "is the target itself but holds no mtp.* tensors; expected a draft")
        return PlanDraft(path.name, "mtp", target.draft_elems, target.draft_layers or 1, 1, head_dim,
                         target.rotary_dim, 4, target.vocab)
    if own.family != FAMILY or not own.meta.get("mtp_only") or (own.hidden, own.vocab) != (target.hidden,
                                                                                             target.vocab):
        raise InputError(path, "expected the deepseek4 target's MTP file (the converter's mtp-<name>.gguf) or the "
                               "target itself")
    return PlanDraft(path.name, "mtp", own.draft_elems, 1, 1, own.meta["attn_head_dim"], target.rotary_dim, 4,
                     target.vocab)


def _plan(path: Path, inv, f: dict[str, Any], fmt: str, vocab: int, maxpos: int, tied: bool, meta: dict[str, Any],
          embed_dtype: str) -> PlanModel:
    L, a, moe, fp4 = f["layer"], f["attn"], f["moe"], f["experts_mxfp4"]
    w = weight_terms(inv, f["num_layers"], tied, fp4)
    n_csa, n_hca = f["layer_types"].count("csa"), f["layer_types"].count("hca")
    meta = {**meta, "experts_mxfp4": fp4, "layer_types": list(f["layer_types"]), "packed_expert_bytes": w["packed"]}
    notes = (f"{FAMILY}: routed experts kept in MXFP4 on the device (4.25 bits a weight: codes n/2 + e8m0 scales "
             f"n/32 bytes): {w['packed']:,} bytes ({w['packed'] * 64 // 17:,} in bf16)",) if fp4 else ()
    return PlanModel(path.name, FAMILY, fmt, L.hidden_size, a.num_heads, vocab,
                     max(moe.top_k * moe.expert_ff, moe.shared_ff or 0), maxpos,
                     w["elems"], inv.total_bytes, tied, w["embed"], (AttnGroup(f["num_layers"], 1, a.head_dim,
                                                                               None, 0),),
                     0, (), w["draft"], f["mtp_layers"] if w["draft"] else 0, meta=meta,
                     embed_dtype=embed_dtype, rope_tables=0, f32_elems=w["f32"],
                     experts=Experts(moe.top_k, moe.expert_ff, fp4), notes=notes, residual_streams=f["hc"].count,
                     fixed_bytes=w["fixed"],
                     position_elems=n_csa * (4 * a.head_dim + 4 * a.index_head_dim) + n_hca * 2 * a.head_dim,
                     score_bytes=SCORE_BYTES, entry_rate=min([a.csa_rate] * bool(n_csa) + [a.hca_rate] * bool(n_hca),
                                                             default=0))


def deepseek4_dspark_draft(path: Path, target: PlanModel) -> PlanDraft:
    """llama.cpp's DSV4 DSpark (a GGUF of arch ``dflash``, FAMILIES_MOE.md 5.1) as ``kernels.families.deepseek4.dspark``
    holds it, from the GGUF header: every tensor of the file in the run dtype but the float32 ones (``F32_SUFFIXES``
    under the reader's names); the target's embedding and head unless the file has its own; per position each
    stage's context K = V row [d] and an int64 key position (cap = max_len + B + 2); a verify of B + 1 rows."""
    from bloomery_gates.kernels.families.deepseek4.model import F32_SUFFIXES

    from ...inventory.read import _HeaderGGUF
    from .reader_dspark import internal_name

    h = _HeaderGGUF(path)
    if h.meta("general.architecture", None) != "dflash":
        raise InputError(path, "a GGUF draft of a deepseek4 target must be llama.cpp's DSpark (architecture dflash)")

    def key(k: str) -> int:
        v = h.meta(f"dflash.{k}", None)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(path, f"key dflash.{k}: {v!r}; expected a positive integer")
        return v
    elems = f32 = 0
    for t in h.reader.tensors:
        n = int(t.n_elements)
        elems += n
        gate_up = t.name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight"))    # joined: gate_up_proj
        f32 += n if not gate_up and internal_name(t.name).endswith(F32_SUFFIXES) else 0
    b = key("block_size")
    return PlanDraft(path.name, "dspark", elems, key("block_count"), 1, key("attention.key_length"), 0, b + 1,
                     target.vocab, v_head_dim=0, extra_positions=b + 2, f32_elems=f32)
