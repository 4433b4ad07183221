"""``bloomery plan`` terms of a qwen4exp target and its MTP head, from config / GGUF keys and tensor headers only.
No engine exists yet (issue 25): these are the terms such an engine must hold, counted from the shapes.

Target (e the run dtype's bytes; H hidden; n_s = hc count streams):

    KV per position     e L_full nkv 2 d          the gated-attention layers (the QSA mask selects reads, not storage)
    recurrent per slot  L_gdn (4 nv dk dv + e (k - 1) C),  C = 2 nk dk + nv dv      (GDN state f32 and conv tail)
    QSA selection       a pass of r rows ending at key L holds the pool scores [r, L / ratio] f32 and the token mask
                        [r, L + 1] bool (``index_pool``); its scores span the whole cache [r, cap], and the causal
                        mask [r, cap] with its selected copy and the last selection live through the whole pass
                        (``masks_held``: in the MLP and head phases too)
    HC activations      each layer's output is n_s rows of H (``residual_streams``: the workspace taps n_s x)
    active experts      per token, elements L (k 3 H ff + 3 H sff + E H + H): the k routed experts' gate/up/down,
                        the shared expert, the router and the shared gate (``meta["active_expert_elems"]``)

Draft (the separate MTP GGUF, or the HF ``mtp.*`` layer): its own elements (the file's token_embd / output when it
does not borrow the target's: ``own_embed``), 1 layer of the target's KV shape, a verify of 4 rows, and per
position the n_s H raw stream rows it is fed (``store_elems``).
"""

from __future__ import annotations

from math import prod
from pathlib import Path

from bloomery_cli.formats.config import Cfg
from bloomery_gates.errors import InputError, Mismatch
from bloomery_gates.registry import family
from bloomery_gates.spec import HCShape, HybridShape, LayerShape, MoEShape, QSAShape

from ...plan.types import AttnGroup, Experts, PlanDraft, PlanModel, Recurrent, _elems, _embed_dtype, routing_held

FAMILY = "qwen4exp"
VERIFY_ROWS = 4                  # bloomery's qwen4exp MTP windows are 4 rows (issue 25)
NOTES = (f"{FAMILY}: these terms are counted from its shapes, not measured (no bench runs this family yet)",
         f"{FAMILY} draft path: {family(FAMILY).draft_path}; gated (qwen4exp-mtp) in the HF mtp.* layout only: the "
         "separate MTP GGUF is read and planned here, not run")


def active_expert_elems(H: int, moe: MoEShape, layers: int) -> int:
    """Weight elements a token reads in the MoE layers: k routed experts + the shared one + router + shared gate."""
    sff = moe.shared_ff or 0
    return layers * (moe.top_k * 3 * H * moe.expert_ff + 3 * H * sff + moe.num_experts * H + (H if sff else 0))


def _model(path: Path, inv, fmt: str, layer: LayerShape, hy: HybridShape, moe: MoEShape, hc: HCShape,
           qsa: QSAShape, vocab: int, maxpos: int, tied: bool, meta: dict) -> PlanModel:
    n = len(hy.layer_types)
    lin = sum(hy.is_linear(i) for i in range(n))
    nk, nv = hy.linear_num_key_heads, hy.linear_num_value_heads
    dk, dv, k = hy.linear_key_head_dim, hy.linear_value_head_dim, hy.linear_conv_kernel_dim
    C = 2 * nk * dk + nv * dv
    rec = (Recurrent("deltanet", lin, nv * dk * dv, (k - 1) * C, C),) if lin else ()
    attn = (AttnGroup(n - lin, layer.num_kv_heads, layer.head_dim),) if n - lin else ()
    H = layer.hidden_size
    meta = {**meta, "hc": {"count": hc.count, "low_rank": hc.low_rank},
            "active_expert_elems": active_expert_elems(H, moe, n)}
    return PlanModel(path.name, FAMILY, fmt, H, layer.num_heads, vocab,
                     max(moe.top_k * moe.expert_ff, moe.shared_ff or 0), maxpos,
                     _elems(inv, exclude=("mtp_nextn",)), inv.total_bytes, tied, _elems(inv, ("token_embd",)), attn,
                     hy.rotary_dim, rec, _elems(inv, ("mtp_nextn",)), 1 if _elems(inv, ("mtp_nextn",)) else 0,
                     meta=meta, embed_dtype=_embed_dtype(inv) if fmt == "hf" else "f32",
                     experts=Experts(moe.top_k, moe.expert_ff), residual_streams=hc.count, notes=NOTES,
                     held_row_bytes=routing_held(moe, n),
                     index_pool=qsa.compress_ratio if n - lin else 0, masks_held=bool(n - lin))


