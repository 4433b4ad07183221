"""qwen4exp tensor names between the HF checkpoint and llama.cpp's GGUF (arch ``qwen4exp``), both directions, with
the converter's transforms (``conversion/qwen4exp.py`` on top of ``conversion/qwen.py``'s Qwen3.5 rules, llama.cpp
0c1e57098 as vendored in llama-cpp-python 0.3.36; docs/FAMILIES_MOE.md 4.5). One table, read by ``reader_gguf``
(GGUF -> HF) and written by ``fixture_gguf`` (HF -> GGUF).

The Qwen3.5 part (attention, GDN, MoE) is qwen38's table (``qwen38.reader.GGUF_LAYER`` / ``_gguf_table``: the +1 on
the zero-centred norms, ssm_a = -exp(A_log), the value heads tiled, ssm_conv1d [C, K], ffn_gate_inp_shexp {H}, the
experts' gate/up halves). qwen4exp adds (HF under ``model.layers.{i}.`` unless rooted):

    output_hc_{norm, down, up}          model.hyper_connection_mixer.{hc_norm, input_mix_weight_down, _up}.weight
    blk.i.hc_{attn,ffn}_{norm, down, up, inject}
                                        {attn,mlp}_hyper_connection.{hc_norm, input_mix_weight_down, _up,
                                        block_inject_weight}.weight
    blk.i.indexer.{q_proj | k_proj}     self_attn.indexer.index_qk_proj.weight rows [q heads | the k head]
    blk.i.indexer.{q_norm, k_norm}      self_attn.indexer.{q,k}_layernorm.weight
    blk.i.ple_{key, value, norm_key, norm_query, norm_conv, conv1d}
                                        ple.{key_proj, value_proj, norm_key, norm_query, norm_conv, conv1d}.weight
    per_layer_token_embd                model.layers.{p}.ple.ple_embedding.ngram_embedding.weight (p: the PLE layer)

Transforms: every zero-centred norm is stored as 1 + w (the hc norms, the indexer's, PLE's three; the converter's
"Gemma zero-centred gammas" rule and qwen.py's norm rule); ple_conv1d [S*H, 1, K] -> [S*H, K]. On read the inverse
is exact for the reshapes and splits; w = stored - 1 is exact in float32 (stored in [0.5, 2]), so a read-back norm
differs from the HF bf16 value by at most the float32 rounding of 1 + w (2^-24).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bloomery_gates.spec import Qwen4ExpSpec

from ...formats.joined import Joined
from ...formats.lazy import LazyTensors
from ..qwen38.reader import _chain, _gguf_table

Fn = Callable[[torch.Tensor], torch.Tensor]
MIX = {"hc_norm.weight": "norm", "input_mix_weight_down.weight": "down", "input_mix_weight_up.weight": "up",
       "block_inject_weight.weight": "inject"}
PARTS = {"attn_hyper_connection.": "attn", "mlp_hyper_connection.": "ffn"}
PLE = {"key_proj.weight": "ple_key.weight", "value_proj.weight": "ple_value.weight",
       "norm_key.weight": "ple_norm_key.weight", "norm_query.weight": "ple_norm_query.weight",
       "norm_conv.weight": "ple_norm_conv.weight", "conv1d.weight": "ple_conv1d.weight"}
INDEXER_NORMS = {"q_layernorm.weight": "q_norm.weight", "k_layernorm.weight": "k_norm.weight"}
TABLE = "ple.ple_embedding.ngram_embedding.weight"
QK = "self_attn.indexer.index_qk_proj.weight"


def plus_one(hf: str) -> bool:
    """The qwen4exp-only tensors stored as 1 + w (the Qwen3.5 ones: ``qwen38.reader.baked_plus_one``)."""
    return hf.endswith(("hc_norm.weight", "layernorm.weight", "ple.norm_key.weight", "ple.norm_query.weight",
                        "ple.norm_conv.weight"))


def own_name(hf: str) -> str | None:
    """The GGUF name of a qwen4exp-only HF tensor (not the q/k-split indexer projection), or None."""
    if hf.startswith("model.hyper_connection_mixer."):
        rest = hf[len("model.hyper_connection_mixer."):]
        return f"output_hc_{MIX[rest]}.weight" if rest in MIX and rest != "block_inject_weight.weight" else None
    if not hf.startswith("model.layers."):
        return None
    i, rest = hf[len("model.layers."):].split(".", 1)
    for prefix, part in PARTS.items():
        if rest.startswith(prefix) and rest[len(prefix):] in MIX:
            return f"blk.{i}.hc_{part}_{MIX[rest[len(prefix):]]}.weight"
    if rest == TABLE:
        return "per_layer_token_embd.weight"
    if rest.startswith("ple.") and rest[4:] in PLE:
        return f"blk.{i}.{PLE[rest[4:]]}"
    if rest.startswith("self_attn.indexer.") and rest[len("self_attn.indexer."):] in INDEXER_NORMS:
        return f"blk.{i}.indexer.{INDEXER_NORMS[rest[len('self_attn.indexer.'):]]}"
    return None


def join_qk(inner: LazyTensors) -> Joined:
    """Each ``blk.i.indexer.q_proj`` / ``k_proj`` pair presented as ``blk.i.indexer.qk_proj`` (rows [q | k], HF's
    ``index_qk_proj``)."""
    return Joined(inner, {n.replace("q_proj", "qk_proj"): ((n, n.replace("q_proj", "k_proj")),
                                                             lambda xs: torch.cat(xs, dim=0))
                          for n in inner if n.endswith("indexer.q_proj.weight")})


def hf_table(names: list[str], spec_trunk: int, spec: Qwen4ExpSpec) -> dict[str, tuple[str, Fn | None, tuple | None]]:
    """HF name -> (GGUF name, inverse transform or None, shape or None) for every tensor of a qwen4exp GGUF whose
    tensors were ``FusedGateUp``-wrapped (the experts' gate/up halves presented as one ``ffn_gate_up_exps``); the
    indexer's q / k halves are joined by ``join_qk``."""
    table = _gguf_table(names, spec_trunk, spec.hybrid, spec.hidden_size)
    ple_layer = spec.ple.layers[0] if spec.ple is not None else None
    inverse = {}
    for i in range(spec_trunk):
        for prefix, part in PARTS.items():
            for hf_rest, short in MIX.items():
                inverse[f"blk.{i}.hc_{part}_{short}.weight"] = f"model.layers.{i}.{prefix}{hf_rest}"
        for hf_rest, g in PLE.items():
            inverse[f"blk.{i}.{g}"] = f"model.layers.{i}.ple.{hf_rest}"
        for hf_rest, g in INDEXER_NORMS.items():
            inverse[f"blk.{i}.indexer.{g}"] = f"model.layers.{i}.self_attn.indexer.{hf_rest}"
        inverse[f"blk.{i}.indexer.qk_proj.weight"] = f"model.layers.{i}.{QK}"
    for hf_rest, short in MIX.items():
        if short != "inject":
            inverse[f"output_hc_{short}.weight"] = f"model.hyper_connection_mixer.{hf_rest}"
    if ple_layer is not None:
        inverse["per_layer_token_embd.weight"] = f"model.layers.{ple_layer}.{TABLE}"
    for g in names:
        hf = inverse.get(g)
        if hf is None:
            continue
        fns: list[Fn] = []
        shape = None
        if plus_one(hf):
            fns.append(lambda x: x - 1.0)
        if hf.endswith("ple.conv1d.weight") and spec.ple is not None:
            fns.append(lambda x: x.reshape(x.shape[0], 1, x.shape[-1]))
            shape = (spec.hc.count * spec.hidden_size, 1, spec.ple.conv_kernel)
        table[hf] = (g, _chain(fns), shape)
    return table
