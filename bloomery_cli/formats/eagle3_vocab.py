"""The EAGLE-3 draft vocabulary and embedding of a speculators checkpoint (``formats.eagle3``).

d2t [Vd] (int64; int32 accepted): draft id d proposes target id d + d2t[d] (speculators'
``build_vocab_mappings_from_distribution``: the chosen target ids sorted, minus arange). Every target id must
lie in 0..V-1 and be distinct. t2d [V] (bool; uint8 accepted), optional: True exactly at those target ids.
Without d2t the draft vocabulary must be the target's (draft id = target id); with draft_vocab_size = V a
d2t other than all zeros is refused (speculators builds no mapping then, so the file is ambiguous).

embed_tokens.weight, when shipped (speculators saves the verifier's embedding with the draft), must equal
the target's model.embed_tokens.weight (the target's rounded to the draft's dtype when that is narrower), as
vLLM checks before it shares the target's table: the kernels draft with the target's embedding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from bloomery_gates.errors import BadTensor, InputError, Refused
from bloomery_gates.spec import ModelSpec

INDEX_DTYPES = {"d2t": ("I64", "I32"), "t2d": ("BOOL", "U8")}


def read_index_tensor(tensors, name: str, shape: tuple[int, ...], why: str) -> torch.Tensor:
    """An integer / bool tensor (not a weight: the float reader refuses these dtypes), checked by header first."""
    label = tensors.label(name)
    dtype = tensors.dtype_of(name)
    if dtype not in INDEX_DTYPES[name]:
        raise BadTensor(label, f"dtype {dtype}; expected one of {', '.join(INDEX_DTYPES[name])}")
    got = tensors.shape_of(name)
    if tuple(got) != tuple(shape):
        raise BadTensor(label, f"shape {list(got)}, expected {list(shape)} {why}")
    try:
        with safe_open(str(tensors.file_of(name)), framework="pt") as f:
            return f.get_tensor(name)
    except (OSError, RuntimeError, MemoryError, SafetensorError) as exc:
        raise InputError(tensors.file_of(name), f"cannot read tensor {name}: {exc}") from None


def draft_to_target(tensors, draft_vocab: int, vocab: int, where: Path) -> torch.Tensor | None:
    """d2t as int64 [Vd] (None: the draft vocabulary is the target's), checked against t2d when present."""
    if "d2t" not in tensors:
        if draft_vocab != vocab:
            raise BadTensor(f"{where}: tensor d2t", f"missing; expected [{draft_vocab}] int64 offsets (target id = "
                                                    f"draft id + d2t[draft id]) since draft_vocab_size {draft_vocab} "
                                                    f"!= the target vocab {vocab}")
        if "t2d" in tensors:
            raise BadTensor(f"{where}: tensor t2d", "present without d2t; expected both or neither")
        return None
    d2t = read_index_tensor(tensors, "d2t", (draft_vocab,), "[draft_vocab_size]").long()
    if draft_vocab == vocab and bool(d2t.any()):
        raise Refused(tensors.label("d2t"), "nonzero while draft_vocab_size equals the target vocab (speculators "
                                            "keeps no mapping then); expected all zeros or no d2t")
    targets = torch.arange(draft_vocab) + d2t
    out = targets[(targets < 0) | (targets >= vocab)]
    if out.numel():
        raise BadTensor(tensors.label("d2t"), f"maps draft ids to target ids {out[:4].tolist()} outside 0..{vocab - 1}")
    if torch.unique(targets).numel() != draft_vocab:
        raise BadTensor(tensors.label("d2t"), "maps two draft ids to one target id; expected distinct target ids")
    if "t2d" in tensors:
        t2d = read_index_tensor(tensors, "t2d", (vocab,), "[vocab_size] (the target's)").bool()
        mine = torch.zeros(vocab, dtype=torch.bool)
        mine[targets] = True
        if not torch.equal(mine, t2d):
            raise BadTensor(tensors.label("t2d"), f"marks {int(t2d.sum())} target ids, {int((mine & ~t2d).sum())} of "
                                                  "d2t's targets unmarked; expected True exactly at the target ids "
                                                  "d2t maps to")
    return d2t


def check_embedding(tensors, target: ModelSpec, where: Path) -> None:
    """A shipped embed_tokens.weight must be the target's embedding (at the draft's storage precision)."""
    if "embed_tokens.weight" not in tensors:
        return
    want = target.tensors["model.embed_tokens.weight"]
    shape = tensors.shape_of("embed_tokens.weight")
    if tuple(shape) != tuple(want.shape):
        raise BadTensor(tensors.label("embed_tokens.weight"), f"shape {list(shape)}, expected {list(want.shape)} "
                                                              "[vocab_size, hidden_size] (the target's embedding)")
    own = tensors["embed_tokens.weight"]
    narrow = own.dtype if own.element_size() < want.element_size() else want.dtype
    if not torch.equal(own.to(narrow), want.to(narrow)):
        raise Refused(tensors.label("embed_tokens.weight"), "differs from the target's model.embed_tokens.weight; "
                                                            "the kernels draft with the target's embedding (a "
                                                            "draft-own embedding table is not implemented)")
