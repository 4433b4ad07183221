"""qwen4exp's MTP head in the HF layout: the ``mtp.*`` tensors in the target's own safetensors (transformers ignores
them, ``^mtp.*``; docs/FAMILIES_MOE.md 4.5), read against the target as a ``Qwen4ExpMTPSpec`` (``borrows``: the
embedding and head are the target's). The math and the GGUF names: ``reference.families.qwen4exp.mtp``.

Tensors (checked by shape; S = hc.count, r = hc.low_rank):

    mtp.pre_fc_norm_embedding.weight [H]            mtp.pre_fc_norm_hidden.weight [S*H] (one gain a stream element)
    mtp.fc_embedding.weight [H, H]                  mtp.fc_hidden.weight [H, H]          (eh_proj = [W_e | W_h])
    mtp.layers.0.{attn,mlp}_hyper_connection.{hc_norm [S*H], input_mix_weight_down [r, S*H],
                  input_mix_weight_up [S*H, r], block_inject_weight [S, S*H]}
    mtp.layers.0.self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}   the trunk's gated attention shapes
    mtp.layers.0.mlp.*                              the trunk's MoE set (fused or per expert)
    mtp.hyper_connection_mixer.{hc_norm, input_mix_weight_down, input_mix_weight_up}   (nextn.hc_head)

No block norm, GDN or PLE tensor may sit under mtp.; the indexer (``self_attn.indexer.*``) is allowed and unused (the
head's attention is dense). Named errors: no mtp.* tensor (``BadTensor``), a stray or misshapen one (``BadTensor``
naming it), a checkpoint whose trunk is not the target's (``Mismatch``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bloomery_gates.errors import BadTensor, InputError, Mismatch
from bloomery_gates.spec import MTPSpec, Qwen4ExpMTPSpec, Qwen4ExpSpec

from ...formats.lazy import check_shapes
from ...formats.mtp import Subset
from ..qwen35moe.reader import tensor_shapes as moe_trunk_shapes
from .reader import qwen4exp_from_hf

P, L0 = "mtp.", "mtp.layers.0."


def hc_shapes(prefix: str, H: int, count: int, rank: int, inject: bool = True) -> dict:
    sh = count * H
    s = {prefix + "hc_norm.weight": ((sh,), "[hc_count * hidden_size]"),
         prefix + "input_mix_weight_down.weight": ((rank, sh), "[hc_lowrank, hc_count * hidden_size]"),
         prefix + "input_mix_weight_up.weight": ((sh, rank), "[hc_count * hidden_size, hc_lowrank]")}
    if inject:
        s[prefix + "block_inject_weight.weight"] = ((count, sh), "[hc_count, hc_count * hidden_size]")
    return s


def mtp_shapes(target: Qwen4ExpSpec) -> dict:
    """Every tensor the head must carry (HF names) with its shape, from the target's numbers."""
    H, c, r = target.hidden_size, target.hc.count, target.hc.low_rank
    full = replace(target.hybrid, layer_types=("full_attention",))
    layer = {k.replace("model.layers.0.", L0, 1): v for k, v in
             moe_trunk_shapes(target.layer, full, target.moe, 1, target.vocab_size, True).items()
             if k.startswith(("model.layers.0.self_attn.", "model.layers.0.mlp."))}
    return {P + "pre_fc_norm_embedding.weight": ((H,), "[hidden_size]"),
            P + "pre_fc_norm_hidden.weight": ((c * H,), "[hc_count * hidden_size] (one gain a stream element)"),
            P + "fc_embedding.weight": ((H, H), "[hidden_size, hidden_size] (eh_proj's embedding half)"),
            P + "fc_hidden.weight": ((H, H), "[hidden_size, hidden_size] (eh_proj's hidden half)"),
            **hc_shapes(L0 + "attn_hyper_connection.", H, c, r), **layer,
            **hc_shapes(L0 + "mlp_hyper_connection.", H, c, r),
            **hc_shapes(P + "hyper_connection_mixer.", H, c, r, inject=False)}


def qwen4exp_mtp_from_hf(path: Path, target: Qwen4ExpSpec) -> Qwen4ExpMTPSpec:
    """The ``mtp.*`` head in the HF directory ``path`` (the target's own, or one whose trunk numbers are equal)."""
    if target.family != "qwen4exp":
        raise Mismatch(f"MTP file {path} vs target {target.source}",
                       f"target family {target.family!r}; this MTP head is the qwen4exp layout")
    own = target if Path(path).resolve() == Path(target.source).resolve() else qwen4exp_from_hf(Path(path))
    for what, a, b in (("layer shape", own.layer, target.layer), ("hc", own.hc, target.hc),
                       ("moe", own.moe, target.moe), ("vocab", own.vocab_size, target.vocab_size),
                       ("rotary_dim", own.hybrid.rotary_dim, target.hybrid.rotary_dim)):
        if a != b:
            raise Mismatch(f"MTP file {path} vs target {target.source}", f"{what} {a} != target's {b}; expected equal")
    names = [n for n in own.tensors if n.startswith(P)]
    if not names:
        raise BadTensor(f"{path}: tensors {P}*", "none in the checkpoint; it ships no MTP head to draft with")
    table = mtp_shapes(target)
    stray = sorted(n for n in names if n not in table and not n.startswith(L0 + "self_attn.indexer."))
    if stray:
        raise BadTensor(f"{path}: tensor {stray[0]}", "not part of the qwen4exp MTP head (no block norm, GDN or PLE "
                                                      "tensor; one layer, mtp.layers.0)")
    check_shapes(own.tensors, table, path)
    base = MTPSpec("mtp", Path(path), "hf", target.layer, target.hybrid.rotary_dim, 1, target.vocab_size,
                   Subset(own.tensors, list(table)))
    return Qwen4ExpMTPSpec(**{f: getattr(base, f) for f in base.__dataclass_fields__}, block=target.num_layers,
                           hc=target.hc, moe=target.moe, borrows=True)


def load_qwen4exp_mtp(path: str | Path, target) -> Qwen4ExpMTPSpec:
    """The gate's draft loader: the HF checkpoint's ``mtp.*`` head (a directory; usually the target's own)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(p, "no such file or directory; expected the qwen4exp checkpoint holding the mtp.* head")
    if not p.is_dir():
        raise InputError(p, "expected the qwen4exp HF directory (config.json + *.safetensors) holding mtp.*; the "
                            "separate MTP GGUF is not wired to the gate yet")
    return qwen4exp_mtp_from_hf(p, target)
