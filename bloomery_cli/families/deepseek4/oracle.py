"""Tier-3 oracle for the deepseek4 trunk: transformers' own ``DeepseekV4ForCausalLM`` on the spec's weights, CPU
float64, eager attention (its only one) and eager experts. Built from the spec's numbers, never from a hub name;
the in-file MTP (``mtp.*``) is left out, as HF's own loader ignores it.

``lift`` (default True) builds and runs it under ``oracle.Float32AsFloat64``, so its float32 islands
(docs/FAMILIES_MOE.md 2.2: the RMSNorms, the mHC mixes and HC head, the rope tables, the compressors' gate softmax,
the indexer scores) run in float64 too: a true float64 forward. With ``lift=False`` it runs as transformers ships
it, about 1e-7 relative from a true float64 forward (section 2.2 measured 6.5e-8 on logits of 0.54).

``hf_deepseek4_taps`` also returns each CSA layer's indexer choice (a forward hook on HF's ``DeepseekV4Indexer``),
as a chosen-entry mask [T, n] per layer, for the exact comparison of integer outputs.

MXFP4 experts (``spec.experts_mxfp4``): HF's model holds the experts dense here; their values come from
transformers' own FP4 loader op (``Fp8Dequantize._dequantize_one``, integrations/finegrained_fp8.py: the int8
nibbles, low first, times the e8m0 bytes' 2^(e - 127) per [1, 32] block), in float64, not from our decoder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import Deepseek4Spec

from ...oracle.hf import Float32AsFloat64, _transformers

HF_KINDS = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
            "hca": "heavily_compressed_attention"}


def hf_config(spec: Deepseek4Spec) -> Any:
    """transformers' ``DeepseekV4Config`` carrying the spec's numbers (eager attention and experts)."""
    tf = _transformers()
    ls, a, m = spec.layer, spec.attn, spec.moe
    compress: dict[str, Any] = {"rope_type": "default"}
    if a.compress_scaling is not None:
        s = a.compress_scaling
        if s.kind != "yarn":
            raise InputError(spec.source, f"the HF deepseek4 oracle takes a default or yarn compress rope, "
                                          f"not {s.kind!r}")
        compress = {"rope_type": "yarn", "factor": s.factor, "original_max_position_embeddings":
                    s.original_max_position, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                    "attention_factor": s.attention_factor, "truncate": s.truncate}
        compress |= {k: v for k, v in (("mscale", s.mscale), ("mscale_all_dim", s.mscale_all_dim)) if v}
    prf = a.rope_dim / a.head_dim
    config = tf.DeepseekV4Config(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, moe_intermediate_size=m.expert_ff,
        num_hidden_layers=spec.num_layers, num_attention_heads=a.num_heads, num_key_value_heads=1,
        head_dim=a.head_dim, q_lora_rank=a.q_lora_rank, num_experts_per_tok=m.top_k, n_routed_experts=m.num_experts,
        n_shared_experts=1, scoring_func="sqrtsoftplus", routed_scaling_factor=m.routed_scale,
        max_position_embeddings=spec.max_position, layer_types=[HF_KINDS[k] for k in spec.layer_types],
        compress_rates={"compressed_sparse_attention": a.csa_rate, "heavily_compressed_attention": a.hca_rate},
        hc_mult=spec.hc.count, hc_sinkhorn_iters=spec.hc.sinkhorn_iters, hc_eps=spec.hc.eps,
        mlp_layer_types=["hash_moe" if k == "hash" else "moe" for k in spec.mlp_types],
        swiglu_limit=spec.swiglu_limit, sliding_window=a.window, o_groups=a.o_groups, o_lora_rank=a.o_lora_rank,
        index_n_heads=a.index_heads, index_head_dim=a.index_head_dim, index_topk=a.index_topk,
        num_nextn_predict_layers=0, rms_norm_eps=ls.rms_eps, tie_word_embeddings=spec.tie_word_embeddings,
        partial_rotary_factor=prf, pad_token_id=0,
        rope_parameters={"main": {"rope_type": "default", "rope_theta": a.rope_theta, "partial_rotary_factor": prf},
                         "compress": compress | {"rope_theta": a.compress_theta, "partial_rotary_factor": prf}})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def build_hf_deepseek4(spec: Deepseek4Spec, lift: bool = True) -> torch.nn.Module:
    """A float64 ``DeepseekV4ForCausalLM`` carrying the trunk, loaded strictly (every module tensor present,
    nothing unexpected; ``tid2eid`` kept integer)."""
    if spec.family != "deepseek4" or spec.source_format not in ("hf", "gguf"):
        raise InputError(spec.source, "the HF deepseek4 oracle covers deepseek4 checkpoints only (HF or GGUF)")
    state = {n: (t.detach().to(torch.float64) if t.is_floating_point() else t.detach())
             for n, t in spec.tensors.items() if not n.startswith("mtp.") and not n.endswith("_scale_inv")}
    if spec.experts_mxfp4:
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize

        for n in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            state[n] = Fp8Dequantize(None)._dequantize_one(spec.tensors[n].view(torch.int8),
                                                           spec.tensors[n + "_scale_inv"], torch.float64)
    tf = _transformers()
    with Float32AsFloat64() if lift else contextlib.nullcontext():
        model = tf.DeepseekV4ForCausalLM(hf_config(spec)).to(torch.float64).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = sorted(set(missing) - ({"lm_head.weight"} if spec.tie_word_embeddings else set()))
    if missing or unexpected:
        raise InputError(spec.source, f"HF DeepseekV4ForCausalLM state dict mismatch: missing {missing}, "
                                      f"unexpected {sorted(unexpected)}")
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


@dataclass
class HFDeepseek4:
    """HF's float64 taps: final [T, H] (norm(hc_head(streams))), logits [T, V], hidden [L+1, T, S, H] (HF's
    hidden_states: the streams entering each layer, then final), chosen {CSA layer: bool [T, n]}."""

    final: np.ndarray
    logits: np.ndarray
    hidden: list[np.ndarray]
    chosen: dict[int, np.ndarray]


def hf_deepseek4_taps(spec: Deepseek4Spec, ids: Sequence[int], lift: bool = True) -> HFDeepseek4:
    """transformers' float64 forward over ids (positions 0..T-1, no cache)."""
    model = build_hf_deepseek4(spec, lift)
    chosen: dict[int, np.ndarray] = {}
    hooks = []
    for l, kind in enumerate(spec.layer_types):
        if kind == "csa":
            def keep(mod, args, out, l=l):
                n = (len(ids) // spec.attn.csa_rate)
                mask = np.zeros((len(ids), n), dtype=bool)
                for t, row in enumerate(out[0].tolist()):
                    for e in row:
                        if e >= 0:
                            mask[t, e] = True
                chosen[l] = mask
            hooks.append(model.model.layers[l].self_attn.compressor.indexer.register_forward_hook(keep))
    try:
        with torch.no_grad(), Float32AsFloat64() if lift else contextlib.nullcontext():
            out = model(input_ids=torch.tensor([list(ids)]), use_cache=False, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    hs = [h[0].numpy() for h in out.hidden_states]
    return HFDeepseek4(hs[-1], out.logits[0].numpy(), hs, chosen)


def hf_deepseek4_logits(spec: Deepseek4Spec, ids: Sequence[int]) -> np.ndarray:
    """transformers' true-float64 logits [T, V] over ids (the registry's oracle role)."""
    return hf_deepseek4_taps(spec, ids).logits
