"""The NextN layer of a glm5next checkpoint (docs/FAMILIES_MOE.md 4.3 "NextN in the checkpoint"): the block
``<prefix>layers.{n}.*`` after the trunk's n layers, in the target's own file. The draft's spec is the target's
``Glm5NextSpec`` itself (its tensors hold the block); this reader checks that the block is there and whole, by
shape, and refuses the rest by name (exit 2):

    enorm, hnorm [H]; eh_proj [H, 2H]; input_layernorm, post_attention_layernorm, shared_head.norm [H]
    self_attn: the MLA stems (q_a_proj [ql, H], q_a_layernorm [ql], q_b_proj [n dn, ql], kv_a_proj_with_mqa [kl, H],
               kv_a_layernorm [kl], kv_b_proj [n (dn + dv), kl], o_proj [H, n dv]) and a FULL indexer (wq_b, wk,
               k_norm.{weight, bias}, weights_proj, index_kpool_compress_{gate, ape})
    mlp:       the sparse FFN (gate.weight [E, H], gate.e_score_correction_bias [E], experts.gate_up_proj
               [E, 2F, H], experts.down_proj [E, H, F], shared_experts.* when n_shared_experts > 0)
    optional:  shared_head.head [V, H] (read: the block's own head), embed_tokens [V, H] (not read: the target's)
    refused:   any attn_hc.* / ffn_hc.* tensor (the NextN block has no mHC)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_cli.formats.lazy import check_shapes
from bloomery_gates.errors import Mismatch, Refused
from bloomery_gates.spec import Glm5NextSpec


def nextn_shapes(spec: Glm5NextSpec, p: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The block's required tensors under ``p`` (= <prefix>layers.{n}.) -> (shape, why)."""
    H, m, d, e = spec.hidden_size, spec.mla, spec.dsa, spec.moe
    n, ql, kl, dn, dv = m.num_heads, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim
    a, i, f = p + "self_attn.", p + "self_attn.indexer.", p + "mlp."
    out: dict[str, tuple[tuple[int, ...], str]] = {
        p + "enorm.weight": ((H,), "[hidden_size]"), p + "hnorm.weight": ((H,), "[hidden_size]"),
        p + "eh_proj.weight": ((H, 2 * H), "[hidden_size, 2*hidden_size]"),
        p + "input_layernorm.weight": ((H,), "[hidden_size]"),
        p + "post_attention_layernorm.weight": ((H,), "[hidden_size]"),
        p + "shared_head.norm.weight": ((H,), "[hidden_size]"),
        a + "q_a_proj.weight": ((ql, H), "[q_lora_rank, hidden_size]"),
        a + "q_a_layernorm.weight": ((ql,), "[q_lora_rank]"),
        a + "q_b_proj.weight": ((n * dn, ql), "[heads*qk_nope_head_dim, q_lora_rank]"),
        a + "kv_a_proj_with_mqa.weight": ((kl, H), "[kv_lora_rank, hidden_size]"),
        a + "kv_a_layernorm.weight": ((kl,), "[kv_lora_rank]"),
        a + "kv_b_proj.weight": ((n * (dn + dv), kl), "[heads*(qk_nope_head_dim+v_head_dim), kv_lora_rank]"),
        a + "o_proj.weight": ((H, n * dv), "[hidden_size, heads*v_head_dim]"),
        i + "wq_b.weight": ((d.num_heads * d.head_dim, ql), "[index_n_heads*index_head_dim, q_lora_rank]"),
        i + "wk.weight": ((d.head_dim, H), "[index_head_dim, hidden_size]"),
        i + "k_norm.weight": ((d.head_dim,), "[index_head_dim]"),
        i + "k_norm.bias": ((d.head_dim,), "[index_head_dim]"),
        i + "weights_proj.weight": ((d.num_heads, H), "[index_n_heads, hidden_size]"),
        i + "index_kpool_compress_gate": ((d.head_dim, H), "[index_head_dim, hidden_size]"),
        i + "index_kpool_compress_ape": ((d.kpool, d.head_dim), "[index_kpool, index_head_dim]"),
        f + "gate.weight": ((e.num_experts, H), "[n_routed_experts, hidden_size]"),
        f + "gate.e_score_correction_bias": ((e.num_experts,), "[n_routed_experts]"),
        f + "experts.gate_up_proj": ((e.num_experts, 2 * e.expert_ff, H),
                                     "[n_routed_experts, 2*moe_intermediate_size, hidden_size]"),
        f + "experts.down_proj": ((e.num_experts, H, e.expert_ff),
                                  "[n_routed_experts, hidden_size, moe_intermediate_size]")}
    if e.shared_ff:
        s, sf = f + "shared_experts.", e.shared_ff
        out |= {s + "gate_proj.weight": ((sf, H), "[moe_intermediate_size*n_shared_experts, hidden_size]"),
                s + "up_proj.weight": ((sf, H), "[moe_intermediate_size*n_shared_experts, hidden_size]"),
                s + "down_proj.weight": ((H, sf), "[hidden_size, moe_intermediate_size*n_shared_experts]")}
    for opt in ("shared_head.head.weight", "embed_tokens.weight"):
        if p + opt in spec.tensors:
            out[p + opt] = ((spec.vocab_size, H), "[vocab_size, hidden_size]")
    return out


def glm5next_nextn_from_file(path: Path, target: Any) -> Glm5NextSpec:
    """The NextN draft of the glm5next ``target``, shipped in ``path`` (the target's own checkpoint): the target's
    spec, once its first NextN block is checked (module docstring)."""
    from bloomery_cli.loading import load_target

    if not isinstance(target, Glm5NextSpec):
        raise Mismatch(path, f"the glm5next NextN draft needs a glm5next target, got {type(target).__name__}")
    spec = target if Path(path).resolve() == Path(target.source).resolve() else load_target(path)
    if not isinstance(spec, Glm5NextSpec):
        raise Refused(path, "the glm5next NextN draft is read from a glm5next checkpoint (HF, or a GGUF whose "
                            "blk.{n}.nextn block the reader renames to HF's names)")
    if spec.nextn_layers < 1:
        raise Mismatch(path, "num_nextn_predict_layers is 0: this checkpoint ships no NextN layer")
    if (spec.hidden_size, spec.vocab_size, spec.num_layers) != (target.hidden_size, target.vocab_size,
                                                                target.num_layers):
        raise Mismatch(path, "its trunk (hidden_size, vocab_size, num_hidden_layers) differs from the target's")
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in spec.tensors else "model."
    p = pre + f"layers.{spec.num_layers}."
    hc = sorted(n for n in spec.tensors if n.startswith(p) and ("attn_hc." in n or "ffn_hc." in n))
    if hc:
        raise Refused(path, f"tensor {hc[0]}: the NextN block has no mHC (expected no {p}*_hc.* tensor)")
    check_shapes(spec.tensors, nextn_shapes(spec, p), path)
    return spec
