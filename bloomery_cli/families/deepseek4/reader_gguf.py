"""deepseek4 targets from llama.cpp's GGUF (arch ``deepseek4``, docs/FAMILIES_MOE.md 4.4): ``Deepseek4Spec`` under the
HF checkpoint's names (``reader.py``), so the engine, the reference and the gate are the HF path's.

Keys (``deepseek4.`` prefix; what ``src/models/deepseek4.cpp`` ``load_arch_hparams`` reads, llama.cpp 0c1e57098),
each read and range-checked or refused by name (exit 2):

    size       block_count B, nextn_predict_layers n (0 when absent; L = B - n trunk layers; an MTP-only file,
               one with no blk.0.attn_norm, is refused as a target), embedding_length H, context_length,
               attention.head_count, attention.head_count_kv = 1, attention.key_length = value_length (head dim),
               attention.layer_norm_rms_epsilon, embedding_length_out = H * hc when present
    attention  rope.dimension_count (even, <= head dim and indexer key_length), rope.freq_base (sliding layers),
               attention.{q_lora_rank, sliding_window, output_group_count (divides head_count),
               output_lora_rank, compress_rope_freq_base}, attention.compress_ratios (>= B entries, each 0 / 4 /
               128: the only ratios llama.cpp's loader takes; 0 sliding, 4 CSA with the overlapping two-series
               compressor and the indexer, 128 HCA), rope.scaling.{type yarn, factor,
               original_context_length, yarn_beta_fast (32), yarn_beta_slow (1)} for the compress rope (llama.cpp
               leaves cos / sin unscaled there, dsv4_rope_attn_factor: attention factor 1; a yarn_attn_factor or
               yarn_ext_factor key is refused, the graph would ignore it)
    indexer    attention.indexer.{head_count, key_length, top_k}
    experts    expert_count, expert_used_count, expert_feed_forward_length (one width), expert_shared_count = 1,
               expert_weights_scale, expert_weights_norm = true, expert_gating_func = 4 (sqrt-softplus),
               swiglu_clamp_exp (one value, scalar or per block) = swiglu_clamp_shexp when present,
               hash_layer_count (the first layers are hash-routed, llama.cpp's rule)
    mHC        hyper_connection.{count >= 2, sinkhorn_iterations, epsilon}

Tensors (``gguf_names``; ggml dims reversed): renamed to the HF names, ``ffn_{gate,up}_exps`` joined into
``mlp.experts.gate_up_proj`` [E, 2 ff, H]; ``ffn_gate_tid2eid`` I32 [V, k] -> ``mlp.gate.tid2eid`` (int32).
Routed experts stored MXFP4 are handed over PACKED in the HF FP4 layout (``experts_mxfp4``): codes [E, R, K/2]
uint8 (element 2j low nibble) and e8m0 scales [E, R, K/32] uint8 under ``..._scale_inv``, the inverse of the
converter's lossless repack (block_mxfp4 = scale byte + 16 bytes, byte j = element j | element j+16 << 4); any
other expert type is dequantized to float32. A file mixing MXFP4 and float experts is refused. Everything else
dequantizes to float32 (F32, BF16, Q8_0, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bloomery_gates.errors import BadTensor, Refused
from bloomery_gates.spec import Deepseek4Spec, HCShape, LayerShape, MoEShape, RopeScaling, V4AttnShape

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile, is_gguf
from ...formats.lazy import LazyTensors, check_shapes
from .gguf_names import ARCH, BLOCK, EXPS, GLOBAL, RATIOS, SQRT_SOFTPLUS
from .reader import E8M0_NAN, FAMILY, SCALE, check_tables, packed_shapes, tensor_shapes

A = f"{ARCH}."
MXFP4 = "MXFP4"


def is_deepseek4_gguf(path: Path) -> bool:
    return Path(path).is_file() and is_gguf(path) and GGUFFile(path).meta("general.architecture", None) == ARCH


def unpack_mxfp4(blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml block_mxfp4 bytes [..., R, nb * 17] -> (codes [..., R, nb * 16] uint8, element 2j in the low nibble;
    e8m0 scales [..., R, nb] uint8): the inverse of ``fixture_gguf.mxfp4_blocks``."""
    b = torch.from_numpy(np.array(blocks, dtype=np.uint8, copy=True))
    lead, nb = b.shape[:-1], b.shape[-1] // 17
    b = b.reshape(*lead, nb, 17)
    qs = b[..., 1:]
    vals = torch.cat((qs & 0x0F, qs >> 4), dim=-1)                    # elements 0..31 of each block
    codes = (vals[..., 0::2] | (vals[..., 1::2] << 4)).reshape(*lead, nb * 16)
    return codes.contiguous(), b[..., 0].contiguous()


