"""qwen4exp targets from a llama.cpp GGUF (arch ``qwen4exp``; docs/FAMILIES_MOE.md 4.5): ``Qwen4ExpSpec`` whose
tensors are renamed to the HF checkpoint's names, the converter's transforms undone (``gguf_names``), so the engine,
the reference and transformers run it. The GDN output gate is sigmoid (``OUTPUT_GATE``: llama.cpp's graph; the
format has no key for it). Every key below is read under ``qwen4exp.`` and range-checked, or refused by name
(exit 2):

    block_count = trunk + nextn_predict_layers; embedding_length H; context_length
    attention.{head_count, head_count_kv, key_length, value_length (= key_length), layer_norm_rms_epsilon}
    rope.{freq_base, dimension_count (even, <= key_length), dimension_sections (when present: plain partial rope
        under llama.cpp's interleaved sections, ``formats.rope_sections``)}; full_attention_interval
    ssm.{conv_kernel, state_size, group_count, time_step_rank, inner_size}      (GDN: nv = time_step_rank heads)
    expert_{count, used_count <= count, feed_forward_length, shared_feed_forward_length}
    hyper_connection.{count > 1, low_rank}; embedding_length_out = count * H when present (the converter omits it)
    attention.indexer.{head_count, key_length, top_k}; attention.compress_ratios (block_count or trunk entries:
        > 0 on the indexed layers, 0 on the GDN ones; top_k a multiple of the ratio)
    ple.{layers (exactly 1, a GDN layer, 0-based), ngram_size 2..8, heads_per_ngram (total <= 64), conv_kernel,
        head_vocab_sizes ((ngram_size - 1) * heads_per_ngram entries), eos_token_id, layer_multipliers
        (ngram_size), head_offsets (as head_vocab_sizes): the hashing's tables, ``PLEShape``'s}
    embedding_length_per_layer_input = per_layer_token_embd's row width (its rows cover every head's range)

Tensors (shapes in numpy order, the reverse of ggml's ne): token_embd [V, H], output [V, H] or absent (tied),
output_hc_norm [count*H] or [count, H] (hc_*_norm alike), output_hc_{down [r, count H], up}; per trunk block
hc_{attn,ffn}_{norm, down [r, count H], up, inject}, ffn_gate_inp [E, H], ffn_{gate,up}_exps [E, ff, H],
ffn_down_exps [E, H, ff]; indexed blocks attn_{q, k, v, output}, indexer.{q_proj, k_proj}; GDN blocks ssm_a [nv],
ssm_conv1d; per_layer_token_embd when PLE is on. No output_norm, attn_norm or post_attention_norm may appear
(qwen4exp has no block norms).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.gguf_file import GGUFFile
from bloomery_cli.formats.lazy import check_shapes
from bloomery_cli.formats.rope_sections import sections_problem
from bloomery_gates.errors import BadConfig, BadTensor
from bloomery_gates.registry import family
from bloomery_gates.spec import HCShape, HybridShape, LayerShape, MoEShape, PLEShape, QSAShape, Qwen4ExpSpec

from ..qwen35moe.reader import FusedGateUp
from ..qwen38.reader import MappedTensors
from .gguf_names import hf_table, join_qk

FAMILY = "qwen4exp"
ARCH = "qwen4exp"
A = ARCH + "."
FORBIDDEN = ("attn_norm.weight", "post_attention_norm.weight")
OUTPUT_GATE = "sigmoid"     # llama.cpp's qwen4exp graph gates the GDN output norm with sigmoid (qwen4exp.cpp
                            # build_norm_gated); the format has no key for it, so a GGUF means that gate


def gguf_cfg(g: GGUFFile) -> Cfg:
    """The file's metadata as a ``Cfg`` (keys spelt in full in messages)."""
    return Cfg({k: g.meta(k) for k in g.meta_keys()}, g.path)


def check_arch(g: GGUFFile, c: Cfg) -> None:
    arch = c.get("general.architecture", what=f"{family(FAMILY).gguf_archs}")
    if arch not in family(FAMILY).gguf_archs:
        raise c.bad("general.architecture", f"{arch!r}; expected one of {list(family(FAMILY).gguf_archs)}")


