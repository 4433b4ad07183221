"""The V4 MTP block from llama.cpp's GGUF: ``Deepseek4MTPSpec`` (names ``mtp.0.*``, as ``reader_mtp`` spells them)
from the separate MTP file the converter writes with ``--mtp`` (``mtp-<name>.gguf``), or from nextn blocks in the
target's own file.

The file (docs/FAMILIES_MOE.md 4.4; ``deepseek4.cpp`` ``load_arch_tensors`` with ``mtp_only``): arch deepseek4,
block_count L + 1, nextn_predict_layers 1, every key the target's (``reader_gguf.read_keys`` on both, compared),
compress_ratios[L] = 0. Tensors: token_embd / output_norm / output (the converter keeps them; they must equal the
target's, which our engine drafts with: compared where they are small enough to read, <= 64 MiB), root
``output_hc_{fn,base,scale}`` = the MTP's own HC head, and blk.L:

    nextn.eh_proj [H, 2H]                -> mtp.0.e_proj = columns [0, H), mtp.0.h_proj = [H, 2H)
    nextn.{enorm, hnorm, shared_head_norm} -> mtp.0.{enorm, hnorm, norm}
    the block (attention of a sliding layer, a non-hash MoE, hc_attn / hc_ffn) -> mtp.0.* (``gguf_names.BLOCK``)

Named errors (exit 2): not arch deepseek4 / not one nextn block (``Refused``); a key that differs from the
target's or a token_embd / output unequal to the target's (``Mismatch``); a compressor or hash table in the block
(``Refused``: llama.cpp asserts a sliding, non-hash MTP layer); a missing or misshapen tensor (``BadTensor``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import Mismatch, Refused
from bloomery_gates.spec import Deepseek4MTPSpec, Deepseek4Spec

from ...formats.gguf_file import GGUFFile
from ...formats.lazy import check_shapes
from .gguf_names import EH_PROJ, MTP_HEAD, MTP_KEEP, NEXTN
from .mtp_shapes import P, block_shapes
from .reader import SCALE
from .reader_gguf import Entry, GgufTable, block_entries, read_keys

SAME = ("layer", "attn", "moe", "hc", "swiglu_limit")
COMPARE_BYTES = 64 << 20


def _packed(shapes: dict[str, Any], target: Deepseek4Spec) -> dict[str, Any]:
    """The block's expert entries in the packed layout when the target's experts are MXFP4."""
    if not target.experts_mxfp4:
        return shapes
    E, H, ff = target.moe.num_experts, target.hidden_size, target.moe.expert_ff
    x = P + "mlp.experts."
    for name, rows, k in ((x + "gate_up_proj", 2 * ff, H), (x + "down_proj", H, ff)):
        shapes[name] = ((E, rows, k // 2), "(packed e2m1 codes)")
        shapes[name + SCALE] = ((E, rows, k // 32), "(e8m0 scales)")
    return shapes


def _same_rows(mtp: GgufTable, g: str, target: Deepseek4Spec, hf: str) -> None:
    t = target.tensors
    if hf not in t:
        hf = "model.embed_tokens.weight"
    n = 1
    for d in t.shape_of(hf) if hasattr(t, "shape_of") else t[hf].shape:
        n *= d
    if n * 4 > COMPARE_BYTES:
        return
    if not torch.equal(mtp.floats[g].float(), t[hf].float()):
        raise Mismatch(f"MTP file {mtp.f.path} vs target {target.source}",
                       f"tensor {g} differs from the target's {hf}; llama.cpp drafts with the MTP file's own, this "
                       "harness with the target's: expected the same weights (the converter copies them)")


def deepseek4_mtp_from_gguf(path: Path, target: Deepseek4Spec) -> Deepseek4MTPSpec:
    """The MTP block in the GGUF ``path`` for the deepseek4 ``target`` (module docstring)."""
    if target.family != "deepseek4":
        raise Mismatch(f"MTP file {path} vs target {target.source}",
                       f"target family {target.family!r}; this MTP block is the deepseek4 (DeepSeek V4) layout")
    f = GGUFFile(path)
    cfg, fields, L, blocks = read_keys(f)
    if blocks - L != 1:
        raise Refused(path, f"nextn_predict_layers {blocks - L}; expected one V4 MTP block (the converter's --mtp "
                            "file: block_count = trunk layers + 1)")
    if target.num_layers != L:
        raise Mismatch(f"MTP file {path} vs target {target.source}", f"block_count {blocks} - nextn 1 = {L} trunk "
                       f"layers; the target has {target.num_layers}")
    for k in SAME:
        if fields[k] != getattr(target, k):
            raise Mismatch(f"MTP file {path} vs target {target.source}", f"{k} {fields[k]} differs from the "
                           f"target's {getattr(target, k)}")
    names = set(f.tensor_names())
    if f"blk.{L}.{EH_PROJ}" not in names:
        raise Refused(path, f"no blk.{L}.{EH_PROJ}: llama.cpp finds no MTP block in this file (nextn layers 0)")
    for n in sorted(names):
        if n.startswith(f"blk.{L}.") and ("compressor" in n or "indexer" in n or "tid2eid" in n):
            raise Refused(path, f"{n}: the V4 MTP block is a sliding, non-hash layer (llama.cpp's graph asserts it)")
    fields["experts_mxfp4"] = False
    table: dict[str, Entry] = block_entries(f, L, P, fields)
    if fields["experts_mxfp4"] != target.experts_mxfp4:
        raise Mismatch(f"MTP file {path} vs target {target.source}", "MXFP4 experts in one file and not the other")
    raw = f.tensors(lambda s: s)
    H = target.hidden_size
    g = f"blk.{L}.{EH_PROJ}"
    if g in names:
        sh = raw.shape_of(g)
        if sh != (H, 2 * H):
            raise Mismatch(raw.label(g), f"shape {list(sh)}; expected [{H}, {2 * H}] ([e | h], embedding first)")
        table[P + "e_proj.weight"] = ((g,), "float", lambda t: t[0][:, :H].contiguous(), (H, H), raw.dtype_of(g))
        table[P + "h_proj.weight"] = ((g,), "float", lambda t: t[0][:, H:].contiguous(), (H, H), raw.dtype_of(g))
    for src, dst in NEXTN.items():
        if f"blk.{L}.{dst}" in names:
            table[P + src] = ((f"blk.{L}.{dst}",), "float", None, raw.shape_of(f"blk.{L}.{dst}"),
                              raw.dtype_of(f"blk.{L}.{dst}"))
    for src, dst in MTP_HEAD.items():
        if dst in names:
            table[P + src] = ((dst,), "float", None, raw.shape_of(dst), raw.dtype_of(dst))
    tensors = GgufTable(f, table)
    check_shapes(tensors, _packed(block_shapes(target), target), path)
    for keep, hf in zip(MTP_KEEP, ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"), strict=True):
        if keep == "output_norm.weight":
            continue                                    # the trunk's final norm: the MTP graph does not read it
        if keep not in names:
            raise Mismatch(f"{path}: tensor {keep}", "missing; llama.cpp's MTP model needs it (the converter keeps "
                                                     "token_embd, output_norm and output in the MTP file)")
        _same_rows(tensors, keep, target, hf)
    return Deepseek4MTPSpec(kind="deepseek4-mtp", source=Path(path), source_format="gguf", num_layers=1,
                            vocab_size=target.vocab_size, tensors=tensors)
