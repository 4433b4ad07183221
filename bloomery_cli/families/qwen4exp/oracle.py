"""Tier-3 oracle for qwen4exp targets: transformers' own ``Qwen4ExpForCausalLM`` (``qwen4_exp_text``) on the spec's
weights, CPU, float64 (docs/FAMILIES_MOE.md 2.1: routed experts on HF's eager path, since the default grouped_mm
refuses float64; eager attention; ``split_ngram_parts`` 1 and the spec's ``ngram_vocab_size_base``).

``promote_f32`` (default) builds and runs it under ``oracle.hf.Float32AsFloat64``, which lifts HF's float32 islands
(the grouped zero-centred norms, the router softmax, the DeltaNet, the rotary table, the hyper-connection mixes:
FAMILIES_MOE.md 2.2) to float64: a truly float64 forward of HF's own wiring. Without it, HF "float64" is only
about 1e-7 relative from a true float64 forward (2.2 measured 1.2e-8 on logits of max 0.23 for qwen4_exp).

The PLE hashing tables (``ple_embedding.{layer_multipliers, ngram_heads_vocab_sizes, ngram_heads_offsets}``) are
HF's own, computed by its constructor from the config: they are integer buffers, never taken from the file (a float64
round trip would corrupt multipliers near 2^62), so the hashing is checked independently of ours. A GGUF spec
stores the tables, not HF's inputs (base, seed): HF's module is sized from the file's table (base = the first head
size, the padding divisor = the table's rows) and its three buffers are set to the file's ``ple.*`` integers, so HF's
own hashing code runs on the file's tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bloomery_gates.spec import Qwen4ExpSpec

from ...oracle.hf import Float32AsFloat64, HFOut, _transformers, build_hf_model, hybrid_config_keys

HASH_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")
TABLE = "ple.ple_embedding.ngram_embedding.weight"


def qwen4exp_hf_config(spec: Qwen4ExpSpec) -> Any:
    """``Qwen4ExpTextConfig`` carrying the spec's numbers (eager attention and experts)."""
    tf = _transformers()
    moe, hc, q, p = spec.moe, spec.hc, spec.qsa, spec.ple
    ple: dict = {"ple_layer_ids": []}
    if p is not None:
        base, div = p.vocab_base, p.divisible_by
        if p.multipliers:              # a GGUF: sized from the file's table; its hashing buffers set after the build
            base, div = p.head_vocab_sizes[0], spec.tensors.shape_of(f"model.layers.{p.layers[0]}.{TABLE}")[0]
        ple = {"ple_layer_ids": [i + 1 for i in p.layers], "ple_embed_dim": p.embed_dim,
               "ple_conv_kernel_size": p.conv_kernel, "ngram_size": p.ngram_size, "heads_per_ngram": p.heads_per_ngram,
               "ngram_vocab_size_base": base, "make_ngram_vocab_size_divisible_by": div,
               "seed": p.seed, "split_ngram_parts": 1, "eos_token_id": p.eos_token_id}
    config = tf.Qwen4ExpTextConfig(
        **hybrid_config_keys(spec), num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
        moe_intermediate_size=moe.expert_ff,
        shared_expert_intermediate_size=moe.shared_ff or 0, norm_topk_prob=moe.norm_topk,
        hc_count=hc.count, hc_lowrank=hc.low_rank, indexer_n_heads=q.num_heads, indexer_kv_heads=q.kv_heads,
        indexer_head_dim=q.head_dim, indexer_budget=q.budget, indexer_compress_ratio=q.compress_ratio,
        output_gate_type=spec.output_gate or None, **ple,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def build_hf_qwen4exp(spec: Qwen4ExpSpec, promote_f32: bool = True) -> torch.nn.Module:
    """A float64 ``Qwen4ExpForCausalLM`` carrying the spec's trunk weights strictly (``mtp.*`` left out, as HF's
    loader; the PLE hashing buffers HF's own)."""
    model = build_hf_model(spec, "Qwen4ExpForCausalLM", qwen4exp_hf_config(spec), "qwen4exp",
                           promote_f32=promote_f32, computed=HASH_BUFFERS)
    p = spec.ple
    if p is not None and p.multipliers:
        emb = model.model.layers[p.layers[0]].ple.ple_embedding
        for buf, values in zip(HASH_BUFFERS, (p.multipliers, p.head_vocab_sizes, p.head_offsets), strict=True):
            getattr(emb, buf).copy_(torch.tensor(values, dtype=torch.long))
    return model


def hf_qwen4exp(spec: Qwen4ExpSpec, ids: Sequence[int], promote_f32: bool = True) -> HFOut:
    """HF's logits [T, V] and hidden_states [L+1, T, *] for one sequence (positions 0..T-1, no cache): entries
    0..L-1 are the streams [T, S*H] entering each layer, entry L the mixer's output [T, H] (FAMILIES_MOE.md 2.3),
    so they come back as a list-like object array only through ``hidden_states``' own shapes: entries 0..L-1
    stacked [L, T, S*H] here, the last dropped (it equals the head's input, which the logits already judge)."""
    model = build_hf_qwen4exp(spec, promote_f32)
    with torch.no_grad(), Float32AsFloat64() if promote_f32 else contextlib.nullcontext():
        out = model(input_ids=torch.tensor([[int(i) for i in ids]]), output_hidden_states=True, use_cache=False)
    streams = torch.stack([h[0] for h in out.hidden_states[:-1]])
    return HFOut(logits=out.logits[0].numpy(), hidden_states=streams.numpy())


def hf_qwen4exp_logits(spec: Qwen4ExpSpec, ids: Sequence[int], promote_f32: bool = True) -> np.ndarray:
    return hf_qwen4exp(spec, ids, promote_f32).logits