Entry = tuple[tuple[str, ...], str, Callable[[list[torch.Tensor]], torch.Tensor] | None, tuple[int, ...], str]


class GgufTable(LazyTensors):
    """HF name -> (GGUF sources, how: "float" | "i32" | "codes" | "scales", fn over the loaded sources, shape,
    dtype as reported), read lazily from one GGUF file."""

    def __init__(self, f: GGUFFile, table: dict[str, Entry]):
        super().__init__()
        self.f, self.table, self.floats = f, table, f.tensors(lambda s: s)

    def _names(self) -> list[str]:
        return list(self.table)

    def __contains__(self, name: object) -> bool:
        return name in self.table

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.table[name][3]

    def dtype_of(self, name: str) -> str:
        return self.table[name][4]

    def element_bytes(self, name: str) -> int:
        return {"U8": 1, "I32": 4}.get(self.dtype_of(name), 4)

    def file_of(self, name: str) -> Path:
        return self.f.path

    def label(self, name: str) -> str:
        return f"{self.f.path}: tensor {'+'.join(self.table[name][0])} (= {name})"

    def check_dtype(self, name: str) -> None:
        srcs, how = self.table[name][:2]
        if how == "float":
            for s in srcs:
                self.floats.check_dtype(s)

    def _raw(self, g: str) -> np.ndarray:
        return np.asarray(self.f._by_name[g].data)

    def _load(self, name: str) -> torch.Tensor:
        srcs, how, fn, shape, _ = self.table[name]
        if how == "i32":
            x = [torch.from_numpy(np.array(self._raw(srcs[0]), dtype=np.int32).reshape(shape))]
        elif how in ("codes", "scales"):
            parts = [unpack_mxfp4(self._raw(s))[0 if how == "codes" else 1] for s in srcs]
            x = [torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]]
            if how == "scales" and bool((x[0] == E8M0_NAN).any()):
                raise BadTensor(self.label(name), "e8m0 scale byte(s) 255 (NaN); expected finite block scales")
        else:
            x = [self.floats[s] for s in srcs]
        out = fn(x) if fn is not None else x[0]
        if tuple(out.shape) != tuple(shape):
            raise BadTensor(self.label(name), f"reads as {list(out.shape)}, expected {list(shape)}")
        return out


def gguf_cfg(f: GGUFFile) -> Cfg:
    arch = f.meta("general.architecture", None)
    if arch != ARCH:
        raise Refused(f.path, f"general.architecture is {arch!r}; this reader supports {ARCH!r}")
    return Cfg({k: f.meta(k) for k in f.meta_keys() if k.startswith(A)}, f.path)


def _one(cfg: Cfg, key: str, what: str, blocks: int, kind: type = float) -> float:
    v = cfg.get(key, what=what)
    vals = v if isinstance(v, list) else [v]
    if not vals or len(vals) < (blocks if isinstance(v, list) else 1) or len({float(x) for x in vals}) != 1:
        raise cfg.bad(key, f"{v!r:.120}; expected one {what} (a scalar, or {blocks} equal per-block values)")
    return cfg.float(key, what=what) if not isinstance(v, list) else Cfg({key: vals[0]}, cfg.where).float(key)


def _scaling(cfg: Cfg) -> RopeScaling | None:
    t = cfg.get(A + "rope.scaling.type", "none")
    if t == "none":
        return None
    if t != "yarn":
        raise cfg.bad(A + "rope.scaling.type", f"{t!r}; expected yarn or none (DeepSeek V4's compress rope)")
    for k in ("rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor"):
        if cfg.get(A + k, None) is not None:
            raise cfg.bad(A + k, f"{cfg.get(A + k)}; llama.cpp's deepseek4 graph ignores it (its own attention "
                                 "factor cancels YaRN's mscale); expected absent")
    return RopeScaling("yarn", cfg.float(A + "rope.scaling.factor"),
                       cfg.int(A + "rope.scaling.original_context_length"),
                       cfg.float(A + "rope.scaling.yarn_beta_fast", 32.0),
                       cfg.float(A + "rope.scaling.yarn_beta_slow", 1.0), attention_factor=1.0)


