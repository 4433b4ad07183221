"""glm5next tensor names between the HF checkpoint (transformers' ``glm5_next`` names) and llama.cpp's GGUF (arch
``glm5-next``), both directions, with the converter's transforms (``conversion/glm.py`` ``Glm5NextModel``,
llama.cpp 0c1e57098 as vendored in llama-cpp-python 0.3.36; docs/FAMILIES_MOE.md 4.3). One table, read by
``reader_gguf`` (GGUF -> HF) and written by ``fixture_gguf`` (HF -> GGUF).

Per block i (trunk blocks and the NextN block alike, HF ``model.layers.{i}.``):

    attn_hc.{fn, base, scale} / ffn_hc.*      hc_attn_{fn, base, scale} / hc_ffn_*         (trunk only)
    input_layernorm / post_attention_layernorm  attn_norm / ffn_norm
    KDA   self_attn.{q,k,v}_proj, o_proj       attn_{q,k,v}, attn_output
          self_attn.conv1d [3 d, 1, K]         ssm_conv1d_{q,k,v} [1, d, 1, K] (numpy order; the q, k, v thirds)
          forget_gate.{f_a_proj, f_b_proj}     ssm_f_a, ssm_f_b
          forget_gate.A_log [heads]            ssm_a = -exp(A_log)
          forget_gate.dt_bias [d]              ssm_dt.bias
          b_proj, g_a_proj, g_b_proj, o_norm   ssm_beta, ssm_g_a, ssm_g_b, ssm_norm
    MLA   q_a_proj, q_a_layernorm, q_b_proj    attn_q_a, attn_q_a_norm, attn_q_b
          kv_a_proj_with_mqa, kv_a_layernorm   attn_kv_a_mqa, attn_kv_a_norm
          kv_b_proj [h (nope + v), kv_lora]    attn_k_b [h, kv_lora, nope] (transposed), attn_v_b [h, v, kv_lora]
    DSA   indexer.{weights_proj, wk, wq_b}     indexer.{proj, attn_k, attn_q_b}
          indexer.k_norm.{weight, bias}        indexer.k_norm.{weight, bias}
          indexer.index_kpool_compress_{ape, gate}   indexer_compressor_{ape, gate}
    FFN   mlp.{gate,up,down}_proj (dense)      ffn_{gate,up,down}
          mlp.gate.weight, .e_score_correction_bias   ffn_gate_inp, exp_probs_b.bias
          mlp.experts.gate_up_proj [E, 2ff, H] ffn_gate_exps / ffn_up_exps [E, ff, H] (the halves)
          mlp.experts.down_proj                ffn_down_exps
          mlp.shared_experts.{gate,up,down}_proj  ffn_{gate,up,down}_shexp
    NextN eh_proj, enorm, hnorm, shared_head.norm   nextn.{eh_proj, enorm, hnorm, shared_head_norm}

Globals: embed_tokens -> token_embd, norm -> output_norm, lm_head -> output. No norm carries a +1. On read every
transform is exact (splits, joins, transposes) except A_log = log(-ssm_a), float64 then rounded once to float32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Fn = Callable[[torch.Tensor], torch.Tensor]
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
BLOCK = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.forget_gate.f_a_proj.weight": "ssm_f_a.weight", "self_attn.forget_gate.f_b_proj.weight":
        "ssm_f_b.weight", "self_attn.forget_gate.A_log": "ssm_a", "self_attn.forget_gate.dt_bias": "ssm_dt.bias",
    "self_attn.b_proj.weight": "ssm_beta.weight", "self_attn.g_a_proj.weight": "ssm_g_a.weight",
    "self_attn.g_b_proj.weight": "ssm_g_b.weight", "self_attn.o_norm.weight": "ssm_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight", "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight", "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.indexer.weights_proj.weight": "indexer.proj.weight", "self_attn.indexer.wk.weight":
        "indexer.attn_k.weight", "self_attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "self_attn.indexer.k_norm.weight": "indexer.k_norm.weight", "self_attn.indexer.k_norm.bias":
        "indexer.k_norm.bias", "self_attn.indexer.index_kpool_compress_ape": "indexer_compressor_ape.weight",
    "self_attn.indexer.index_kpool_compress_gate": "indexer_compressor_gate.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight", "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "eh_proj.weight": "nextn.eh_proj.weight", "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight", "shared_head.norm.weight": "nextn.shared_head_norm.weight",
    "embed_tokens.weight": "nextn.embed_tokens.weight", "shared_head.head.weight": "nextn.shared_head_head.weight",
    **{f"{p}_hc.{w}": f"hc_{p}_{w}.weight" for p in ("attn", "ffn") for w in ("fn", "base", "scale")},
}
CONV = "self_attn.conv1d.weight"
KV_B = "self_attn.kv_b_proj.weight"
# the converter's F32 tensors beside every 1-D one (glm.py, base.py's always-F32 list)
F32_SUFFIXES = ("_norm.weight", "norm.weight", "ffn_gate_inp.weight", "indexer.proj.weight", "ssm_conv1d_q.weight",
                "ssm_conv1d_k.weight", "ssm_conv1d_v.weight", "indexer_compressor_ape.weight",
                "indexer_compressor_gate.weight", "hc_attn_fn.weight", "hc_ffn_fn.weight")


def split(hf: str) -> tuple[str, str]:
    """(``blk.{i}.``, the HF name's rest) of a block tensor, or ("", hf) for a global one."""
    if not hf.startswith("model.layers."):
        return "", hf
    i, rest = hf[len("model.layers."):].split(".", 1)
    return f"blk.{i}.", rest


def to_gguf(hf: str, x: torch.Tensor, mla_heads: int, nope: int) -> list[tuple[str, torch.Tensor]]:
    """The GGUF tensor(s) of one HF tensor ``x`` (numpy order; float64 where a transform computes)."""
    if hf in GLOBAL:
        return [(GLOBAL[hf], x)]
    blk, rest = split(hf)
    if rest == CONV:
        d = x.shape[0] // 3
        return [(f"{blk}ssm_conv1d_{p}.weight", x[j * d:(j + 1) * d].reshape(1, d, 1, x.shape[-1]))
                for j, p in enumerate("qkv")]
    if rest == KV_B:
        kv = x.reshape(mla_heads, -1, x.shape[-1])
        return [(f"{blk}attn_k_b.weight", kv[:, :nope].transpose(1, 2).contiguous()),
                (f"{blk}attn_v_b.weight", kv[:, nope:].contiguous())]
    if rest == "mlp.experts.gate_up_proj":
        ff = x.shape[1] // 2
        return [(f"{blk}ffn_gate_exps.weight", x[:, :ff]), (f"{blk}ffn_up_exps.weight", x[:, ff:])]
    if rest == "self_attn.forget_gate.A_log":
        x = -torch.exp(x.double())
    if rest not in BLOCK:
        raise KeyError(f"no GGUF name for tensor {hf}")
    return [(blk + BLOCK[rest], x)]


def hf_table(names: list[str]) -> dict[str, tuple[str, Fn | None, tuple | None]]:
    """HF name -> (GGUF name, inverse transform or None, shape or None) for the tensors of a glm5-next GGUF whose
    experts' halves, conv thirds and k_b / v_b pairs were joined (``Joined``: ``ffn_gate_up_exps``,
    ``ssm_conv1d_qkv``, ``attn_kv_b``)."""
    inv_global = {v: k for k, v in GLOBAL.items()}
    inv = {v: k for k, v in BLOCK.items()}
    table: dict[str, tuple[str, Fn | None, tuple | None]] = {}
    for g in names:
        if g in inv_global:
            table[inv_global[g]] = (g, None, None)
            continue
        parts = g.split(".", 2)
        if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit():
            continue
        head, rest = f"model.layers.{parts[1]}.", parts[2]
        if rest == "ssm_conv1d_qkv.weight":
            table[head + CONV] = (g, None, None)
        elif rest == "attn_kv_b.weight":
            table[head + KV_B] = (g, None, None)
        elif rest == "ssm_a":
            table[head + inv[rest]] = (g, lambda x: torch.log(-x.double()).float(), None)
        elif rest in inv:
            table[head + inv[rest]] = (g, None, None)
    return table
