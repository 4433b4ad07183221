"""MTP / NextN heads of qwen38 targets (Qwen3.5/3.8, DRAFTERS.md section 1): ``MTPSpec`` from the HF
directory or the GGUF that ships them (usually the target's own checkpoint).

HF: tensors ``mtp.fc.weight`` [H, 2H], ``mtp.pre_fc_norm_embedding.weight`` / ``mtp.pre_fc_norm_hidden.weight``
/ ``mtp.norm.weight`` [H] and one gated full-attention decoder layer ``mtp.layers.0.*`` (the trunk's
full-attention tensors and shapes); config key ``mtp_num_hidden_layers`` (also under ``text_config``).
GGUF (llama.cpp, arch "qwen35"): ``qwen35.nextn_predict_layers`` = N, ``block_count`` = trunk + N, the
layer in ``blk.{trunk}.attn_*`` etc. and ``blk.{trunk}.nextn.{eh_proj, enorm, hnorm, shared_head_norm}``
with +1 baked into every norm; the qwen38 GGUF reader renames them to the HF names and takes the +1 off.

Named errors: no MTP in the file (``BadTensor``: no ``mtp.*`` tensors, or the config / GGUF key says 0
layers), MTP tensors present but not draftable (``BadTensor`` naming the first missing or misshapen
tensor, e.g. ``mtp.norm.weight``), a layer count other than the one the kernels implement, dedicated MTP
embeddings / head, or a linear-attention MTP layer (``Refused``), a file whose trunk does not fit the
target (``Mismatch``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import torch

from bloomery_cli.formats.lazy import check_shapes
from bloomery_gates.errors import BadConfig, BadTensor, Mismatch, Refused
from bloomery_gates.registry import keys
from bloomery_gates.spec import MTPSpec, Qwen38Spec

from ..families.qwen35moe.reader import qwen35moe_from_gguf, qwen35moe_from_hf
from ..families.qwen35moe.reader import tensor_shapes as qwen35moe_shapes
from ..families.qwen38.reader import gguf_name, qwen38_from_gguf, qwen38_from_hf, tensor_shapes

SUPPORTED_LAYERS = 1
MTP_FAMILIES = keys(mtp="in-file")     # the registry: the head ships in the target's own file


def mtp_shapes(target: Qwen38Spec) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor one MTP head must carry (HF names) with its shape, from the target's numbers (a qwen35moe
    target's MTP layer has the trunk's MoE FFN)."""
    H = target.hidden_size
    full = replace(target.hybrid, layer_types=("full_attention",))
    moe = getattr(target, "moe", None)
    table = tensor_shapes(target.layer, full, 1, target.vocab_size, True) if moe is None else \
        qwen35moe_shapes(target.layer, full, moe, 1, target.vocab_size, True)
    layer = {k.replace("model.layers.0.", "mtp.layers.0.", 1): v for k, v in table.items()
             if k.startswith("model.layers.0.")}
    return {"mtp.fc.weight": ((H, 2 * H), "[hidden_size, 2*hidden_size] (input [embedding ; hidden])"),
            "mtp.pre_fc_norm_embedding.weight": ((H,), "[hidden_size]"),
            "mtp.pre_fc_norm_hidden.weight": ((H,), "[hidden_size]"),
            **layer,
            "mtp.norm.weight": ((H,), "[hidden_size]")}


def _fits(own: Qwen38Spec, target: Qwen38Spec, where: Path) -> None:
    """The file's trunk numbers must be the target's (the MTP reads its hidden rows, embedding and head)."""
    checks = (("hidden_size", own.hidden_size, target.hidden_size), ("vocab", own.vocab_size, target.vocab_size),
              ("layer shape", own.layer, target.layer), ("rotary_dim", own.hybrid.rotary_dim, target.hybrid.rotary_dim),
              ("moe", getattr(own, "moe", None), getattr(target, "moe", None)))
    for what, a, b in checks:
        if a != b:
            raise Mismatch(f"MTP file {where} vs target {target.source}", f"{what} {a} != target's {b}; expected equal")


def mtp_from_file(path: Path, target: Qwen38Spec) -> MTPSpec:
    """The MTP head in ``path`` (an HF directory or a qwen35 GGUF), checked to fit ``target``."""
    if target.family not in MTP_FAMILIES:
        raise Mismatch(f"MTP file {path} vs target {target.source}",
                       f"target family {target.family!r}; the MTP head here is the qwen38 / qwen35moe "
                       "(Qwen3.5/3.6/3.8) layout")
    if Path(path).resolve() == Path(target.source).resolve():
        own = target
    elif target.family == "qwen35moe":
        own = qwen35moe_from_hf(path) if path.is_dir() else qwen35moe_from_gguf(path)
    else:
        own = qwen38_from_hf(path) if path.is_dir() else qwen38_from_gguf(path)
    if own.family != target.family:
        raise Mismatch(f"MTP file {path} vs target {target.source}", f"a {own.family} file; expected {target.family}")
    _fits(own, target, path)
    gguf = own.source_format == "gguf"
    key = ("qwen35moe" if own.family == "qwen35moe" else "qwen35") + ".nextn_predict_layers" if gguf \
        else "mtp_num_hidden_layers"
    names = [n for n in own.tensors if n.startswith("mtp.")]
    declared = own.hybrid.mtp_num_hidden_layers
    if not names:
        raise BadTensor(f"{path}: tensors mtp.*" + (" (blk.{trunk}.nextn.*)" if gguf else ""),
                        f"none in the file ({key} = {declared}); this checkpoint ships no MTP head to draft with")
    found = sorted({int(n.split(".")[2]) for n in names if n.startswith("mtp.layers.") and n.split(".")[2].isdigit()})
    count = declared or len(found)
    if found and found != list(range(len(found))):
        raise BadTensor(f"{path}: tensors mtp.layers.*", f"layer indices {found}; expected 0..{len(found) - 1}")
    if declared and found and len(found) != declared:
        raise BadConfig(f"{path}: key {key}", f"{declared}, but the file holds MTP layers {found}; expected equal")
    if count != SUPPORTED_LAYERS:
        raise Refused(path, f"{key} = {count}: the MTP kernels implement {SUPPORTED_LAYERS} next-token layer")
    for extra in ("mtp.embed_tokens.weight", "mtp.lm_head.weight"):
        if extra in own.tensors:
            raise Refused(path, f"{extra} present (dedicated MTP embedding / head); the kernels use the target's")
    if any(n.startswith("mtp.layers.0.linear_attn.") for n in names):
        raise Refused(path, "mtp.layers.0 is a linear-attention layer; Qwen3.5/3.8 MTP layers are full attention")
    shapes = mtp_shapes(target)
    for name, (shape, why) in shapes.items():
        if name not in own.tensors:
            label = f"{gguf_name(name, own.num_layers)} (= {name})" if gguf else name
            raise BadTensor(f"{path}: tensor {label}", f"missing, so the MTP head cannot draft; expected shape "
                                                      f"{list(shape)} {why}")
    check_shapes(own.tensors, shapes, path)
    return MTPSpec(kind="mtp", source=Path(path), source_format=own.source_format, layer=target.layer,
                   rotary_dim=target.hybrid.rotary_dim, num_layers=count, vocab_size=target.vocab_size,
                   tensors=Subset(own.tensors, list(shapes)))


class Subset(Mapping[str, torch.Tensor]):
    """The named tensors of a (lazy) mapping, read on first access."""

    def __init__(self, inner: Mapping[str, torch.Tensor], names: list[str]):
        self.inner, self.names = inner, names

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        return self.inner[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