def read_keys(f: GGUFFile) -> tuple[Cfg, dict[str, Any], int, int]:
    """(cfg, the spec's shape fields, trunk L, block count B) from a deepseek4 GGUF's keys (module docstring)."""
    cfg = gguf_cfg(f)
    blocks = cfg.int(A + "block_count")
    nextn = cfg.int(A + "nextn_predict_layers", 0, minimum=0, maximum=blocks - 1, why="block_count")
    L = blocks - nextn
    H, heads = cfg.int(A + "embedding_length"), cfg.int(A + "attention.head_count")
    cfg.int(A + "attention.head_count_kv", minimum=1, maximum=1, what="1 (V4's one shared K = V head)")
    d = cfg.int(A + "attention.key_length")
    cfg.int(A + "attention.value_length", minimum=d, maximum=d, what=f"the key length {d} (K = V)")
    di = cfg.int(A + "attention.indexer.key_length")
    r = cfg.int(A + "rope.dimension_count", maximum=min(d, di), why="the head and indexer key lengths")
    if r % 2:
        raise cfg.bad(A + "rope.dimension_count", f"{r}; expected an even width")
    groups = cfg.int(A + "attention.output_group_count")
    if heads % groups:
        raise cfg.bad(A + "attention.output_group_count", f"{groups} does not divide head_count {heads}")
    raw = cfg.get(A + "attention.compress_ratios", what=f">= {blocks} per-block ratios")
    if not isinstance(raw, list) or len(raw) < blocks or any(x not in RATIOS for x in raw[:blocks]):
        raise cfg.bad(A + "attention.compress_ratios", f"{raw!r:.160}; expected >= {blocks} entries (block_count), "
                      "each 0, 4 or 128: llama.cpp's deepseek4 loader accepts no other ratio")
    kinds = tuple(RATIOS[x] for x in raw[:L])
    if any(raw[i] != 0 for i in range(L, blocks)):
        raise cfg.bad(A + "attention.compress_ratios", f"{raw[L:blocks]} on the MTP blocks; expected 0 (sliding)")
    attn = V4AttnShape(heads, d, r, cfg.int(A + "attention.q_lora_rank"), groups,
                       cfg.int(A + "attention.output_lora_rank"), cfg.int(A + "attention.sliding_window"),
                       cfg.rope_base(A + "rope.freq_base"), cfg.rope_base(A + "attention.compress_rope_freq_base"),
                       _scaling(cfg), 4, 128, cfg.int(A + "attention.indexer.head_count"), di,
                       cfg.int(A + "attention.indexer.top_k"))
    gate = cfg.int(A + "expert_gating_func")
    if gate != SQRT_SOFTPLUS:
        raise cfg.bad(A + "expert_gating_func", f"{gate}; expected {SQRT_SOFTPLUS} (sqrt-softplus: llama.cpp's "
                                                 "deepseek4 loader refuses any other)")
    if not cfg.bool(A + "expert_weights_norm"):
        raise cfg.bad(A + "expert_weights_norm", "false; V4 always renormalises its chosen weights (expected true)")
    cfg.int(A + "expert_shared_count", minimum=1, maximum=1, what="1 (V4's one ungated shared expert)")
    e = cfg.int(A + "expert_count")
    k = cfg.int(A + "expert_used_count", maximum=e, why=f"expert_count is {e}")
    ff = int(_one(cfg, A + "expert_feed_forward_length", "expert width", blocks))
    moe = MoEShape(e, k, ff, ff, False, "sqrtsoftplus", 1, 1, True, cfg.float(A + "expert_weights_scale"))
    lim = _one(cfg, A + "swiglu_clamp_exp", "SwiGLU clamp", blocks)
    if cfg.get(A + "swiglu_clamp_shexp", None) is not None and \
            _one(cfg, A + "swiglu_clamp_shexp", "SwiGLU clamp", blocks) != lim:
        raise cfg.bad(A + "swiglu_clamp_shexp", f"differs from swiglu_clamp_exp {lim}; expected one clamp (V4's "
                                                "swiglu_limit holds for the routed and the shared experts)")
    n_hash = cfg.int(A + "hash_layer_count", 0, minimum=0, maximum=L, why=f"{L} trunk layers")
    hc = HCShape(cfg.int(A + "hyper_connection.count", minimum=2, what="the stream count"), 0,
                 cfg.int(A + "hyper_connection.sinkhorn_iterations"), cfg.float(A + "hyper_connection.epsilon"))
    out = cfg.get(A + "embedding_length_out", None)
    if out is not None and out != H * hc.count:
        raise cfg.bad(A + "embedding_length_out", f"{out}; expected embedding_length x hyper_connection.count = "
                                                  f"{H * hc.count} (the 4 raw streams the MTP reads)")
    layer = LayerShape(H, heads, 1, d, ff, cfg.float(A + "attention.layer_norm_rms_epsilon"), attn.rope_theta)
    fields = {"layer": layer, "num_layers": L, "layer_types": kinds,
              "mlp_types": tuple("hash" if i < n_hash else "moe" for i in range(L)), "attn": attn, "moe": moe,
              "hc": hc, "swiglu_limit": lim, "mtp_layers": 0, "experts_mxfp4": False}
    return cfg, fields, L, blocks


