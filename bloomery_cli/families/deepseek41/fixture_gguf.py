"""deepseek41 GGUF files in the seed engine's V4.1 layout (docs/V41.md sections 2-3): the writer and the tiny shape.

``write_deepseek41_gguf(path, tensors, dims)`` writes a deepseek41 target given under deepseek4's HF names
(``reader_gguf`` maps them back) with the keys the seed reads (``deepseek41.*``: every key of docs/V41.md 2 this
build runs, window-only ``attention.compress_ratios`` all 0, ``hash_layer_count`` 0) and its tensor names
(``names.rs``: ``blk.N.{attn_*, hc_{attn,ffn}_{fn,base,scale}, ffn_*}``, the routed experts as three stacks
``ffn_{gate,up}_exps`` [E, ff, H] / ``ffn_down_exps`` [E, H, ff], no ``output_hc_*``). Types: norms, sinks, the hc
mixes and the router bias F32 (as the seed's DSpark table keeps them); every matrix BF16. Deterministic bytes.

``Dims.ratios`` / ``Dims.parts`` lay out the compressed layers (``attn_compressor_{kv,gate,norm}``,
``indexer.{attn_k,k_norm}``, ``indexer.{attn_q_b,proj}``; ``STREAMS`` has every kind). ``Dims.engram_layers`` adds
engram sites (``engram.*`` keys with ``engram_hash``'s constants, ``blk.N.engram_{embd [rows, key_len], wkv,
k [S, H], q [S, H]}``; k / q F32). ``Dims.candidates`` (source layer, block size, top blocks) writes
``attention.candidate_{source_layer_id, block_size, topk_blocks}`` (the candidate mask, docs/V41.md 8). What the
seed would refuse in a window-only file (``TINY``): ``attention.compress_ratios`` 0 on every layer, and no
``engram.layer_ids``.

``tiny_tensors(dims, seed)``: random trained-looking weights (norms away from 1, hc base / scale, sinks and the
router bias away from their zero init) for the tests and the fixture's initial point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from bloomery_gates.engram_hash import EngramHash

from ...fixturegen.export_gguf import put_tensor, write_tokenizer
from .reader_gguf import ARCH, BLOCK, CANDIDATE, ENGRAM, FUSED, GLOBAL, SQRT_SOFTPLUS, STREAM

F32_SUFFIXES = ("norm.weight", "sinks", "_hc.fn", "_hc.base", "_hc.scale", "e_score_correction_bias")


@dataclass(frozen=True)
class Dims:
    """A deepseek41 shape: hidden, vocab, layers, heads x head_dim (rope tail), q latent, output groups x rank,
    window, routed experts x width, top-k, streams."""

    h: int = 64
    v: int = 128
    layers: int = 3
    heads: int = 4
    head_dim: int = 32
    rope: int = 8
    q_lora: int = 24
    groups: int = 2
    o_lora: int = 16
    window: int = 4
    experts: int = 8
    ff: int = 32
    top_k: int = 2
    streams: int = 4
    rms_eps: float = 1e-6
    hc_eps: float = 1e-6
    sinkhorn: int = 20
    routed_scale: float = 1.5
    swiglu_limit: float = 10.0
    context: int = 4096
    ratios: tuple[int, ...] = ()       # attention.compress_ratios per layer (empty: all 0, window-only)
    parts: tuple[str, ...] = ()        # per layer: "c" a compressor (gated above ratio 1), "k" index keys, "q" the
                                       # indexer query (docs/V41.md 6)
    index_heads: int = 2
    index_dim: int = 16
    index_topk: int = 4
    engram_layers: tuple[int, ...] = ()   # engram sites (docs/V41.md 7)
    engram_heads: int = 2
    engram_ngram: int = 3
    engram_key: int = 16
    candidates: tuple[int, ...] = ()      # (source layer, block size, top blocks): the candidate mask (docs/V41.md 8)

    def ratio(self, layer: int) -> int:
        return self.ratios[layer] if self.ratios else 0

    def part(self, layer: int) -> str:
        return self.parts[layer] if self.parts else ""


def engram_hash(d: Dims) -> EngramHash | None:
    """Deterministic hash constants of ``d``'s sites (the seed keeps them in the file; these are made here): primes
    from 31 up per site, the offsets their exclusive prefix sums, odd 64-bit multipliers from a fixed generator,
    the token map id // 2 (pairs of tokens share a compressed id), the pad one past the map's largest."""
    if not d.engram_layers:
        return None
    n_cols, sites = (d.engram_ngram - 1) * d.engram_heads, len(d.engram_layers)
    primes = [p for p in range(31, 10_000) if all(p % q for q in range(2, int(p ** 0.5) + 1))]
    prime = tuple(primes[(s * 3) % 5 + c] for s in range(sites) for c in range(n_cols))
    offset = tuple(sum(prime[s * n_cols:s * n_cols + c]) for s in range(sites) for c in range(n_cols))
    g = np.random.default_rng(41)
    mult = tuple(int(x) | 1 for x in g.integers(1 << 40, 1 << 62, sites * d.engram_ngram))
    token_map = tuple(i // 2 for i in range(d.v))
    return EngramHash(tuple(d.engram_layers), d.engram_heads, d.engram_ngram, d.engram_key, d.v // 2 + 1, token_map,
                      mult, prime, offset)


TINY = Dims()
# every stream kind: a window-only layer, a gated ratio-2 source with its keys and query, a reader of all three, a
# reader with its own query, an ungated ratio-1 source (the seed's served table in small, docs/V41.md 6)
STREAMS = Dims(layers=5, ratios=(0, 2, 2, 2, 1), parts=("", "ckq", "", "q", "ckq"), engram_layers=(1, 3))


def shapes(d: Dims) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor under deepseek4's HF names: name -> (shape, init kind)."""
    s, hc = d.streams, (2 + d.streams) * d.streams
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((d.v, d.h), "emb"), "model.norm.weight": ((d.h,), "norm"),
        "lm_head.weight": ((d.v, d.h), "lin")}
    for layer in range(d.layers):
        p, a, m = f"model.layers.{layer}.", "self_attn.", "mlp."
        t = {"input_layernorm.weight": ((d.h,), "norm"), "post_attention_layernorm.weight": ((d.h,), "norm"),
             a + "q_a_proj.weight": ((d.q_lora, d.h), "lin"), a + "q_a_norm.weight": ((d.q_lora,), "norm"),
             a + "q_b_proj.weight": ((d.heads * d.head_dim, d.q_lora), "lin"),
             a + "kv_proj.weight": ((d.head_dim, d.h), "lin"), a + "kv_norm.weight": ((d.head_dim,), "norm"),
             a + "o_a_proj.weight": ((d.groups * d.o_lora, d.heads * d.head_dim // d.groups), "lin"),
             a + "o_b_proj.weight": ((d.h, d.groups * d.o_lora), "lin"), a + "sinks": ((d.heads,), "sink"),
             m + "gate.weight": ((d.experts, d.h), "router"),
             m + "gate.e_score_correction_bias": ((d.experts,), "bias"),
             m + "experts.gate_up_proj": ((d.experts, 2 * d.ff, d.h), "lin"),
             m + "experts.down_proj": ((d.experts, d.h, d.ff), "lin"),
             m + "shared_experts.gate_proj.weight": ((d.ff, d.h), "lin"),
             m + "shared_experts.up_proj.weight": ((d.ff, d.h), "lin"),
             m + "shared_experts.down_proj.weight": ((d.h, d.ff), "lin")}
        for h in ("attn_hc.", "ffn_hc."):
            t |= {h + "fn": ((hc, s * d.h), "lin"), h + "base": ((hc,), "base"), h + "scale": ((3,), "scale")}
        e = engram_hash(d)
        if e is not None and e.site(layer) is not None:
            n = e.n_cols * d.engram_key
            t |= {"engram.embed.weight": ((e.table_rows(e.site(layer)), d.engram_key), "emb"),
                  "engram.wkv.weight": (((s + 1) * d.h, n), "lin"), "engram.k_norm.weight": ((s, d.h), "norm"),
                  "engram.q_norm.weight": ((s, d.h), "norm")}
        c, i = a + "compressor.", a + "indexer."
        if "c" in d.part(layer):
            t |= {c + "kv_proj.weight": ((d.head_dim, d.h), "lin"), c + "kv_norm.weight": ((d.head_dim,), "norm")}
            if d.ratio(layer) != 1:
                t[c + "gate_proj.weight"] = ((d.head_dim, d.h), "lin")
        if "k" in d.part(layer):
            t |= {i + "k_proj.weight": ((d.index_dim, d.head_dim), "lin"),
                  i + "k_norm.weight": ((d.index_dim,), "norm")}
        if "q" in d.part(layer):
            t |= {i + "q_b_proj.weight": ((d.index_heads * d.index_dim, d.q_lora), "lin"),
                  i + "weights_proj.weight": ((d.index_heads, d.h), "lin")}
        out |= {p + k: v for k, v in t.items()}
    return out


def tiny_tensors(d: Dims = TINY, seed: int = 0, gain: float = 1.0) -> dict[str, torch.Tensor]:
    """Random float32 weights for ``shapes(d)`` (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    affine = {"norm": (1.0, 0.2), "emb": (0.0, 1.0), "base": (0.0, 0.3), "scale": (1.0, 0.3), "bias": (0.0, 0.5),
              "sink": (0.0, 1.0), "router": (0.0, 4.0 / d.h ** 0.5)}
    out = {}
    for name, (shape, kind) in shapes(d).items():
        a, b = affine.get(kind, (0.0, gain / shape[-1] ** 0.5))
        out[name] = a + b * torch.randn(shape, generator=g)
    return out


def _keys(w: gguf.GGUFWriter, d: Dims) -> None:
    a = ARCH + "."
    u32 = {"block_count": d.layers, "embedding_length": d.h, "context_length": d.context,
           "attention.head_count": d.heads, "attention.head_count_kv": 1, "attention.key_length": d.head_dim,
           "attention.value_length": d.head_dim, "attention.q_lora_rank": d.q_lora,
           "attention.output_group_count": d.groups, "attention.output_lora_rank": d.o_lora,
           "attention.sliding_window": d.window, "rope.dimension_count": d.rope,
           "rope.scaling.original_context_length": 4096, "attention.indexer.head_count": d.index_heads,
           "attention.indexer.key_length": d.index_dim, "attention.indexer.top_k": d.index_topk,
           "expert_gating_func": SQRT_SOFTPLUS, "expert_count": d.experts, "expert_used_count": d.top_k,
           "expert_shared_count": 1, "expert_feed_forward_length": d.ff, "hash_layer_count": 0,
           "hyper_connection.count": d.streams, "hyper_connection.sinkhorn_iterations": d.sinkhorn}
    f32 = {"attention.layer_norm_rms_epsilon": d.rms_eps, "rope.freq_base": 10000.0,
           "attention.compress_rope_freq_base": 160000.0, "rope.scaling.factor": 16.0,
           "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
           "expert_weights_scale": d.routed_scale, "hyper_connection.epsilon": d.hc_eps,
           "swiglu_clamp_exp": d.swiglu_limit, "swiglu_clamp_shexp": d.swiglu_limit}
    for k, v in u32.items():
        w.add_uint32(a + k, v)
    for k, v in f32.items():
        w.add_float32(a + k, v)
    w.add_string(a + "rope.scaling.type", "yarn")
    w.add_bool(a + "expert_weights_norm", True)
    w.add_array(a + "attention.compress_ratios", list(d.ratios) or [0] * d.layers)
    e = engram_hash(d)
    if e is not None:
        w.add_array(a + "engram.layer_ids", list(e.layer_ids))
        for k, v in (("head_count", e.n_heads), ("max_ngram_size", e.n_gram), ("key_length", e.key_length),
                     ("pad_id", e.pad)):
            w.add_uint32(a + "engram." + k, v)
        for k, v in (("multipliers", e.mult), ("primes", e.prime), ("offsets", e.offset),
                     ("token_map", e.token_map)):
            w.add_key_value(a + "engram." + k, list(v), gguf.GGUFValueType.ARRAY,
                            sub_type=gguf.GGUFValueType.UINT64 if k == "multipliers" else gguf.GGUFValueType.UINT32)
    for k, v in zip(CANDIDATE, d.candidates, strict=False):
        w.add_uint32(a + k, v)
    w.add_uint32(a + "vocab_size", d.v)


def write_deepseek41_gguf(path: Path, tensors: Mapping[str, torch.Tensor], d: Dims = TINY,
                          edit_keys: Callable[[gguf.GGUFWriter], None] | None = None,
                          extra: Mapping[str, torch.Tensor] | None = None, drop: tuple[str, ...] = (),
                          tok: Tokenizer | None = None) -> Path:
    """The file (module docstring). ``tok``: the tokenizer written in (``tokenizer.ggml.*``, the seed's vocabulary
    source). ``edit_keys(writer)`` adds keys after the standard ones (a second value replaces the first),
    ``extra`` adds GGUF tensors by their GGUF names, ``drop`` leaves GGUF names out: the tests' plants."""
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, d)
    if tok is not None:
        write_tokenizer(w, tok, pad=False)
    if edit_keys is not None:
        edit_keys(w)
    for g, hf in GLOBAL.items():
        if g not in drop:
            put_tensor(w, g, tensors[hf], hf.endswith(F32_SUFFIXES))
    for layer in range(d.layers):
        b, p = f"blk.{layer}.", f"model.layers.{layer}."
        gate_up = tensors[p + "mlp.experts.gate_up_proj"]
        fused = dict(zip(FUSED, (gate_up[:, :d.ff], gate_up[:, d.ff:]), strict=True))
        own = [(g, tensors[p + hf]) for g, hf in {**STREAM, **ENGRAM}.items() if p + hf in tensors]
        for g, t in [*((g, tensors[p + hf]) for g, hf in BLOCK.items()), *fused.items(), *own]:
            if b + g not in drop:
                put_tensor(w, b + g, t, g.startswith(("hc_", "engram_k", "engram_q")) or
                           g.endswith(("norm.weight", "sinks.weight", ".bias")))
    for g, t in (extra or {}).items():
        put_tensor(w, g, t, True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
