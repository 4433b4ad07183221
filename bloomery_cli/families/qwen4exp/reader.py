"""qwen4exp targets from an HF directory (model_type ``qwen4_exp``; docs/FAMILIES_MOE.md 4.5): ``Qwen4ExpSpec``.

The qwen35moe hybrid's keys (``formats.qwen38._shapes_from_cfg`` reads and range-checks hidden, heads, GDN, rope)
with, on top:

    layer_types          linear_attention | indexed_attention (the checkpoint's full_attention is the same kind)
    partial_rotary_factor  required: qwen4_exp has no default (top level or rope_parameters)
    router               num_experts E, num_experts_per_tok k <= E, moe_intermediate_size ff,
                         shared_expert_intermediate_size, norm_topk_prob (default true), softmax
    HC                   hc_count >= 2 streams, hc_lowrank r >= 1
    QSA                  indexer_{n_heads, kv_heads (= 1), head_dim, budget, compress_ratio}, budget % ratio == 0
    PLE                  ple_layer_ids (1-based, linear layers only; [] none), ple_embed_dim divisible by the
                         (ngram_size - 1) * heads_per_ngram heads, ngram_size 2..8, total heads <= 64,
                         ple_conv_kernel_size, ngram_vocab_size_base, make_ngram_vocab_size_divisible_by, seed,
                         split_ngram_parts
    output_gate_type     sigmoid | silu (the GDN output gate)

Tensors (HF names, checked by shape): model.embed_tokens [V, H], lm_head [V, H] unless tied, and each layer's MoE
set (``formats.qwen35moe.moe_layer_shapes``: fused or per expert). The HC, PLE and QSA tensors' HF names are not in
the design notes, so they are not checked here. ``mtp.*`` tensors (the HF MTP layout) are counted, not read.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.hf_dir import model_config, open_safetensors_dir
from bloomery_cli.formats.lazy import LazyTensors, check_shapes, layer_bound
from bloomery_gates.registry import family
from bloomery_gates.spec import HCShape, HybridShape, LayerShape, MoEShape, PLEShape, QSAShape, Qwen4ExpSpec

from ..qwen35moe.reader import StackedExperts, moe_layer_shapes
from ..qwen38.reader import MappedTensors, Shapes, _shapes_from_cfg

FAMILY = "qwen4exp"
KINDS = {"linear_attention": "linear_attention", "indexed_attention": "full_attention",
         "full_attention": "full_attention"}
GATE_TYPES = ("sigmoid", "silu")


def output_gate(cfg: Cfg) -> str:
    """The GDN output gate's activation: ``output_gate_type``, else ``hidden_act`` (default silu), as HF reads it."""
    return cfg.get("output_gate_type", None) or cfg.get("hidden_act", "silu")


def moe_shape(cfg: Cfg) -> MoEShape:
    e, k = cfg.int("num_experts", minimum=1), cfg.int("num_experts_per_tok", minimum=1)
    if k > e:
        raise cfg.bad("num_experts_per_tok", f"{k} is more than num_experts {e}; expected <= {e}")
    shared = cfg.int("shared_expert_intermediate_size", minimum=0)
    return MoEShape(num_experts=e, top_k=k, expert_ff=cfg.int("moe_intermediate_size"), shared_ff=shared or None,
                    shared_gated=bool(shared), router="softmax", norm_topk=cfg.bool("norm_topk_prob", True))


def hc_shape(cfg: Cfg) -> HCShape:
    count = cfg.int("hc_count", minimum=2, what="the stream count")
    width = count * cfg.int("hidden_size")
    return HCShape(count=count, low_rank=cfg.int("hc_lowrank", maximum=width, why=f"hc_count * hidden_size = {width}"))


def qsa_shape(cfg: Cfg) -> QSAShape:
    q = QSAShape(cfg.int("indexer_n_heads"), cfg.int("indexer_kv_heads", minimum=1, maximum=1),
                 cfg.int("indexer_head_dim"), cfg.int("indexer_budget"), cfg.int("indexer_compress_ratio"))
    if q.budget % q.compress_ratio:
        raise cfg.bad("indexer_budget", f"{q.budget} is not a multiple of indexer_compress_ratio {q.compress_ratio}")
    return q


