"""Tier-3 oracle (CONTRACT.md): HF transformers' own Qwen3 modeling code on the spec's weights.

Built from the spec's numbers (never ``from_pretrained`` on a hub name, so no network), on CPU, in
float64. Meant for tiny configs in tests and checks: it holds a float64 copy of every weight.

Float32 islands. Even in a float64 model, HF's Qwen3 computes three things in float32: RMSNorm
(``hidden_states.to(torch.float32)``), the RoPE cos/sin table (``inv_freq`` and the angles in
float), and eager attention's softmax (``softmax(..., dtype=torch.float32)``). Stock, the oracle
therefore agrees with an exact float64 computation only to about 1e-7 relative. With
``promote_f32=True`` (the default) those islands are lifted to float64 on this model instance only
(nothing global is patched): RMSNorm and rotary modules get float64 forwards of the same formulas,
and attention runs through HF's "sdpa" path (torch's own kernel, which computes float64 inputs in
float64) instead of "eager". Everything structural stays HF's: layer wiring, where q/k norms sit,
GQA head grouping, rotate-half, the causal mask, head tying. ``promote_f32=False`` runs the stock
model with attn_implementation "eager".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import LayerShape, ModelSpec


@dataclass(frozen=True)
class HFOut:
    """logits [T, V]; hidden_states [L+1, T, H] in HF's convention (index L is post-final-norm)."""

    logits: np.ndarray
    hidden_states: np.ndarray


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise InputError("transformers", "not installed: pip install '.[dev]' for --oracle") from e
    return transformers


def _promote_rms_norm(mod: torch.nn.Module) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return mod.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon))

    mod.forward = forward


def _promote_rotary(mod: torch.nn.Module, theta: float, head_dim: int) -> None:
    """Default RoPE: the formula in float64. A scaled RoPE (yarn, linear): HF's own ``ROPE_INIT_FUNCTIONS``
    entry re-run under ``Float32AsFloat64`` (its float32 ``arange`` / ramp lifted), cos/sin times HF's
    ``attention_scaling`` as its forward does."""
    scale = 1.0
    if getattr(mod, "rope_type", "default") == "default":
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        with Float32AsFloat64():
            inv_freq, scale = ROPE_INIT_FUNCTIONS[mod.rope_type](mod.config)
        inv_freq = inv_freq.to(torch.float64)

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    mod.forward = forward


def hf_rope_parameters(ls: LayerShape) -> dict[str, Any]:
    """The layer's RoPE as HF's ``rope_parameters`` (the keys ``formats.rope_scaling`` read)."""
    r = ls.rope_scaling
    if r is None:
        return {"rope_type": "default", "rope_theta": ls.rope_theta}
    if r.kind == "linear":
        return {"rope_type": "linear", "rope_theta": ls.rope_theta, "factor": r.factor}
    out = {"rope_type": "yarn", "rope_theta": ls.rope_theta, "factor": r.factor,
           "original_max_position_embeddings": r.original_max_position, "beta_fast": r.beta_fast,
           "beta_slow": r.beta_slow, "truncate": r.truncate}
    for key in ("attention_factor", "mscale", "mscale_all_dim"):
        if getattr(r, key) is not None:
            out[key] = getattr(r, key)
    return out


