"""``bloomery plan`` terms of a glm5next target and its in-file NextN layer, from config / GGUF keys and tensor
headers only. No engine exists yet (issue 25): these are the terms such an engine must hold.

Target (e the run dtype's bytes; n_s = hc_mult streams):

    MLA latent KV per position   e L_mla kv_lora          (NoPE: no rope part; the latent is the whole cache row)
    indexer inputs per position  e L_full H               (the normed block inputs [cap, H] the DSA indexer's keys
                                                          are made from on every pass, on its full-indexer layers;
                                                          a shared layer reuses the previous full layer's choice)
    attention scores             a pass of r rows ending at key L scores [r, L] (``keys_to_end``: MLA reads the
                                 latent up to the pass's end, not the whole cache) and holds the indexer's pool
                                 scores [r, L / kpool] f32 and token mask [r, L + 1] bool (``index_pool``)
    KDA state per slot           L_kda (4 h d d + e (k - 1) 3 h d)   (S [h, d, d] f32, the q/k/v conv tails)
    KDA prefill scratch          the chunked form's decay matrices per chunk of C = 64 rows (``kda_scratch``)
    HC activations               each layer's output is n_s rows of H (``residual_streams``)
    active experts               per token, elements L_sparse (k 3 H ff + 3 H ff n_shared + E H)
                                 (``meta["active_expert_elems"]``)

Draft: the NextN block(s) in the target's own file (model.layers.{n}.* / blk.{n}.*), one MLA layer's latent KV
(kv heads 1, width kv_lora, no V) and its indexer inputs (H per position: ``store_elems``) over max_len + width + 2
positions (the NextN's cap, width = ``kernels.families.glm5next.mtp.WIDTH``), and a verify of 4 rows; no rope.
The weights the engine keeps in f32 (router, mHC base / scale, KDA conv, dt_bias, A_log: ``F32_SUFFIXES``) are
``f32_elems``.
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_gates.errors import InputError
from bloomery_gates.kernels.families.glm5next.model import F32_SUFFIXES
from bloomery_gates.kernels.families.glm5next.mtp import WIDTH as NEXTN_WIDTH
from bloomery_gates.registry import family

from ...plan.types import AttnGroup, Experts, PlanDraft, PlanModel, Recurrent, _elems, _embed_dtype, routing_held

FAMILY = "glm5next"
VERIFY_ROWS = 4
KDA_CHUNK = 64                   # kernels.ops.kda.kda_chunked's default chunk (the engine's prefill)
NOTES = (f"{FAMILY}: modelled on kernels/families/glm5next (the glm5next-mtp gate's engine); measured by "
         "`bloomery plan ... --measure` (docs/PLAN.md: within 0.4% of the H200's peak on the fixture)",
         f"{FAMILY} draft path: {family(FAMILY).draft_path}")


def active_expert_elems(f: dict[str, Any]) -> int:
    H, moe = f["layer"].hidden_size, f["moe"]
    sparse = sum(t == "sparse" for t in f["mlp_types"])
    return sparse * (moe.top_k * 3 * H * moe.expert_ff + 3 * H * (moe.shared_ff or 0) + moe.num_experts * H)


def kda_scratch(h: int, d: int, chunk: int = KDA_CHUNK) -> tuple[int, int, int, int]:
    """The chunked KDA prefill (``kernels.ops.kda._chunked``), per chunk: the float64 differences [h, C, C, d] and
    their masked copy, then exp in float64 and its float32 D (20 h C^2 d bytes; from the second chunk on the
    previous chunk's differences and D are still held while the next chunk's two f64 are made: 28 h C^2 d), the
    float32 A and M [h, C, C], the float64 G [h, C, d] twice and the float32 rows of the solve (~6 [h, C, d]), the
    identity [C, C]; per row padded to C: q, k, v, g in float32 and three float32 [h, d] rows (28 h d)."""
    u, small = h * chunk * chunk * d, 8 * h * chunk * chunk + 40 * h * chunk * d + 4 * chunk * chunk
    return chunk, 20 * u + small, 28 * u + small, 28 * h * d


def _model(path: Path, inv, fmt: str, f: dict[str, Any], vocab: int, maxpos: int, tied: bool,
           meta: dict[str, Any]) -> PlanModel:
    types, mla, dsa, kda, moe = f["layer_types"], f["mla"], f["dsa"], f["kda"], f["moe"]
    n_mla = sum(t == "indexed_attention" for t in types)
    n_full = sum(t == "full" for t in dsa.types)
    attn = tuple(g for g in (AttnGroup(n_mla, 1, mla.kv_lora_rank, None, 0),
                             AttnGroup(n_full, 1, f["layer"].hidden_size, None, 0)) if g.layers)
    n_kda, h, d = len(types) - n_mla, kda.num_heads, kda.head_dim
    rec = (Recurrent("kda", n_kda, h * d * d, (kda.conv_kernel - 1) * 3 * h * d, 3 * h * d),) if n_kda else ()
    L = f["layer"]
    meta = {**meta, "hc": {"count": f["hc"].count, "sinkhorn_iters": f["hc"].sinkhorn_iters},
            "active_expert_elems": active_expert_elems(f), "mla_layers": n_mla, "kv_lora": mla.kv_lora_rank,
            "indexer_full_layers": n_full}
    draft = _elems(inv, ("mtp_nextn",))
    f32 = sum(prod(t.shape) for t in inv.tensors if t.name.endswith(F32_SUFFIXES) and t.group != "mtp_nextn")
    return PlanModel(path.name, FAMILY, fmt, L.hidden_size, L.num_heads, vocab,
                     max(L.intermediate_size, moe.top_k * moe.expert_ff, moe.shared_ff or 0), maxpos,
                     _elems(inv, exclude=("mtp_nextn",)), inv.total_bytes, tied, _elems(inv, ("token_embd",)), attn, 0,
                     rec, draft, f["nextn_layers"] if draft else 0, meta=meta,
                     embed_dtype=_embed_dtype(inv) if fmt == "hf" else "f32",
                     experts=Experts(moe.top_k, moe.expert_ff), residual_streams=f["hc"].count, notes=NOTES,
                     held_row_bytes=routing_held(moe, sum(t == "sparse" for t in f["mlp_types"])),
                     f32_elems=f32, keys_to_end=True, prefill_scratch=kda_scratch(h, d) if n_kda else (0, 0, 0, 0),
                     index_pool=dsa.kpool if n_full else 0)


def glm5next_target(path: Path, inv, c: Cfg, where: Path) -> PlanModel:
    """An HF glm5_next checkpoint (``c``: its text config), by the reader's own key rules."""
    from .reader import read_shapes

    return _model(path, inv, "hf", read_shapes(c), c.int("vocab_size"), c.int("max_position_embeddings", 1 << 20),
                  c.bool("tie_word_embeddings", False), {"model_type": str(c.get("model_type")), "config": str(where)})


