"""Qwen3 targets: ``ModelSpec`` from an HF directory (model_type "qwen3") or a GGUF (arch "qwen3").

HF config.json keys (required unless a default is given):
  hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
  vocab_size; rms_norm_eps (1e-6), rope_theta or rope_parameters.rope_theta (10000),
  max_position_embeddings (32768), tie_word_embeddings (false); RoPE "linear" and "yarn" in
  rope_parameters / rope_scaling (``formats.rope_scaling``). Refused as unsupported: any other rope_type,
  use_sliding_window true, a layer_types entry other than "full_attention" (a DFlash draft reads its
  sliding layers itself: ``formats.sliding``), attention_bias true, hidden_act other than "silu".
GGUF keys (llama.cpp): qwen3.block_count, qwen3.context_length, qwen3.embedding_length,
  qwen3.feed_forward_length, qwen3.attention.head_count, qwen3.attention.layer_norm_rms_epsilon;
  qwen3.attention.head_count_kv (default head_count), qwen3.attention.key_length (default
  embedding_length / head_count), qwen3.rope.freq_base (default 10000, as llama.cpp). The vocab is
  the row count of token_embd.weight; no output.weight means tied embeddings. Qwen3 uses NEOX
  (rotate-half) RoPE in llama.cpp, so q/k rows are not permuted and are read as stored.
Every tensor in ``tensor_shapes`` must be present with exactly that shape (``BadTensor`` otherwise).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_gates.errors import BadConfig, BadTensor, Refused
from bloomery_gates.registry import family
from bloomery_gates.spec import LayerShape, ModelSpec

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile
from ...formats.hf_dir import open_safetensors_dir, read_config
from ...formats.lazy import check_shapes, layer_bound
from ...formats.rope_scaling import rope_scaling_of

FAMILY = "qwen3"
SUPPORTED_MODEL_TYPES = family(FAMILY).hf_model_types     # the registry names them
SUPPORTED_GGUF_ARCHS = family(FAMILY).gguf_archs
Shapes = dict[str, tuple[tuple[int, ...], str]]


def check_layer(layer: LayerShape, cfg: Cfg, heads_key: str, kv_key: str) -> None:
    """GQA needs num_heads to be a multiple of num_kv_heads."""
    if layer.num_heads % layer.num_kv_heads:
        raise cfg.bad(kv_key, f"{layer.num_kv_heads} does not divide {heads_key} = {layer.num_heads}; "
                              "expected num_attention_heads % num_key_value_heads == 0")


def _rope_theta(cfg: Cfg) -> float:
    """rope_theta of a default-RoPE config (the qwen38 reader's; any rope_type other than "default" refused)."""
    params = cfg.sub("rope_parameters")
    for key, sub in (("rope_parameters", params), ("rope_scaling", cfg.sub("rope_scaling"))):
        rtype = sub.get("rope_type", None) or sub.get("type", "default")
        if rtype != "default":
            raise cfg.bad(f"{key}.rope_type", f"{rtype!r} is not supported; expected \"default\" RoPE")
    if params.get("rope_theta", None) is not None:
        return params.rope_base("rope_theta")
    return cfg.rope_base("rope_theta", 10000.0)


def _theta(cfg: Cfg) -> float:
    params = cfg.sub("rope_parameters")
    if params.get("rope_theta", None) is not None:
        return params.rope_base("rope_theta")
    return cfg.rope_base("rope_theta", 10000.0)


def layer_shape_from_hf(cfg: Cfg, sliding: bool = False) -> LayerShape:
    """The Qwen3 decoder-layer numbers of an HF config (target or draft), RoPE scaling included. With
    ``sliding`` the caller reads layer_types / use_sliding_window itself (the DFlash draft)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise cfg.bad("hidden_act", f"{cfg.get('hidden_act')!r} is not supported; expected \"silu\"")
    if cfg.bool("attention_bias", False):
        raise cfg.bad("attention_bias", "true is not supported; expected false (no q/k/v/o biases)")
    if not sliding:
        if cfg.bool("use_sliding_window", False):
            raise cfg.bad("use_sliding_window", "true is not supported; expected false (full attention)")
        layer_types = cfg.get("layer_types", [])
        odd = sorted({t for t in layer_types if t != "full_attention"}) if isinstance(layer_types, list) else [1]
        if odd:
            raise cfg.bad("layer_types", f"{odd} not supported; expected only \"full_attention\"")
    layer = LayerShape(
        hidden_size=cfg.int("hidden_size"),
        num_heads=cfg.int("num_attention_heads"),
        num_kv_heads=cfg.int("num_key_value_heads"),
        head_dim=cfg.int("head_dim"),
        intermediate_size=cfg.int("intermediate_size"),
        rms_eps=cfg.float("rms_norm_eps", 1e-6),
        rope_theta=_theta(cfg),
        rope_scaling=rope_scaling_of(cfg),
    )
    check_layer(layer, cfg, "num_attention_heads", "num_key_value_heads")
    return layer


def layer_tensor_shapes(prefix: str, layer: LayerShape) -> Shapes:
    """Expected shapes of one decoder layer's tensors, names under ``prefix`` (``model.layers.0.``)."""
    H, d, I = layer.hidden_size, layer.head_dim, layer.intermediate_size
    q, kv = layer.num_heads * d, layer.num_kv_heads * d
    return {
        f"{prefix}input_layernorm.weight": ((H,), "[hidden_size]"),
        f"{prefix}self_attn.q_proj.weight": ((q, H), "[num_heads*head_dim, hidden_size]"),
        f"{prefix}self_attn.k_proj.weight": ((kv, H), "[num_kv_heads*head_dim, hidden_size]"),
        f"{prefix}self_attn.v_proj.weight": ((kv, H), "[num_kv_heads*head_dim, hidden_size]"),
        f"{prefix}self_attn.o_proj.weight": ((H, q), "[hidden_size, num_heads*head_dim]"),
        f"{prefix}self_attn.q_norm.weight": ((d,), "[head_dim]"),
        f"{prefix}self_attn.k_norm.weight": ((d,), "[head_dim]"),
        f"{prefix}post_attention_layernorm.weight": ((H,), "[hidden_size]"),
        f"{prefix}mlp.gate_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
        f"{prefix}mlp.up_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
        f"{prefix}mlp.down_proj.weight": ((H, I), "[hidden_size, intermediate_size]"),
    }


def tensor_shapes(layer: LayerShape, num_layers: int, vocab: int, tied: bool) -> Shapes:
    """Every tensor a Qwen3 target must carry (HF names) with its exact shape."""
    H = layer.hidden_size
    shapes: Shapes = {"model.embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]")}
    for i in range(num_layers):
        shapes.update(layer_tensor_shapes(f"model.layers.{i}.", layer))
    shapes["model.norm.weight"] = ((H,), "[hidden_size]")
    if not tied:
        shapes["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    return shapes


def qwen3_from_hf(directory: Path) -> ModelSpec:
    """A Qwen3 target from ``config.json`` + safetensors in ``directory``."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    tensors = open_safetensors_dir(directory)  # headers only; refuses pickle-only dirs first
    model_type = cfg.get("model_type", what=f"one of {list(SUPPORTED_MODEL_TYPES)}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise cfg.bad("model_type", f"{model_type!r} is not supported; "
                                    f"expected one of {list(SUPPORTED_MODEL_TYPES)}")
    layer = layer_shape_from_hf(cfg)
    num_layers = cfg.int("num_hidden_layers", what="the layer count", **layer_bound(tensors, "model.layers."))
    vocab = cfg.int("vocab_size")
    tied = cfg.bool("tie_word_embeddings", False)
    check_shapes(tensors, tensor_shapes(layer, num_layers, vocab, tied), directory)
    return ModelSpec(
        family=FAMILY, source=directory, source_format="hf", layer=layer, num_layers=num_layers,
        vocab_size=vocab, tie_word_embeddings=tied,
        max_position=cfg.int("max_position_embeddings", 32768), tensors=tensors,
    )


def qwen3_from_gguf(path: Path) -> ModelSpec:
    """A Qwen3 target from a llama.cpp GGUF (tensors renamed to HF names, dequantized to float32)."""
    f = GGUFFile(path)
    arch = f.meta("general.architecture", None)
    if arch is None:
        raise BadConfig(f"{path}: key general.architecture", "missing; expected \"qwen3\"")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise Refused(path, f"general.architecture is {arch!r}; "
                            f"this reader supports {list(SUPPORTED_GGUF_ARCHS)}")
    meta = {k: f.meta(k) for k in f.meta_keys() if k.startswith(f"{arch}.")}
    cfg = Cfg(meta, path)
    a = f"{arch}."
    if cfg.get(a + "rope.scaling.type", "none") != "none":
        raise cfg.bad(a + "rope.scaling.type", f"{cfg.get(a + 'rope.scaling.type')!r} is not supported for a GGUF "
                                               "target; expected \"none\" (scaled RoPE is read from HF configs)")
    H = cfg.int(a + "embedding_length")
    heads = cfg.int(a + "attention.head_count")
    kv = cfg.get(a + "attention.head_count_kv", heads)
    if isinstance(kv, list):  # per-layer list in some files: must be uniform here
        if not kv or len(set(kv)) != 1:
            raise cfg.bad(a + "attention.head_count_kv", f"{kv}; expected one value for every layer")
        meta[a + "attention.head_count_kv"] = kv[0]
    if H % heads and a + "attention.key_length" not in meta:
        raise cfg.bad(a + "attention.key_length", f"missing and embedding_length {H} is not a multiple of "
                                                  f"head_count {heads}; expected the head dim")
    layer = LayerShape(
        hidden_size=H, num_heads=heads,
        num_kv_heads=cfg.int(a + "attention.head_count_kv", heads),
        head_dim=cfg.int(a + "attention.key_length", H // heads),
        intermediate_size=cfg.int(a + "feed_forward_length"),
        rms_eps=cfg.float(a + "attention.layer_norm_rms_epsilon"),
        rope_theta=cfg.rope_base(a + "rope.freq_base", 10000.0),
    )
    check_layer(layer, cfg, a + "attention.head_count", a + "attention.head_count_kv")
    num_layers = cfg.int(a + "block_count", what="the layer count", **layer_bound(f.tensor_names(), "blk."))
    tensors = f.tensors()
    if "model.embed_tokens.weight" not in tensors:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [vocab, embedding_length]")
    vocab = tensors.shape_of("model.embed_tokens.weight")[0]
    if a + "vocab_size" in meta and cfg.int(a + "vocab_size") != vocab:
        raise cfg.bad(a + "vocab_size", f"{meta[a + 'vocab_size']}, but token_embd.weight has {vocab} rows")
    tied = "lm_head.weight" not in tensors
    check_shapes(tensors, tensor_shapes(layer, num_layers, vocab, tied), path)
    return ModelSpec(
        family=FAMILY, source=path, source_format="gguf", layer=layer, num_layers=num_layers,
        vocab_size=vocab, tie_word_embeddings=tied, max_position=cfg.int(a + "context_length"),
        tensors=tensors,
    )