def build_hf_qwen3(spec: ModelSpec, promote_f32: bool = True) -> torch.nn.Module:
    """A float64 ``Qwen3ForCausalLM`` on CPU carrying the spec's weights (eval mode)."""
    tf = _transformers()
    if spec.family != "qwen3":
        raise InputError(spec.source, f"the HF oracle covers family qwen3, not {spec.family!r}")
    ls = spec.layer
    config = tf.Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, intermediate_size=ls.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=ls.num_heads,
        num_key_value_heads=ls.num_kv_heads, head_dim=ls.head_dim, rms_norm_eps=ls.rms_eps,
        rope_parameters=hf_rope_parameters(ls),
        max_position_embeddings=spec.max_position, tie_word_embeddings=spec.tie_word_embeddings,
        attention_bias=False, use_sliding_window=False, hidden_act="silu",
    )
    config._attn_implementation = "sdpa" if promote_f32 else "eager"
    model = tf.Qwen3ForCausalLM(config).to(torch.float64).eval()
    state = {name: t.detach().to(torch.float64) for name, t in spec.tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if spec.tie_word_embeddings else set()
    if unexpected or set(missing) - allowed_missing:
        raise InputError(spec.source, f"HF Qwen3 state dict mismatch: missing {sorted(missing)}, "
                                      f"unexpected {sorted(unexpected)}")
    if spec.tie_word_embeddings and model.lm_head.weight.data_ptr() != \
            model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight
    if promote_f32:
        rms_cls = type(model.model.norm)
        for mod in model.modules():
            if isinstance(mod, rms_cls):
                _promote_rms_norm(mod)
        _promote_rotary(model.model.rotary_emb, ls.rope_theta, ls.head_dim)
    return model


def hf_qwen3(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> HFOut:
    """HF's logits and hidden_states for one sequence (positions 0..T-1, no cache)."""
    model = build_hf_qwen3(spec, promote_f32)
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    hidden = torch.stack([h[0] for h in out.hidden_states])
    return HFOut(logits=out.logits[0].numpy(), hidden_states=hidden.numpy())


def hf_qwen3_logits(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> np.ndarray:
    """HF transformers' Qwen3ForCausalLM float64 logits [T, V] on the spec's weights."""
    return hf_qwen3(spec, ids, promote_f32).logits


# ---------------------------------------------------------------------------------------------- qwen38

class Float32AsFloat64:
    """A ``TorchFunctionMode`` (built lazily) under which every float32 request in HF's code runs in float64:
    ``Tensor.float()`` becomes ``Tensor.double()`` and a ``torch.float32`` dtype argument (``.to(...)``,
    ``dtype=`` of ``softmax`` / ``arange`` / ...) becomes ``torch.float64``. HF's Qwen3.5 code has float32
    islands the qwen3 promotion does not reach (the Gated DeltaNet casts q/k/v/beta/g to float32 and
    computes g from ``A_log.float()``, its gated norm normalises in float32, the rotary table is float32),
    and this lifts all of them without touching the wiring: the layer code that runs is HF's own."""

    def __new__(cls):
        from torch.overrides import TorchFunctionMode

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                if func is torch.Tensor.float:
                    func = torch.Tensor.double
                if kwargs.get("dtype") is torch.float32:
                    kwargs["dtype"] = torch.float64
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                return func(*args, **kwargs)

        return _Mode()


def hybrid_config_keys(spec: ModelSpec) -> dict[str, Any]:
    """The keys every Qwen3.5-style hybrid text config (qwen38, qwen35moe, qwen4exp) takes, in HF's names, from the
    spec: sizes, RoPE (partial), the layer schedule and the gated DeltaNet's shape."""
    ls, hy = spec.layer, spec.hybrid
    return dict(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=ls.num_heads, num_key_value_heads=ls.num_kv_heads, head_dim=ls.head_dim,
        rms_norm_eps=ls.rms_eps, max_position_embeddings=spec.max_position,
        rope_parameters={"rope_type": "default", "rope_theta": ls.rope_theta,
                         "partial_rotary_factor": hy.partial_rotary_factor},
        tie_word_embeddings=spec.tie_word_embeddings, attention_bias=False, hidden_act="silu",
        layer_types=list(hy.layer_types), linear_conv_kernel_dim=hy.linear_conv_kernel_dim,
        linear_key_head_dim=hy.linear_key_head_dim, linear_value_head_dim=hy.linear_value_head_dim,
        linear_num_key_heads=hy.linear_num_key_heads, linear_num_value_heads=hy.linear_num_value_heads)


def qwen38_hf_config(spec: ModelSpec) -> Any:
    """transformers' ``Qwen3_5TextConfig`` carrying the spec's numbers (eager attention)."""
    tf = _transformers()
    config = tf.Qwen3_5TextConfig(intermediate_size=spec.layer.intermediate_size, **hybrid_config_keys(spec))
    config._attn_implementation = "eager"
    return config


def build_hf_model(spec: ModelSpec, cls_name: str, config, family: str, state: dict | None = None,
                   promote_f32: bool = True, computed: tuple[str, ...] = ()) -> torch.nn.Module:
    """A float64 transformers ``cls_name`` (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``,
    ``MiMoV2FlashForCausalLM``) on CPU from ``config``, eval mode, carrying ``state`` strictly: every module
    tensor present, nothing unexpected (``lm_head`` tied when the spec ties it). ``state`` defaults to the spec's
    trunk tensors under their own names (``mtp.*`` left out: not part of those classes, as HF's own loader
    ignores them). With ``promote_f32`` it is built under ``Float32AsFloat64`` (so its rotary table is float64).
    ``computed``: names of buffers HF derives from the config itself (qwen4exp's PLE hashing tables): never loaded
    from the spec, never missing."""
    import contextlib
    tf = _transformers()
    if spec.family != family:
        raise InputError(spec.source, f"the HF {family} oracle covers family {family}, not {spec.family!r}")
    with Float32AsFloat64() if promote_f32 else contextlib.nullcontext():
        model = getattr(tf, cls_name)(config).to(torch.float64).eval()
    if state is None:
        state = {n: t for n, t in spec.tensors.items()
                 if not n.startswith("mtp.") and n.rsplit(".", 1)[-1] not in computed}
    missing, unexpected = model.load_state_dict({n: t.detach().to(torch.float64) for n, t in state.items()},
                                                strict=False)
    missing = sorted(n for n in set(missing) - ({"lm_head.weight"} if spec.tie_word_embeddings else set())
                     if n.rsplit(".", 1)[-1] not in computed)
    if unexpected or missing:
        raise InputError(spec.source, f"HF {cls_name} state dict mismatch: missing {missing}, "
                                      f"unexpected {sorted(unexpected)}")
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def build_hf_qwen38(spec: ModelSpec, promote_f32: bool = True) -> torch.nn.Module:
    """A float64 ``Qwen3_5ForCausalLM`` carrying the spec's trunk weights (``build_hf_model``)."""
    return build_hf_model(spec, "Qwen3_5ForCausalLM", qwen38_hf_config(spec), "qwen38", promote_f32=promote_f32)


def hf_qwen38(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> HFOut:
    """HF's Qwen3_5ForCausalLM logits and hidden_states for one sequence (positions 0..T-1, no cache)."""
    import contextlib
    model = build_hf_qwen38(spec, promote_f32)
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad(), Float32AsFloat64() if promote_f32 else contextlib.nullcontext():
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    hidden = torch.stack([h[0] for h in out.hidden_states])
    return HFOut(logits=out.logits[0].numpy(), hidden_states=hidden.numpy())


def hf_qwen38_logits(spec: ModelSpec, ids: Sequence[int], promote_f32: bool = True) -> np.ndarray:
    """HF transformers' Qwen3_5ForCausalLM float64 logits [T, V] on the spec's weights."""
    return hf_qwen38(spec, ids, promote_f32).logits