def trunk_shapes(c: Cfg, trunk: int) -> tuple[LayerShape, HybridShape, MoEShape, HCShape]:
    """The target's keys: the shared ones (``shared_shapes``) and the GDN layers'."""
    layer, moe, hc = shared_shapes(c)
    d, rot = layer.head_dim, c.int(A + "rope.dimension_count")
    every = c.int(A + "full_attention_interval")
    types = tuple("linear_attention" if (i + 1) % every else "full_attention" for i in range(trunk))
    st, grp, nv = c.int(A + "ssm.state_size"), c.int(A + "ssm.group_count"), c.int(A + "ssm.time_step_rank")
    inner = c.int(A + "ssm.inner_size")
    if inner % nv or nv % grp:
        raise c.bad(A + "ssm.inner_size", f"{inner} with time_step_rank {nv}, group_count {grp}: expected "
                                          "inner a multiple of time_step_rank, time_step_rank of group_count")
    hy = HybridShape(types, rot / d, rot, grp, nv, st, inner // nv, c.int(A + "ssm.conv_kernel"))
    return layer, hy, moe, hc


def shared_shapes(c: Cfg) -> tuple[LayerShape, MoEShape, HCShape]:
    """The keys a qwen4exp target and its MTP file share (attention, experts, HC)."""
    H = c.int(A + "embedding_length")
    heads, kv = c.int(A + "attention.head_count"), c.int(A + "attention.head_count_kv")
    if heads % kv:
        raise c.bad(A + "attention.head_count_kv", f"{kv} does not divide attention.head_count {heads}")
    d = c.int(A + "attention.key_length")
    c.int(A + "attention.value_length", d, minimum=d, maximum=d, what=f"key_length {d}")
    e, k = c.int(A + "expert_count"), c.int(A + "expert_used_count")
    if k > e:
        raise c.bad(A + "expert_used_count", f"{k} is more than expert_count {e}; expected <= {e}")
    ff, sff = c.int(A + "expert_feed_forward_length"), c.int(A + "expert_shared_feed_forward_length", 0, minimum=0)
    moe = MoEShape(e, k, ff, sff or None, bool(sff), "softmax")
    rot = c.int(A + "rope.dimension_count", maximum=d, why="attention.key_length")
    if rot % 2:
        raise c.bad(A + "rope.dimension_count", f"{rot}; expected an even number")
    layer = LayerShape(H, heads, kv, d, ff, c.float(A + "attention.layer_norm_rms_epsilon"),
                       c.float(A + "rope.freq_base"))
    count = c.int(A + "hyper_connection.count", minimum=2, what="the stream count")
    hc = HCShape(count, c.int(A + "hyper_connection.low_rank", maximum=count * H, why=f"count * H = {count * H}"))
    return layer, moe, hc


def compress_ratios(c: Cfg, blocks: int, trunk: int) -> list[int]:
    r = c.int_list(A + "attention.compress_ratios", "a list of non-negative integers")
    if len(r) not in (blocks, trunk) or any(x < 0 for x in r):
        raise c.bad(A + "attention.compress_ratios", f"{len(r)} entries {r!r}; expected {blocks} (or {trunk}) "
                                                     "non-negative integers")
    return r


def _ple(c: Cfg, hy: HybridShape) -> PLEShape | None:
    if c.get(A + "ple.layers", None) is None:
        return None
    layers = c.int_list(A + "ple.layers", "a list with one layer index")
    if len(layers) != 1 or not 0 <= layers[0] < len(hy.layer_types) or not hy.is_linear(layers[0]):
        raise c.bad(A + "ple.layers",
                    f"{layers!r}; expected exactly 1 entry, a GDN layer in 0..{len(hy.layer_types) - 1}")
    n = c.int(A + "ple.ngram_size", minimum=2, maximum=8)
    heads = c.int(A + "ple.heads_per_ngram", maximum=64 // (n - 1), why=f"64 heads over {n - 1} n-gram sizes")
    sizes = c.int_list(A + "ple.head_vocab_sizes", "a list of positive integers")
    if len(sizes) != (n - 1) * heads or any(s < 1 for s in sizes):
        raise c.bad(A + "ple.head_vocab_sizes", f"{len(sizes)} entries; expected {(n - 1) * heads} positive sizes")
    dim = c.int(A + "embedding_length_per_layer_input")
    eos = c.int(A + "ple.eos_token_id", minimum=0) if c.get(A + "ple.eos_token_id", None) is not None else -1
    hashing = {"multipliers": tuple(_u64s(c, "ple.layer_multipliers", n)),
               "head_offsets": tuple(_u64s(c, "ple.head_offsets", len(sizes)))}
    return PLEShape(tuple(layers), dim * len(sizes), c.int(A + "ple.conv_kernel"), n, heads,
                    head_vocab_sizes=tuple(sizes), eos_token_id=eos,
                    **hashing)


def _check_ple_table(c: Cfg, t: Any, ple: PLEShape) -> None:
    """per_layer_token_embd [rows, w]: w = embedding_length_per_layer_input (llama.cpp's per-head row width, the
    converter writes the table's last dim) and rows covering every head's range (llama.cpp's loader)."""
    name = "per_layer_token_embd.weight"
    if name not in t:
        raise BadTensor(f"{c.where}: tensor {name}", "missing; the file has ple.layers")
    rows, width = (tuple(t.shape_of(name)) + (0, 0))[:2]
    w = ple.embed_dim // len(ple.head_vocab_sizes)
    if width != w:
        raise c.bad(A + "embedding_length_per_layer_input", f"{w}; expected {name}'s row width {width}")
    if ple.head_offsets and rows < max(o + s for o, s in zip(ple.head_offsets, ple.head_vocab_sizes, strict=True)):
        raise BadTensor(f"{c.where}: tensor {name}", f"{rows} rows; too few for the ple.head_offsets + sizes ranges")


def _u64s(c: Cfg, key: str, n: int) -> list[int]:
    """An optional array of exactly ``n`` non-negative integers (llama.cpp's PLE hashing tables), [] when absent."""
    if c.get(A + key, None) is None:
        return []
    v = c.int_list(A + key, f"a list of {n} non-negative integers")
    if len(v) != n or any(x < 0 for x in v):
        raise c.bad(A + key, f"{len(v)} entries; expected {n} non-negative integers")
    return v


def trunk_tensor_shapes(layer: LayerShape, hy: HybridShape, moe: MoEShape, hc: HCShape, blocks: range) -> dict:
    """The blocks' tensors with a documented shape (the rest are checked present by ``PRESENT``)."""
    H, hcH, r = layer.hidden_size, hc.count * layer.hidden_size, hc.low_rank
    E, ff = moe.num_experts, moe.expert_ff
    s: dict[str, Any] = {}
    for i in blocks:
        p = f"blk.{i}."
        s.update({p + "hc_attn_down.weight": ((r, hcH), "[low_rank, count*H]"),
                  p + "hc_ffn_down.weight": ((r, hcH), "[low_rank, count*H]"),
                  p + "ffn_gate_inp.weight": ((E, H), "[expert_count, H]"),
                  p + "ffn_gate_exps.weight": ((E, ff, H), "[expert_count, expert_ff, H]"),
                  p + "ffn_up_exps.weight": ((E, ff, H), "[expert_count, expert_ff, H]"),
                  p + "ffn_down_exps.weight": ((E, H, ff), "[expert_count, H, expert_ff]")})
        for part in ("attn", "ffn"):
            for w in ("norm", "up", "inject"):
                s[f"{p}hc_{part}_{w}.weight"] = None
        if i < len(hy.layer_types) and hy.is_linear(i):
            s.update({p + "ssm_a": ((hy.linear_num_value_heads,), "[ssm.time_step_rank]"),
                      p + "ssm_conv1d.weight": None})
        else:
            s.update({p + x: None for x in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")})
    return s


def check_tensors(g: GGUFFile, table: dict, forbid: list[str]) -> Any:
    """``table``: name -> (shape, why) checked exactly, or None checked present; ``forbid``: names refused."""
    tensors = g.tensors(rename=lambda n: n)
    for name in forbid:
        if name in tensors:
            raise BadTensor(f"{g.path}: tensor {name}", "present; qwen4exp has no such tensor (no block norms)")
    for name, want in table.items():
        if want is None and name not in tensors:
            raise BadTensor(f"{g.path}: tensor {name}", "missing")
    check_shapes(tensors, {k: v for k, v in table.items() if v is not None}, g.path)
    return tensors


def qwen4exp_from_gguf(path: Path) -> Qwen4ExpSpec:
    """A qwen4exp target from a llama.cpp GGUF's keys and tensor infos (no tensor data is read)."""
    g = GGUFFile(path)
    c = gguf_cfg(g)
    check_arch(g, c)
    blocks = c.int(A + "block_count")
    nextn = c.int(A + "nextn_predict_layers", 0, minimum=0, maximum=blocks - 1, why="block_count - 1")
    trunk = blocks - nextn
    layer, hy, moe, hc = trunk_shapes(c, trunk)
    H = layer.hidden_size
    if c.get(A + "embedding_length_out", None) is not None:     # optional: the converter does not write it
        c.int(A + "embedding_length_out", minimum=hc.count * H, maximum=hc.count * H, what=f"count*H = {hc.count * H}")
    ratios = compress_ratios(c, blocks, trunk)
    for i in range(trunk):
        if (ratios[i] > 0) == hy.is_linear(i):
            raise c.bad(A + "attention.compress_ratios", f"entry {i} is {ratios[i]}; expected "
                        + ("0 on a GDN layer" if hy.is_linear(i) else "> 0 on an indexed layer"))
    ratio = next((x for x in ratios[:trunk] if x), 1)
    top = c.int(A + "attention.indexer.top_k")
    if top % ratio:
        raise c.bad(A + "attention.indexer.top_k", f"{top} is not a multiple of the compress ratio {ratio}")
    qsa = QSAShape(c.int(A + "attention.indexer.head_count"), 1, c.int(A + "attention.indexer.key_length"), top, ratio)
    ple = _ple(c, hy)
    vocab_t = g.tensors(rename=lambda n: n)
    if "token_embd.weight" not in vocab_t:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [vocab, H]")
    V = vocab_t.shape_of("token_embd.weight")[0]
    tied = "output.weight" not in vocab_t
    table: dict[str, Any] = {"token_embd.weight": ((V, H), "[vocab, H]"),
                             "output_hc_norm.weight": None,
                             "output_hc_down.weight": ((hc.low_rank, hc.count * H), "[low_rank, count*H]"),
                             "output_hc_up.weight": None}
    if not tied:
        table["output.weight"] = ((V, H), "[vocab, H]")
    if ple is not None:
        table["per_layer_token_embd.weight"] = None
        _check_ple_table(c, vocab_t, ple)
    table.update(trunk_tensor_shapes(layer, hy, moe, hc, range(trunk)))
    forbid = ["output_norm.weight"] + [f"blk.{i}.{n}" for i in range(blocks) for n in FORBIDDEN]
    tensors = check_tensors(g, table, forbid)
    norms = ["output_hc_norm.weight"] + [f"blk.{i}.hc_{p}_norm.weight" for i in range(trunk) for p in ("attn", "ffn")]
    for name in norms:
        if name in tensors and math.prod(tensors.shape_of(name)) != hc.count * H:
            raise BadTensor(f"{path}: tensor {name}", f"shape {list(tensors.shape_of(name))}; expected [count*H] "
                                                      f"or [count, H] ({hc.count * H} gains)")
    if c.get(A + "context_length", None) is None:
        raise BadConfig(f"{path}: key {A}context_length", "missing; expected an integer")
    sections = c.get(A + "rope.dimension_sections", None)
    problem = sections_problem(sections, hy.rotary_dim, layer.head_dim) if sections is not None else None
    if problem:
        raise c.bad(A + "rope.dimension_sections", problem)
    spec = Qwen4ExpSpec(family=FAMILY, source=Path(path), source_format="gguf", layer=layer, num_layers=trunk,
                        vocab_size=V, tie_word_embeddings=tied, max_position=c.int(A + "context_length"),
                        tensors=tensors, hybrid=hy, moe=moe, hc=hc, qsa=qsa, ple=ple, output_gate=OUTPUT_GATE)
    raw = join_qk(FusedGateUp(tensors))
    return replace(spec, tensors=MappedTensors(raw, hf_table(list(raw), trunk, spec)))
