"""The MTP head of a mimo2 (MiMo-V2-Flash) target: ``Mimo2MTPSpec`` from the checkpoint that ships it (the target's
own directory or GGUF: MiMo's MTP layers live beside the trunk, ``model.mtp.layers.{k}.*``; in llama.cpp's GGUF they
are the blocks after the trunk, renamed back by ``formats.mimo2_gguf``; transformers ignores them,
``^model\\.mtp\\.``). The count is the file's: MiMo's config has no key for it (llama.cpp's converter hard-codes 3).

Per layer k: enorm, hnorm, eh_proj [H, 2H], final_layernorm, input_layernorm, pre_mlp_layernorm, self_attn.{q,k,v,o}
_proj of the trunk's SWA shape (+ attention_sink_bias when its SWA layers carry sinks), dense mlp.{gate,up,down}_proj
of intermediate_size. Named errors: no MTP layers (``BadTensor``), layer indices not 0..n-1, a missing or misshapen
tensor (``BadTensor`` naming it), a sparse MTP MLP or a dedicated MTP embedding / head / head norm (``Refused``), a
file whose trunk is not the target's (``Mismatch``).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_gates.errors import BadTensor, Mismatch, Refused
from bloomery_gates.spec import Mimo2MTPSpec, Mimo2Spec

from ...formats.lazy import check_shapes
from ...formats.mtp import Subset
from .reader import attn_shapes, dense_shapes, mimo2_from_hf

P = "model.mtp.layers."


def layer_shapes(target: Mimo2Spec, k: int) -> dict[str, tuple[tuple[int, ...], str]]:
    H = target.hidden_size
    p = f"{P}{k}."
    s = {p + n: ((H,), "[hidden_size]") for n in ("enorm.weight", "hnorm.weight", "input_layernorm.weight",
                                                  "pre_mlp_layernorm.weight", "final_layernorm.weight")}
    s[p + "eh_proj.weight"] = ((H, 2 * H), "[hidden_size, 2*hidden_size] (input [embedding ; hidden])")
    s.update(attn_shapes(p + "self_attn.", H, target.mimo.swa))
    s.update(dense_shapes(p + "mlp.", H, target.layer.intermediate_size))
    return s


def mimo2_mtp_from_file(path: Path, target: Mimo2Spec) -> Mimo2MTPSpec:
    """The MTP layers in ``path`` (the target's directory, or a mimo2 directory with the same trunk numbers)."""
    if target.family != "mimo2":
        raise Mismatch(f"MTP file {path} vs target {target.source}",
                       f"target family {target.family!r}; this MTP head is the mimo2 (MiMo-V2) layout")
    if Path(path).resolve() == Path(target.source).resolve():
        own = target
    elif Path(path).is_file():
        from .reader_gguf import mimo2_from_gguf
        own = mimo2_from_gguf(Path(path))
    else:
        own = mimo2_from_hf(Path(path))
    if (own.layer, own.mimo.swa, own.vocab_size) != (target.layer, target.mimo.swa, target.vocab_size):
        raise Mismatch(f"MTP file {path} vs target {target.source}", "trunk numbers (hidden, heads, SWA shape, "
                                                                     "vocab) differ; expected the target's")
    names = [n for n in own.tensors if n.startswith(P)]
    found = sorted({int(n[len(P):].split(".")[0]) for n in names if n[len(P):].split(".")[0].isdigit()})
    if not found:
        raise BadTensor(f"{path}: tensors {P}*", "none in the file; this checkpoint ships no MTP layers to draft with")
    if found != list(range(len(found))):
        raise BadTensor(f"{path}: tensors {P}*", f"layer indices {found}; expected 0..{len(found) - 1}")
    for n in names:
        if ".mlp.gate." in n or ".mlp.experts." in n:
            raise Refused(path, f"{n}: a sparse MTP MLP; MiMo-V2's MTP layers are dense (llama.cpp's graph too)")
        if n.endswith(("embed_tokens.weight", "shared_head.head.weight", "shared_head.norm.weight")):
            raise Refused(path, f"{n}: a dedicated MTP embedding / head; the kernels use the target's")
    shapes = {}
    for k in found:
        shapes.update(layer_shapes(target, k))
    check_shapes(own.tensors, shapes, path)
    return Mimo2MTPSpec(kind="mimo2-mtp", source=Path(path), source_format=own.source_format, attn=target.mimo.swa,
                        hidden_size=target.hidden_size, intermediate_size=target.layer.intermediate_size,
                        rms_eps=target.layer.rms_eps, value_scale=target.mimo.value_scale, num_layers=len(found),
                        vocab_size=target.vocab_size, tensors=Subset(own.tensors, list(shapes)))
