"""Tier-3 oracle for mimo2: transformers' own ``MiMoV2FlashForCausalLM`` (and ``MtpModel`` on it for the 3-layer
MTP head) on the spec's weights, CPU float64, eager attention and eager experts (FAMILIES_MOE.md section 2.1),
built and run under ``oracle.Float32AsFloat64`` so its float32 islands (norms, router, softmax, rotary) run in
float64 too. Built from the spec's numbers, never from a hub name.

Checkpoint names -> HF module names: ``self_attn.attention_sink_bias`` -> ``self_attn.sinks``; per-expert
``mlp.experts.{e}.{gate,up}_proj.weight`` -> ``mlp.experts.gate_up_proj`` [E, 2F, H] (gate rows first),
``down_proj`` -> ``mlp.experts.down_proj`` [E, H, F]; the MTP shim (section 3): ``num_mtp_layers``,
``mtp_layer_types`` all sliding, ``mtp_mlp_layer_types`` all dense, and per layer ``pre_mlp_layernorm`` ->
``mtp_block.post_attention_layernorm``, ``final_layernorm`` -> ``post_norm``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import Mimo2Spec

from ...oracle.hf import Float32AsFloat64, _transformers, build_hf_model


def hf_config(spec: Mimo2Spec) -> Any:
    tf = _transformers()
    ls, m = spec.layer, spec.mimo
    if m.swa.num_kv_heads != 2 * ls.num_kv_heads or m.full.sinks or (not m.swa.sinks and
                                                                      "sliding_attention" in m.layer_types):
        raise InputError(spec.source, "transformers' MiMoV2Flash hard-codes SWA kv heads = 2 x full and sinks on SWA "
                                      "layers only; this checkpoint differs, no HF oracle")
    rope = {"full_attention": {"rope_type": "default", "rope_theta": m.full.rope_theta,
                               "partial_rotary_factor": m.partial_rotary_factor},
            "sliding_attention": {"rope_type": "default", "rope_theta": m.swa.rope_theta,
                                  "partial_rotary_factor": m.partial_rotary_factor}}
    moe = m.moe
    kw = {} if moe is None else dict(n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                                     moe_intermediate_size=moe.expert_ff, n_group=moe.n_group,
                                     topk_group=moe.topk_group, norm_topk_prob=moe.norm_topk,
                                     routed_scaling_factor=moe.routed_scale)
    config = tf.MiMoV2FlashConfig(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, intermediate_size=ls.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=ls.num_heads, num_key_value_heads=ls.num_kv_heads,
        head_dim=ls.head_dim, v_head_dim=m.full.v_head_dim, rms_norm_eps=ls.rms_eps,
        max_position_embeddings=spec.max_position, tie_word_embeddings=spec.tie_word_embeddings,
        layer_types=list(m.layer_types), mlp_layer_types=list(m.mlp_types), rope_parameters=rope,
        sliding_window=m.swa.window or 1, attention_value_scale=m.value_scale, **kw)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def hf_state(tensors: Mapping[str, torch.Tensor], prefix: str, experts: int | None) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors under ``prefix`` -> HF module names (sinks renamed, experts fused), float64."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if not name.startswith(prefix):
            continue
        x = t.detach().to(torch.float64)
        if ".mlp.experts." in name:
            head, rest = name.split(".mlp.experts.", 1)
            e, proj = rest.split(".", 1)
            fused.setdefault(head, {}).setdefault(int(e), {})[proj.split("_proj")[0]] = x
            continue
        out[name.replace("self_attn.attention_sink_bias", "self_attn.sinks")] = x
    for head, per in fused.items():
        order = range(experts or len(per))
        out[head + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([per[e]["gate"], per[e]["up"]])
                                                               for e in order])
        out[head + ".mlp.experts.down_proj"] = torch.stack([per[e]["down"] for e in order])
    return out


def build_hf_mimo2(spec: Mimo2Spec) -> torch.nn.Module:
    """A float64 ``MiMoV2FlashForCausalLM`` carrying the trunk (``model.mtp.*`` left out; sinks renamed and experts
    fused to HF's module names by ``hf_state``), loaded strictly (``oracle.build_hf_model``)."""
    moe = spec.mimo.moe
    state = hf_state({n: t for n, t in spec.tensors.items() if not n.startswith("model.mtp.")}, "",
                     moe.num_experts if moe else None)
    return build_hf_model(spec, "MiMoV2FlashForCausalLM", hf_config(spec), "mimo2", state)


def hf_mimo2_logits(spec: Mimo2Spec, ids: Sequence[int]) -> np.ndarray:
    """transformers' float64 logits [T, V] over ids (positions 0..T-1, no cache)."""
    model = build_hf_mimo2(spec)
    with torch.no_grad(), Float32AsFloat64():
        out = model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0].numpy()


MTP_RENAMES = (("pre_mlp_layernorm.", "mtp_block.post_attention_layernorm."), ("final_layernorm.", "post_norm."),
               ("enorm.", "enorm."), ("hnorm.", "hnorm."), ("eh_proj.", "eh_proj."))


def _mtp_name(name: str) -> str:
    k, rest = name[len("model.mtp.layers."):].split(".", 1)
    for src, dst in MTP_RENAMES:
        if rest.startswith(src):
            return f"layers.{k}.{dst}{rest[len(src):]}"
    return f"layers.{k}.mtp_block.{rest}".replace("self_attn.attention_sink_bias", "self_attn.sinks")


def hf_mtp_chain(spec: Mimo2Spec, ids: Sequence[int], steps: int) -> list[np.ndarray] | None:
    """transformers' ``MtpModel`` (the section-3 shim) on the trunk, float64, teacher-forced over ``ids``: step s
    (1..steps) runs MTP layer s-1 over every row its inputs reach, HF's own loop (``MtpModel.forward``'s roll of
    ids, positions and the previous layer's output). Returns per step the logits [T-s, V]: step s's row i reads
    token i+s and predicts token i+s+1. None where the installed transformers has no MtpModel, or one without the
    per-layer step this chain drives (``forward_layer`` / ``_project_to_logits``: transformers 5.17 lacks them)."""
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:
        return None
    if not (hasattr(MtpModel, "forward_layer") and hasattr(MtpModel, "_project_to_logits")):
        return None
    model = build_hf_mimo2(spec)
    n = spec.mimo.mtp_layers
    cfg = model.config
    cfg.num_mtp_layers, cfg.mtp_layer_types, cfg.mtp_mlp_layer_types = n, ["sliding_attention"] * n, ["dense"] * n
    with Float32AsFloat64():
        hf = MtpModel(model, n).to(torch.float64).eval()
    state = {_mtp_name(k): v.detach().double() for k, v in spec.tensors.items() if k.startswith("model.mtp.")}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight", "shared_head.weight"}:
        raise ValueError(f"MtpModel state dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    x = torch.tensor([list(ids)])
    out = []
    with torch.no_grad(), Float32AsFloat64():
        h = model(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states[-1][:, :-1]
        for s in range(1, steps + 1):
            t = h.shape[1]
            h = hf.forward_layer(s - 1, h, torch.arange(s, s + t)[None], None, input_ids=x[:, s:s + t])
            out.append(hf._project_to_logits(h)[0].numpy())
            h = h[:, :-1]
    return out