def block_entries(f: GGUFFile, blk: int, hf: str, fields: dict[str, Any]) -> dict[str, Entry]:
    """The HF-named entries of GGUF block ``blk`` (prefix ``hf``): renames, the joined experts, the hash table."""
    raw, out = f.tensors(lambda s: s), {}
    for src, dst in BLOCK.items():
        g = f"blk.{blk}.{dst}"
        if g in raw:
            how, dt = ("i32", "I32") if src == "mlp.gate.tid2eid" else ("float", raw.dtype_of(g))
            if how == "i32" and raw.dtype_of(g) != "I32":
                raise BadTensor(raw.label(g), f"type {raw.dtype_of(g)}; expected I32 (a token -> expert table)")
            out[hf + src] = ((g,), how, None, raw.shape_of(g), dt)
    gate, up, down = (f"blk.{blk}.{n}" for n in EXPS)
    have = [g in raw for g in (gate, up, down)]
    if any(have) and not all(have):
        missing = [g for g, h in zip((gate, up, down), have, strict=True) if not h]
        raise BadTensor(f"{f.path}: tensor {missing[0]}", "missing; expected ffn_{gate,up,down}_exps together")
    if not all(have):
        return out
    types = {raw.dtype_of(g) for g in (gate, up, down)}
    if MXFP4 in types and types != {MXFP4}:
        raise BadTensor(f"{f.path}: tensors blk.{blk}.ffn_*_exps", f"types {sorted(types)}; expected all MXFP4 or "
                                                                   "none (one expert layout per file)")
    m, H = fields["moe"], fields["layer"].hidden_size
    E, ff = m.num_experts, m.expert_ff
    for g, rows, kk in ((gate, ff, H), (up, ff, H), (down, H, ff)):
        if raw.shape_of(g) != (E, rows, kk):
            raise BadTensor(raw.label(g), f"shape {list(raw.shape_of(g))}, expected {[E, rows, kk]} (expert_count, "
                                          "rows, row length)")
    x = hf + "mlp.experts."
    if types == {MXFP4}:
        fields["experts_mxfp4"] = True
        out[x + "gate_up_proj"] = ((gate, up), "codes", None, (E, 2 * ff, H // 2), "U8")
        out[x + "gate_up_proj" + SCALE] = ((gate, up), "scales", None, (E, 2 * ff, H // 32), "U8")
        out[x + "down_proj"] = ((down,), "codes", None, (E, H, ff // 2), "U8")
        out[x + "down_proj" + SCALE] = ((down,), "scales", None, (E, H, ff // 32), "U8")
    else:
        out[x + "gate_up_proj"] = ((gate, up), "float", lambda t: torch.cat(t, 1), (E, 2 * ff, H), "F32")
        out[x + "down_proj"] = ((down,), "float", None, (E, H, ff), raw.dtype_of(down))
    return out


def deepseek4_from_gguf(path: Path) -> Deepseek4Spec:
    """A deepseek4 target from llama.cpp's main GGUF (no weight is read)."""
    f = GGUFFile(path)
    cfg, fields, L, blocks = read_keys(f)
    names = set(f.tensor_names())
    if "blk.0.attn_norm.weight" not in names and blocks > L:
        raise Refused(path, f"an MTP-only deepseek4 GGUF (nextn_predict_layers {blocks - L}, no trunk tensors): "
                            "pass it as the draft (--draft) beside its target's main GGUF")
    raw = f.tensors(lambda s: s)
    table: dict[str, Entry] = {}
    for hfname, g in GLOBAL.items():
        if g in names:
            table[hfname] = ((g,), "float", None, raw.shape_of(g), raw.dtype_of(g))
    for i in range(L):
        table |= block_entries(f, i, f"model.layers.{i}.", fields)
    if blocks > L and f"blk.{L}.nextn.eh_proj.weight" in names:
        fields["mtp_layers"] = blocks - L            # in-file nextn blocks (llama.cpp probes eh_proj)
    known = {g for e in table.values() for g in e[0]}
    odd = sorted(n for n in names if n not in known and not any(n.startswith(f"blk.{i}.") for i in range(L, blocks)))
    if odd:
        raise BadTensor(f"{path}: tensor {odd[0]}", f"not a tensor of llama.cpp's deepseek4 layout ({len(odd)} such)")
    if "model.embed_tokens.weight" not in table:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [hidden, vocab] (the embedding)")
    vocab = table["model.embed_tokens.weight"][3][0]
    tensors = GgufTable(f, table)
    shapes = tensor_shapes(fields, vocab, tied=False) | packed_shapes(fields, tensors, fields["experts_mxfp4"])
    tables = {n: shapes.pop(n) for n in [n for n in shapes if n.endswith(".tid2eid")]}
    check_shapes(tensors, shapes, path)
    check_tables(tensors, tables, path, fields["moe"].num_experts)
    return Deepseek4Spec(family=FAMILY, source=Path(path), source_format="gguf", vocab_size=vocab,
                         tie_word_embeddings=False, max_position=cfg.int(A + "context_length"), tensors=tensors,
                         **fields)