def ple_shape(cfg: Cfg, types: list[str]) -> PLEShape | None:
    ids = cfg.int_list("ple_layer_ids", "a list of 1-based layer numbers") if cfg.get("ple_layer_ids", None) \
        is not None else []
    if not ids:
        return None
    for i in ids:
        if not 1 <= i <= len(types) or types[i - 1] != "linear_attention":
            raise cfg.bad("ple_layer_ids", f"{ids!r}: layer {i} is not a linear_attention layer in 1..{len(types)}")
    n = cfg.int("ngram_size", minimum=2, maximum=8)
    heads = cfg.int("heads_per_ngram")
    if (n - 1) * heads > 64:
        raise cfg.bad("heads_per_ngram", f"{heads} x {n - 1} n-gram sizes = {(n - 1) * heads} heads; expected <= 64")
    dim = cfg.int("ple_embed_dim")
    if dim % ((n - 1) * heads):
        raise cfg.bad("ple_embed_dim", f"{dim} is not a multiple of the {(n - 1) * heads} hashed heads")
    eos = cfg.get("eos_token_id", None)
    if isinstance(eos, list) and eos:
        eos = eos[0]
    if not isinstance(eos, int) or isinstance(eos, bool) or eos < 0:
        raise cfg.bad("eos_token_id", f"{eos!r}; PLE needs it (an n-gram segment ends at it): a non-negative id")
    return PLEShape(tuple(i - 1 for i in ids), dim, cfg.int("ple_conv_kernel_size"), n, heads,
                    cfg.int("ngram_vocab_size_base"), cfg.int("make_ngram_vocab_size_divisible_by"),
                    cfg.int("seed", minimum=0), cfg.int("split_ngram_parts"), eos_token_id=eos)


def read_shapes(cfg: Cfg) -> tuple[LayerShape, HybridShape, MoEShape, HCShape, QSAShape, PLEShape | None, int]:
    """Every number of a qwen4_exp text config (the keys above), range-checked; the last item: the layer count."""
    n = cfg.int("num_hidden_layers")
    raw = cfg.get("layer_types", what=f"{n} layer types")
    if not isinstance(raw, list) or len(raw) != n or any(t not in KINDS for t in raw):
        raise cfg.bad("layer_types", f"{raw!r}; expected {n} entries, each one of {sorted(KINDS)}")
    types = [KINDS[t] for t in raw]
    rope = cfg.sub("rope_parameters")
    if rope.get("partial_rotary_factor", None) is not None:
        prf = rope.float("partial_rotary_factor")
    else:
        prf = cfg.float("partial_rotary_factor", what="a number in (0, 1] (qwen4_exp has no default)")
    if prf > 1:
        raise cfg.bad("partial_rotary_factor", f"{prf}; expected a number in (0, 1]")
    if output_gate(cfg) not in GATE_TYPES:
        raise cfg.bad("output_gate_type", f"{output_gate(cfg)!r} (unset: hidden_act, as HF); expected one of "
                                          f"{list(GATE_TYPES)}")
    moe = moe_shape(cfg)
    view = Cfg({**cfg.data, "intermediate_size": moe.expert_ff, "layer_types": types, "partial_rotary_factor": prf,
                "rope_parameters": {**rope.data, "partial_rotary_factor": prf}}, cfg.where, cfg.prefix)
    layer, hy = _shapes_from_cfg(view, n)
    return layer, hy, moe, hc_shape(cfg), qsa_shape(cfg), ple_shape(cfg, types), n


def tensor_shapes(layer: LayerShape, moe: MoEShape, n: int, vocab: int, tied: bool) -> Shapes:
    H = layer.hidden_size
    s: dict = {"model.embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]")}
    if not tied:
        s["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    for i in range(n):
        s.update(moe_layer_shapes(f"model.layers.{i}.mlp.", H, moe))
    return s


def qwen4exp_from_hf(directory: Path) -> Qwen4ExpSpec:
    """A qwen4exp target from ``config.json`` + safetensors headers in ``directory`` (no weight is read)."""
    top, cfg = model_config(directory, family(FAMILY).hf_model_types)
    layer, hy, moe, hc, qsa, ple, n = read_shapes(cfg)
    tensors: LazyTensors = open_safetensors_dir(directory)
    stored = layer_bound(tensors, "model.layers.", "model.language_model.layers.")
    cfg.int("num_hidden_layers", what="the layer count", **stored)
    if "model.language_model.embed_tokens.weight" in tensors:
        tensors = MappedTensors(tensors, {k.replace("model.language_model.", "model.", 1): (k, None, None)
                                          for k in tensors if not k.startswith("model.visual.")})
    if any(".experts.0." in k for k in tensors):
        tensors = StackedExperts(tensors, moe.num_experts)
    vocab = cfg.int("vocab_size")
    tied = cfg.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False))
    check_shapes(tensors, tensor_shapes(layer, moe, n, vocab, tied), directory)
    return Qwen4ExpSpec(family=FAMILY, source=directory, source_format="hf", layer=layer, num_layers=n,
                        vocab_size=vocab, tie_word_embeddings=tied,
                        max_position=cfg.int("max_position_embeddings", 32768), tensors=tensors, hybrid=hy, moe=moe,
                        hc=hc, qsa=qsa, ple=ple,
                        output_gate=output_gate(cfg))
