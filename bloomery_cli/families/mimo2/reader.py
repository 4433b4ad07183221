"""mimo2 targets (MiMo-V2-Flash, HF model_type ``mimo_v2_flash``): ``Mimo2Spec`` from an HF directory.

Two spellings of the same numbers exist and both are read, never silently defaulted:
  * MiMo's own keys (XiaomiMiMo config.json, what llama.cpp's converter and vLLM read): ``hybrid_layer_pattern``
    (per layer 0 = full, 1 = sliding window), ``moe_layer_freq`` (0 = dense, 1 = sparse), ``swa_num_attention_heads``,
    ``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``, ``sliding_window_size`` (previous tokens a
    query sees, itself excluded), ``layernorm_epsilon``, ``rope_theta`` / ``swa_rope_theta``,
    ``partial_rotary_factor``, ``add_swa_attention_sink_bias`` / ``add_full_attention_sink_bias``;
  * transformers' keys (``MiMoV2FlashConfig``): ``layer_types``, ``mlp_layer_types``, ``sliding_window`` (keys per
    query counting itself = sliding_window_size + 1), ``rms_norm_eps``, ``rope_parameters`` per layer type; SWA
    layers carry 2 x ``num_key_value_heads`` and sinks, full layers neither (HF hard-codes both).
Where both spellings are present they must agree (a ``BadConfig`` naming the pair otherwise); where neither is,
the key is missing (``BadConfig``), never HF's silent default (every 6th layer full, one dense layer first).

Common keys: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, v_head_dim,
intermediate_size, vocab_size, attention_value_scale (null = 1), max_position_embeddings, tie_word_embeddings;
with sparse layers n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_group, topk_group,
norm_topk_prob, routed_scaling_factor (null = 1.0, as the hub stores it). Refused: attention_bias, a hidden_act
other than silu, a scoring_func other than sigmoid, a fused ``qkv_proj`` (MiMo-V2.5).

Tensors (the checkpoint's names): model.embed_tokens, model.layers.{i}.{input_layernorm, post_attention_layernorm},
self_attn.{q,k,v,o}_proj, self_attn.attention_sink_bias [nh] (sink layers), dense mlp.{gate,up,down}_proj or sparse
mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E], mlp.experts.{e}.{gate,up,down}_proj; model.norm,
lm_head; the MTP layers model.mtp.layers.{k}.* pass through (``formats.mimo2_mtp`` reads them).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_gates.errors import BadConfig
from bloomery_gates.registry import family
from bloomery_gates.spec import AttnShape, LayerShape, Mimo2Spec, MimoShape, MoEShape

from ...formats.config import Cfg
from ...formats.hf_dir import open_safetensors_dir, read_config
from ...formats.lazy import check_shapes, layer_bound

FAMILY = "mimo2"
MODEL_TYPES = family(FAMILY).hf_model_types     # the registry names them
KINDS = ("full_attention", "sliding_attention")
MLP_KINDS = ("dense", "sparse")
Shapes = dict[str, tuple[tuple[int, ...], str]]


def is_mimo2(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and read_config(path).get("model_type") in MODEL_TYPES


def _agree(cfg: Cfg, a: str, va, b: str, vb) -> None:
    if va is not None and vb is not None and va != vb:
        raise cfg.bad(a, f"{va!r} disagrees with {b} = {vb!r} (the two spellings of one number); expected equal")


def _per_layer(cfg: Cfg, hf_key: str, native_key: str, kinds: tuple[str, str], layers: int) -> tuple[str, ...]:
    """A per-layer kind list from the HF key (names) or MiMo's own (0/1 flags), both checked when both are set."""
    hf, native = cfg.get(hf_key, None), cfg.get(native_key, None)
    if hf is None and native is None:
        raise cfg.bad(hf_key, f"missing, and so is {native_key}; expected one of them ({layers} entries): the "
                              "layer pattern is not defaulted")
    out = None
    if hf is not None:
        if not isinstance(hf, list) or len(hf) != layers or any(k not in kinds for k in hf):
            raise cfg.bad(hf_key, f"{hf!r}; expected {layers} entries, each one of {list(kinds)}")
        out = tuple(hf)
    if native is not None:
        if not isinstance(native, list) or len(native) != layers or any(f not in (0, 1) for f in native):
            raise cfg.bad(native_key, f"{native!r}; expected {layers} flags, each 0 ({kinds[0]}) or 1 ({kinds[1]})")
        own = tuple(kinds[f] for f in native)
        _agree(cfg, native_key, own, hf_key, out)
        out = own
    return out


