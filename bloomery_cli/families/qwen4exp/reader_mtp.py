"""qwen4exp's MTP head from its separate GGUF (docs/FAMILIES_MOE.md 6): ``Qwen4ExpMTPSpec``, read against its target.

The file: arch qwen4exp, ``block_count = n_main + 1``, ``nextn_predict_layers = 1``, one block ``blk.{n_main}``.

    keys equal to the target's   embedding_length, attention.{head_count, head_count_kv, key_length, value_length},
                                 expert_{count, used_count, feed_forward_length, shared_feed_forward_length},
                                 hyper_connection.{count, low_rank}, vocab_size; tokenizer eos / padding ids where
                                 both files carry them
    keys with required values    expert_gating_func = 1 (softmax), expert_weights_norm = true,
                                 expert_weights_scale = 1.0
    attention.compress_ratios    block_count or n_main entries; the MTP layer's ratio (its own, or the last main
                                 layer's) = 0 (a dense MTP attention)
    nextn_shared_target_tensors  true: neither token_embd nor output in the file (borrowed from the target);
                                 false or absent: both present. A contradiction either way is refused.

Tensors (numpy order): blk.N.nextn.eh_proj [H, 2H], nextn.enorm [H], nextn.hnorm [count H] (one gain per stream
element), nextn.hc_head_{norm, down [r, count H], up}; the attention stems attn_{q, k, v, output}; the expert
stems; hc_{attn,ffn}_{norm, down, up, inject}. No PLE tensor, GDN stem (ssm_*), block norm, or other block.
A mismatch is a ``Mismatch`` naming the key (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_cli.formats.gguf_file import GGUFFile
from bloomery_gates.errors import BadTensor, Mismatch
from bloomery_gates.spec import HybridShape, MTPSpec, Qwen4ExpMTPSpec, Qwen4ExpSpec

from .reader_gguf import (
    FORBIDDEN,
    A,
    check_arch,
    check_tensors,
    compress_ratios,
    gguf_cfg,
    shared_shapes,
    trunk_tensor_shapes,
)

REQUIRED = {"expert_gating_func": 1, "expert_weights_norm": True, "expert_weights_scale": 1.0}
TOKEN_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id")


def _target_values(t: Qwen4ExpSpec) -> dict[str, Any]:
    L, m = t.layer, t.moe
    return {"embedding_length": L.hidden_size, "attention.head_count": L.num_heads,
            "attention.head_count_kv": L.num_kv_heads, "attention.key_length": L.head_dim,
            "expert_count": m.num_experts, "expert_used_count": m.top_k, "expert_feed_forward_length": m.expert_ff,
            "expert_shared_feed_forward_length": m.shared_ff or 0, "hyper_connection.count": t.hc.count,
            "hyper_connection.low_rank": t.hc.low_rank, "vocab_size": t.vocab_size}


def qwen4exp_mtp_from_gguf(path: Path, target: Qwen4ExpSpec) -> Qwen4ExpMTPSpec:
    """The MTP head of ``path`` for ``target`` (its keys checked equal, its one block's tensors by shape)."""
    g = GGUFFile(path)
    c = gguf_cfg(g)
    check_arch(g, c)
    n = target.num_layers
    c.int(A + "block_count", minimum=n + 1, maximum=n + 1, what=f"the target's {n} layers + 1")
    c.int(A + "nextn_predict_layers", minimum=1, maximum=1, what="1 nextn layer")
    for key, want in _target_values(target).items():
        got = c.int(A + key, minimum=0)
        if got != want:
            raise Mismatch(f"{path}: key {A}{key}", f"{got}; the target {target.source.name} has {want}")
    c.int(A + "attention.value_length", target.layer.head_dim, minimum=0)
    if c.int(A + "attention.value_length", target.layer.head_dim, minimum=0) != target.layer.head_dim:
        raise Mismatch(f"{path}: key {A}attention.value_length", f"expected the target's {target.layer.head_dim}")
    if target.source_format == "gguf":
        tg = GGUFFile(target.source)
        for key in TOKEN_KEYS:
            mine, theirs = c.get(key, None), tg.meta(key, None)
            if mine is not None and theirs is not None and mine != theirs:
                raise Mismatch(f"{path}: key {key}", f"{mine}; the target {target.source.name} has {theirs}")
    for key, want in REQUIRED.items():
        got = c.get(A + key, what=repr(want))
        if isinstance(got, bool) != isinstance(want, bool) or got != want:
            raise c.bad(A + key, f"{got!r}; expected {want!r}")
    ratios = compress_ratios(c, n + 1, n)
    if ratios[-1] != 0:
        raise c.bad(A + "attention.compress_ratios", f"the MTP layer's ratio is {ratios[-1]}; expected 0 (dense)")
    layer, moe, hc = shared_shapes(c)
    shared = c.bool(A + "nextn_shared_target_tensors", False)
    H, hcH = layer.hidden_size, hc.count * layer.hidden_size
    p = f"blk.{n}."
    hy = HybridShape(("full_attention",), target.hybrid.partial_rotary_factor, target.hybrid.rotary_dim, 1, 1, 1, 1, 1)
    table: dict[str, Any] = {p + "nextn.eh_proj.weight": ((H, 2 * H), "[H, 2H]"),
                             p + "nextn.enorm.weight": ((H,), "[H]"),
                             p + "nextn.hnorm.weight": ((hcH,), "[hyper_connection.count * H]"),
                             p + "nextn.hc_head_down.weight": ((hc.low_rank, hcH), "[low_rank, count*H]"),
                             p + "nextn.hc_head_norm.weight": None, p + "nextn.hc_head_up.weight": None}
    table.update(trunk_tensor_shapes(layer, hy, moe, hc, range(n, n + 1)))
    V = target.vocab_size
    names = set(g.tensor_names())
    own = [x for x in ("token_embd.weight", "output.weight") if x in names]
    if shared and own:
        raise BadTensor(f"{path}: tensor {own[0]}", "present, but nextn_shared_target_tensors is true (borrowed)")
    if not shared:
        for x in ("token_embd.weight", "output.weight"):
            if x not in names:
                raise BadTensor(f"{path}: tensor {x}", "missing, and nextn_shared_target_tensors is not true; "
                                                       "expected the file's own [vocab, H] matrix")
            table[x] = ((V, H), "[vocab, H] (the target's vocab)")
    stray = sorted(x for x in names if x not in table and x not in ("token_embd.weight", "output.weight")
                   and not x.startswith(p + "indexer."))
    bad = [x for x in stray if "ssm_" in x or "ple_" in x or "per_layer" in x or x.endswith(FORBIDDEN)
           or not x.startswith(p)]
    if bad:
        raise BadTensor(f"{path}: tensor {bad[0]}", "not allowed in the MTP file (no PLE, GDN stem, block norm or "
                                                    f"block other than {n})")
    tensors = check_tensors(g, table, [])
    base = MTPSpec("mtp", Path(path), "gguf", layer, target.hybrid.rotary_dim, 1, V, tensors)
    return Qwen4ExpMTPSpec(**{f: getattr(base, f) for f in base.__dataclass_fields__}, block=n, hc=hc, moe=moe,
                           borrows=shared)
