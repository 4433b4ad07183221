"""The in-file MTP block of a deepseek4 (DeepSeek V4) target: ``Deepseek4MTPSpec`` from the checkpoint that ships
it (the target's own HF directory; transformers ignores ``(^|\\.)mtp\\..*``, docs/FAMILIES_MOE.md 4.4).

Names: DeepSeek's ``mtp.K.*`` spelled the way this repo's deepseek4 reader spells the trunk (HF's module names),
with K = 0 (``num_nextn_predict_layers`` 1, the one block V4 ships):

    mtp.0.{enorm, hnorm, norm}.weight [H]            norm = shared_head.norm (llama.cpp's shared_head_norm)
    mtp.0.e_proj.weight, mtp.0.h_proj.weight [H, H]  llama.cpp's eh_proj = [e_proj | h_proj], embedding first
    mtp.0.hc_head.{hc_fn [S, S H], hc_base [S], hc_scale [1]}     the MTP's own HC head (DeepSeek: hc_head_*)
    mtp.0.{attn_hc, ffn_hc}.{fn, base, scale}, mtp.0.{input_layernorm, post_attention_layernorm}.weight,
    mtp.0.self_attn.* of a SLIDING layer (no compressor), mtp.0.mlp.* of a non-hash MoE layer (gate.weight,
    gate.e_score_correction_bias, experts.*, shared_experts.*)    the trunk's shapes, layer by layer

Named errors (exit 2): a target of another family (``Mismatch``), no ``mtp.0.*`` tensors or
``num_nextn_predict_layers`` 0 (``BadTensor``), a block other than 0 (``Refused``: one V4 block), a hash table
or a compressor in the block (``Refused``: llama.cpp's graph asserts a non-hash sliding MTP layer), a missing
or misshapen tensor (``BadTensor`` naming it).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_gates.errors import BadTensor, Mismatch, Refused
from bloomery_gates.spec import Deepseek4MTPSpec, Deepseek4Spec

from ...formats.lazy import check_shapes
from ...formats.mtp import Subset
from .mtp_shapes import block_shapes


def deepseek4_mtp_from_file(path: Path, target: Deepseek4Spec) -> Deepseek4MTPSpec:
    """The MTP block in ``path``: the target's own HF directory, or a deepseek4 GGUF (``reader_mtp_gguf``: the
    converter's ``mtp-<name>.gguf``; the target's main GGUF itself names that file beside it when it holds no
    nextn block)."""
    from ...formats.gguf_file import is_gguf

    if Path(path).is_file() and is_gguf(Path(path)):
        from .gguf_names import mtp_name
        from .reader_mtp_gguf import deepseek4_mtp_from_gguf

        p = Path(path)
        if p.resolve() == Path(target.source).resolve() and target.mtp_layers == 0:
            if not mtp_name(p).is_file():
                raise Refused(path, f"the main deepseek4 GGUF holds no MTP block (the converter writes it apart, "
                                    f"with --mtp); expected the MTP file {mtp_name(p)} (or pass it as --draft)")
            p = mtp_name(p)
        return deepseek4_mtp_from_gguf(p, target)
    if target.family != "deepseek4":
        raise Mismatch(f"MTP file {path} vs target {target.source}",
                       f"target family {target.family!r}; this MTP block is the deepseek4 (DeepSeek V4) layout")
    if Path(path).resolve() != Path(target.source).resolve():
        raise Refused(path, "the V4 MTP block is read from the target's own HF directory (mtp.0.* beside the "
                            "trunk); a separate MTP file is not read here")
    names = [n for n in target.tensors if n.startswith("mtp.")]
    if not names or target.mtp_layers == 0:
        raise BadTensor(f"{path}: tensors mtp.0.*", f"{len(names)} in the file, num_nextn_predict_layers "
                                                    f"{target.mtp_layers}; this checkpoint ships no MTP block")
    other = sorted({n.split(".")[1] for n in names} - {"0"})
    if other or target.mtp_layers != 1:
        raise Refused(path, f"MTP blocks {sorted({n.split('.')[1] for n in names})}, num_nextn_predict_layers "
                            f"{target.mtp_layers}; V4 ships one (mtp.0.*)")
    for n in names:
        if n.endswith("gate.tid2eid") or ".compressor." in n:
            raise Refused(path, f"{n}: the V4 MTP block is a sliding, non-hash layer (llama.cpp's graph asserts it)")
    shapes = block_shapes(target)
    check_shapes(target.tensors, shapes, path)
    return Deepseek4MTPSpec(kind="deepseek4-mtp", source=Path(path), source_format=target.source_format,
                            num_layers=1, vocab_size=target.vocab_size,
                            tensors=Subset(target.tensors, list(shapes)))