def qwen4exp_target(path: Path, inv, c: Cfg, where: Path) -> PlanModel:
    """An HF qwen4_exp checkpoint (``c``: its text config), by the reader's own key rules."""
    from .reader import read_shapes

    layer, hy, moe, hc, qsa, _, _ = read_shapes(c)
    return _model(path, inv, "hf", layer, hy, moe, hc, qsa, c.int("vocab_size"),
                  c.int("max_position_embeddings", 32768), c.bool("tie_word_embeddings", False),
                  {"model_type": str(c.get("model_type")), "config": str(where)})


def qwen4exp_gguf_target(path: Path, inv) -> PlanModel:
    """A qwen4exp GGUF: the trunk (the loader's reader), or the separate MTP file (one nextn block, no trunk), which
    is planned as a draft only (``draft_kind`` "mtp", its keys read; checked against a target by ``qwen4exp_draft``)."""
    from bloomery_cli.formats.gguf_file import GGUFFile

    from .reader_gguf import A, gguf_cfg, qwen4exp_from_gguf, shared_shapes

    if inv.tensors and all(t.group == "mtp_nextn" or t.block is None for t in inv.tensors):
        c = gguf_cfg(GGUFFile(path))
        blocks = c.int(A + "block_count")
        layer, moe, hc = shared_shapes(c)
        names = {t.name for t in inv.tensors}
        return PlanModel(path.name, FAMILY, "gguf", layer.hidden_size, layer.num_heads, c.int(A + "vocab_size"), 0,
                         0, 0, inv.total_bytes, True, _elems(inv, ("token_embd",)), (), 0,
                         draft_elems=sum(prod(t.shape) for t in inv.tensors), draft_layers=1, draft_kind="mtp",
                         meta={"arch": "qwen4exp", "mtp_file": True, "block": blocks - 1,
                               "hc": {"count": hc.count, "low_rank": hc.low_rank},
                               "borrows": "token_embd.weight" not in names}, residual_streams=hc.count, notes=NOTES)
    s = qwen4exp_from_gguf(path)
    return _model(path, inv, "gguf", s.layer, s.hybrid, s.moe, s.hc, s.qsa, s.vocab_size, s.max_position,
                  s.tie_word_embeddings, {"arch": "qwen4exp"})


def qwen4exp_draft(path: Path, target: PlanModel, own: PlanModel | None) -> PlanDraft:
    """The MTP head: the separate MTP GGUF (``own``: it read as a target), or the HF ``mtp.*`` layer of the target."""
    if own is None or not own.meta.get("mtp_file"):
        src = target if own is None else own
        if not src.draft_elems:
            raise InputError(path, "holds no qwen4exp MTP tensors; expected the separate MTP GGUF (one nextn block, "
                                   "docs/FAMILIES_MOE.md 6) or an HF directory with mtp.* tensors")
        elems, own_embed = src.draft_elems, False
    else:
        if (own.hidden, own.meta["hc"]) != (target.hidden, target.meta.get("hc")):
            raise Mismatch(path, f"hidden {own.hidden} / hc {own.meta['hc']}; the target has {target.hidden} / "
                                 f"{target.meta.get('hc')}")
        if own.meta["block"] != sum(g.layers for g in target.attn) + sum(r.layers for r in target.recurrent):
            raise Mismatch(path, f"its nextn block is blk.{own.meta['block']}; expected the target's layer count")
        elems, own_embed = own.draft_elems, not own.meta["borrows"]
    g = target.attn[0]
    return PlanDraft(path.name, "mtp", elems, 1, g.kv_heads, g.head_dim, target.rotary_dim, VERIFY_ROWS, target.vocab,
                     own_embed=own_embed, store_elems=target.residual_streams * target.hidden)