def glm5next_gguf_target(path: Path, inv) -> PlanModel:
    """A glm5-next GGUF, through the loader's own reader (keys and tensor infos)."""
    from .reader_gguf import glm5next_from_gguf

    s = glm5next_from_gguf(path)
    f = {k: getattr(s, k) for k in ("layer", "layer_types", "mlp_types", "mla", "dsa", "kda", "moe", "hc",
                                    "nextn_layers")}
    return _model(path, inv, "gguf", f, s.vocab_size, s.max_position, s.tie_word_embeddings, {"arch": "glm5-next"})


def glm5next_draft(path: Path, target: PlanModel, own: PlanModel | None) -> PlanDraft:
    """The NextN layer in the target's own file (``own`` None), or in a glm5next file of the same trunk."""
    src = target if own is None else own
    if own is not None and (own.family, own.hidden, own.vocab) != (FAMILY, target.hidden, target.vocab):
        raise InputError(path, "expected the target's own glm5next file (or one with the same trunk) for its NextN")
    if not src.draft_elems:
        raise InputError(path, "holds no NextN layer (model.layers.{n}.* / blk.{n}.nextn.*); expected a glm5next "
                               "file with num_nextn_predict_layers > 0")
    return PlanDraft(path.name, "mtp", src.draft_elems, src.draft_layers, 1, target.meta["kv_lora"], 0,
                     VERIFY_ROWS, target.vocab, v_head_dim=0, store_elems=target.hidden,
                     extra_positions=NEXTN_WIDTH + 2)