def _rope(cfg: Cfg, kind: str, native_theta: str) -> tuple[float, float]:
    """(theta, partial_rotary_factor) of one layer kind: rope_parameters[kind] or MiMo's rope_theta /
    swa_rope_theta + partial_rotary_factor; both checked when both are set."""
    sub = cfg.sub("rope_parameters").sub(kind) if isinstance(cfg.get("rope_parameters", None), dict) else None
    theta = sub.rope_base("rope_theta") if sub is not None and sub.get("rope_theta", None) is not None else None
    prf = sub.float("partial_rotary_factor") if sub is not None and sub.get("partial_rotary_factor", None) \
        is not None else None
    if sub is not None and sub.get("rope_type", "default") != "default":
        raise sub.bad("rope_type", f"{sub.get('rope_type')!r}; expected \"default\"")
    n_theta = cfg.rope_base(native_theta) if cfg.get(native_theta, None) is not None else None
    n_prf = cfg.float_opt("partial_rotary_factor")
    _agree(cfg, native_theta, n_theta, f"rope_parameters.{kind}.rope_theta", theta)
    _agree(cfg, "partial_rotary_factor", n_prf, f"rope_parameters.{kind}.partial_rotary_factor", prf)
    theta, prf = (theta if theta is not None else n_theta), (prf if prf is not None else n_prf)
    if theta is None:
        raise cfg.bad(native_theta, f"missing, and so is rope_parameters.{kind}.rope_theta; expected one")
    if prf is None:
        raise cfg.bad("partial_rotary_factor", f"missing, and so is rope_parameters.{kind}.partial_rotary_factor")
    return theta, prf


def _window(cfg: Cfg) -> int:
    """Keys per SWA query counting itself: HF sliding_window = MiMo sliding_window_size + 1."""
    hf = cfg.int_opt("sliding_window")
    own = cfg.int_opt("sliding_window_size")
    if hf is None and own is None:
        raise cfg.bad("sliding_window_size", "missing, and so is sliding_window; expected one (SWA layers exist)")
    if own is not None:
        _agree(cfg, "sliding_window", hf, "sliding_window_size + 1", own + 1)
        return own + 1
    return hf


def _attn(cfg: Cfg, swa: bool, layer: LayerShape, dv: int) -> AttnShape:
    kind = "sliding_attention" if swa else "full_attention"
    theta, prf = _rope(cfg, kind, "swa_rope_theta" if swa else "rope_theta")
    nh, nkv, d = layer.num_heads, layer.num_kv_heads * (2 if swa else 1), layer.head_dim
    if swa:
        for key, hf_value in (("swa_num_attention_heads", nh), ("swa_num_key_value_heads", nkv),
                              ("swa_head_dim", d), ("swa_v_head_dim", dv)):
            own = cfg.get(key, None)
            if own is not None and own != hf_value:
                raise cfg.bad(key, f"{own}; transformers' MiMoV2Flash builds {hf_value} here (SWA kv heads = 2 x "
                                   "num_key_value_heads, the other SWA dims the full ones); expected equal")
    flag = "add_swa_attention_sink_bias" if swa else "add_full_attention_sink_bias"
    sinks = cfg.bool(flag, swa)
    rot = int(d * prf)
    if rot < 2 or rot % 2 or rot > d:
        raise cfg.bad("partial_rotary_factor", f"{prf} gives rotary dim {rot}; expected an even number in [2, {d}]")
    return AttnShape(nh, nkv, d, dv, theta, rot, _window(cfg) if swa else None, sinks)


def _moe(cfg: Cfg, hidden: int) -> MoEShape:
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise cfg.bad("scoring_func", f"{cfg.get('scoring_func')!r}; expected \"sigmoid\" (MiMo-V2's router)")
    e = cfg.int("n_routed_experts")
    k = cfg.int("num_experts_per_tok", maximum=e, why=f"n_routed_experts is {e}")
    g = cfg.int("n_group")
    if e % g:
        raise cfg.bad("n_group", f"{g} does not divide n_routed_experts {e}")
    if e // g < 2:
        raise cfg.bad("n_group", f"{g} leaves {e // g} experts per group; the group score is a top-2 sum")
    tg = cfg.int("topk_group", maximum=g, why=f"n_group is {g}")
    if tg * (e // g) < k:
        raise cfg.bad("topk_group", f"{tg} groups of {e // g} experts cannot hold num_experts_per_tok {k}")
    return MoEShape(num_experts=e, top_k=k, expert_ff=cfg.int("moe_intermediate_size"), router="sigmoid",
                    n_group=g, topk_group=tg, norm_topk=cfg.bool("norm_topk_prob", True),
                    routed_scale=cfg.float("routed_scaling_factor", 1.0))


def read_shapes(cfg: Cfg, layers: int) -> tuple[LayerShape, MimoShape]:
    if cfg.get("hidden_act", "silu") != "silu":
        raise cfg.bad("hidden_act", f"{cfg.get('hidden_act')!r} is not supported; expected \"silu\"")
    if cfg.bool("attention_bias", False):
        raise cfg.bad("attention_bias", "true is not supported; expected false")
    hf_eps = cfg.float_opt("rms_norm_eps")
    own_eps = cfg.float_opt("layernorm_epsilon")
    _agree(cfg, "layernorm_epsilon", own_eps, "rms_norm_eps", hf_eps)
    if hf_eps is None and own_eps is None:
        raise cfg.bad("layernorm_epsilon", "missing, and so is rms_norm_eps; expected one")
    types = _per_layer(cfg, "layer_types", "hybrid_layer_pattern", KINDS, layers)
    mlps = _per_layer(cfg, "mlp_layer_types", "moe_layer_freq", MLP_KINDS, layers)
    H, nh, nkv = cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("num_key_value_heads")
    if nh % (2 * nkv) and "sliding_attention" in types:
        raise cfg.bad("num_attention_heads", f"{nh} is not a multiple of the SWA layers' {2 * nkv} kv heads")
    if nh % nkv:
        raise cfg.bad("num_attention_heads", f"{nh} is not a multiple of num_key_value_heads {nkv}")
    full_theta, prf = _rope(cfg, "full_attention", "rope_theta")
    layer = LayerShape(H, nh, nkv, cfg.int("head_dim"), cfg.int("intermediate_size"),
                       own_eps if own_eps is not None else hf_eps, full_theta)
    dv = cfg.int("v_head_dim")
    full = _attn(cfg, False, layer, dv)
    swa = _attn(cfg, True, layer, dv) if "sliding_attention" in types else full
    scale = cfg.get("attention_value_scale", 1.0)
    scale = cfg.float("attention_value_scale") if scale != 1.0 else 1.0
    moe = _moe(cfg, H) if "sparse" in mlps else None
    return layer, MimoShape(types, mlps, full, swa, scale, prf, moe)


def attn_shapes(p: str, H: int, a: AttnShape) -> Shapes:
    nh, nkv, d, dv = a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim
    s: Shapes = {p + "q_proj.weight": ((nh * d, H), "[num_heads*head_dim, hidden]"),
                 p + "k_proj.weight": ((nkv * d, H), "[kv_heads*head_dim, hidden]"),
                 p + "v_proj.weight": ((nkv * dv, H), "[kv_heads*v_head_dim, hidden]"),
                 p + "o_proj.weight": ((H, nh * dv), "[hidden, num_heads*v_head_dim]")}
    if a.sinks:
        s[p + "attention_sink_bias"] = ((nh,), "[num_heads] (per-head attention sinks)")
    return s


def dense_shapes(p: str, H: int, inter: int) -> Shapes:
    return {p + "gate_proj.weight": ((inter, H), "[intermediate_size, hidden]"),
            p + "up_proj.weight": ((inter, H), "[intermediate_size, hidden]"),
            p + "down_proj.weight": ((H, inter), "[hidden, intermediate_size]")}


def tensor_shapes(layer: LayerShape, m: MimoShape, layers: int, vocab: int, tied: bool) -> Shapes:
    H = layer.hidden_size
    s: Shapes = {"model.embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]"),
                 "model.norm.weight": ((H,), "[hidden_size]")}
    if not tied:
        s["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    for i in range(layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = ((H,), "[hidden_size]")
        s[p + "post_attention_layernorm.weight"] = ((H,), "[hidden_size]")
        s.update(attn_shapes(p + "self_attn.", H, m.attn(i)))
        if m.mlp_types[i] == "dense":
            s.update(dense_shapes(p + "mlp.", H, layer.intermediate_size))
        else:
            e, f = m.moe.num_experts, m.moe.expert_ff
            s[p + "mlp.gate.weight"] = ((e, H), "[n_routed_experts, hidden] (router)")
            s[p + "mlp.gate.e_score_correction_bias"] = ((e,), "[n_routed_experts]")
            for x in range(e):
                s.update(dense_shapes(f"{p}mlp.experts.{x}.", H, f))
    return s


def mimo2_from_hf(directory: Path) -> Mimo2Spec:
    """A mimo2 target from ``config.json`` + safetensors in ``directory``."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    model_type = cfg.get("model_type", what=f"one of {list(MODEL_TYPES)}")
    if model_type not in MODEL_TYPES:
        raise cfg.bad("model_type", f"{model_type!r} is not supported; expected one of {list(MODEL_TYPES)}")
    tensors = open_safetensors_dir(directory)
    if any(n.endswith("self_attn.qkv_proj.weight") for n in tensors):
        raise BadConfig(f"{directory}: tensor self_attn.qkv_proj.weight",
                        "a fused qkv projection (MiMo-V2.5 layout); expected split q_proj / k_proj / v_proj")
    layers = cfg.int("num_hidden_layers", what="the layer count", **layer_bound(tensors, "model.layers."))
    layer, m = read_shapes(cfg, layers)
    mtp = sorted({int(n.split(".")[3]) for n in tensors if n.startswith("model.mtp.layers.")})
    vocab, tied = cfg.int("vocab_size"), cfg.bool("tie_word_embeddings", False)
    check_shapes(tensors, tensor_shapes(layer, m, layers, vocab, tied), directory)
    m = MimoShape(m.layer_types, m.mlp_types, m.full, m.swa, m.value_scale, m.partial_rotary_factor, m.moe, len(mtp))
    return Mimo2Spec(family=FAMILY, source=directory, source_format="hf", layer=layer, num_layers=layers,
                     vocab_size=vocab, tie_word_embeddings=tied, max_position=cfg.int("max_position_embeddings"),
                     tensors=tensors, mimo=m)
