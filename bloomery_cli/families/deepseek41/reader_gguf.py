"""deepseek41 targets in the seed engine's GGUF layout (arch ``deepseek41``; docs/V41.md sections 2-3, read from the
seed's ``crates/model/src/arch/deepseek41/{hparams,names}.rs``): ``Deepseek41Spec`` with deepseek4's HF names.

Keys (``deepseek41.`` prefix), each read and checked or refused by name (exit 2), as the seed reads them:

    size       block_count, embedding_length, context_length; the vocabulary from token_embd's rows (checked
               against vocab_size or tokenizer.ggml.tokens where the file has them)
    attention  attention.head_count, attention.head_count_kv (= 1), attention.key_length = attention.value_length,
               attention.q_lora_rank, attention.output_group_count (divides head_count),
               attention.output_lora_rank, attention.sliding_window, attention.layer_norm_rms_epsilon,
               attention.compress_ratios (>= block_count entries)
    rope       rope.dimension_count (even, <= key_length), rope.freq_base, attention.compress_rope_freq_base,
               rope.scaling.{type = "yarn", factor, original_context_length, yarn_beta_fast, yarn_beta_slow}
    indexer    attention.indexer.{head_count, key_length, top_k}
    experts    expert_gating_func (= 4, sqrt-softplus), expert_count, expert_used_count, expert_shared_count (= 1),
               expert_feed_forward_length, expert_weights_scale, expert_weights_norm (= true), hash_layer_count
               (= 0: a V4.1 file has no hash tables), swiglu_clamp_exp / swiglu_clamp_shexp (one value or one per
               layer), leading_dense_block_count (absent or 0)
    mHC        hyper_connection.{count, sinkhorn_iterations, epsilon}

Layers: ratio 0 is "sliding" (window only); ratio m > 0 is "stream": it reads the stream of the last layer at or
before it that carries ``attn_compressor_kv`` (kv source), the keys of the last ``indexer.attn_k`` (key source),
the choice of the last ``indexer.attn_q_b`` (topk source): the seed's ``walk_streams``, with its refusals (a source
missing, a kv source compressing at another ratio, a compressor without its gate above ratio 1, a third ratio, a
compressor on a ratio-0 layer, no compressed layer at all is allowed here: window-only files read) and three of
ours, each by name: index keys on a layer without a compressor (ik keys off the pooled latent of the same layer),
a key or topk source at another ratio than its reader (its entries would not line up), an overlapping compressor
(twice the latent wide: V4's CSA form, not V4.1's).
Engram sites (docs/V41.md 7): with ``engram.layer_ids``, the keys ``engram.{head_count, max_ngram_size,
key_length, pad_id, multipliers, primes, offsets, token_map}`` (the seed's hash constants, lengths checked, offsets
the primes' exclusive prefix sums, the map one entry per token) and on exactly those layers
``engram_{embd [sum of primes, key_len], wkv [(S+1) H, n_cols key_len], k [S, H], q [S, H]}``.
The candidate mask (docs/V41.md 8): ``attention.candidate_{source_layer_id, block_size, topk_blocks}``, all three or
none (``candidates_of``: the source an index source, the fewest kept rows at least the indexer's top_k).
What this build does not run is refused by name: clamps that differ by
layer or between routed and shared experts (the spec holds one ``swiglu_limit``). The seed's own
refusals are kept: ``output_hc_{fn,base,scale}`` in the file (a V4.1 file collapses with the lagged mix), an
expert gating function other than 4, value_length != key_length, a scaling type other than yarn.

Tensors (ggml dims reversed to [out, in]) -> deepseek4's HF names: ``token_embd``, ``output_norm``, ``output``; per
block ``attn_norm``, ``attn_q_a``, ``attn_q_a_norm``, ``attn_q_b``, ``attn_kv``, ``attn_kv_a_norm``, ``attn_sinks``,
``attn_output_a``, ``attn_output_b``, ``hc_{attn,ffn}_{fn,base,scale}``, ``ffn_norm``, ``ffn_gate_inp``,
``exp_probs_b.bias``, ``ffn_{gate,up}_exps`` [E, ff, H] (concatenated into ``mlp.experts.gate_up_proj`` [E, 2 ff, H],
gate first), ``ffn_down_exps`` [E, H, ff], ``ffn_{gate,up,down}_shexp``; on some layers (``STREAM``)
``attn_compressor_{kv [d, H], gate [d, H], norm [d]}`` -> ``self_attn.compressor.{kv_proj, gate_proj, kv_norm}``,
``indexer.{attn_k [di, d], k_norm [di]}`` -> ``self_attn.indexer.{k_proj, k_norm}``, ``indexer.{attn_q_b
[nih di, q_lora], proj [nih, H]}`` -> ``self_attn.indexer.{q_b_proj, weights_proj}``. Any other block tensor (a
position table, an index-key compressor, an engram table, a hash table) is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bloomery_gates.engram_hash import EngramHash
from bloomery_gates.errors import BadConfig, BadTensor, Refused
from bloomery_gates.registry import family
from bloomery_gates.spec import (
    CandidateMask,
    Deepseek41Spec,
    HCShape,
    LayerShape,
    MoEShape,
    RopeScaling,
    V4AttnShape,
    V41Stream,
)

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile
from ...formats.lazy import check_shapes
from ..deepseek4.reader import tensor_shapes
from ..qwen38.reader import MappedTensors

FAMILY = "deepseek41"
ARCH = family(FAMILY).gguf_archs[0]          # the registry names it
SQRT_SOFTPLUS = 4                            # ik's LLM_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
BLOCK = {"attn_norm.weight": "input_layernorm.weight", "attn_q_a.weight": "self_attn.q_a_proj.weight",
         "attn_q_a_norm.weight": "self_attn.q_a_norm.weight", "attn_q_b.weight": "self_attn.q_b_proj.weight",
         "attn_kv.weight": "self_attn.kv_proj.weight", "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
         "attn_sinks.weight": "self_attn.sinks", "attn_output_a.weight": "self_attn.o_a_proj.weight",
         "attn_output_b.weight": "self_attn.o_b_proj.weight", "hc_attn_fn.weight": "attn_hc.fn",
         "hc_attn_base.weight": "attn_hc.base", "hc_attn_scale.weight": "attn_hc.scale",
         "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_base.weight": "ffn_hc.base", "hc_ffn_scale.weight": "ffn_hc.scale",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
         "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
         "ffn_down_exps.weight": "mlp.experts.down_proj",
         "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
         "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
         "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}
FUSED = ("ffn_gate_exps.weight", "ffn_up_exps.weight")        # -> mlp.experts.gate_up_proj, gate rows first
STREAM = {"attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
          "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
          "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
          "indexer.attn_k.weight": "self_attn.indexer.k_proj.weight",
          "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
          "indexer.attn_q_b.weight": "self_attn.indexer.q_b_proj.weight",
          "indexer.proj.weight": "self_attn.indexer.weights_proj.weight"}
ENGRAM = {"engram_embd.weight": "engram.embed.weight", "engram_wkv.weight": "engram.wkv.weight",
          "engram_k.weight": "engram.k_norm.weight", "engram_q.weight": "engram.q_norm.weight"}
PAIRS = (("attn_compressor_kv.weight", "attn_compressor_norm.weight"),
         ("indexer.attn_k.weight", "indexer.k_norm.weight"), ("indexer.attn_q_b.weight", "indexer.proj.weight"))
CANDIDATE = ("attention.candidate_source_layer_id", "attention.candidate_block_size",
             "attention.candidate_topk_blocks")


class _Mapped(MappedTensors):
    """MappedTensors plus the one fused entry per layer: ``gate_up_proj`` = cat(gate_exps, up_exps) on dim 1."""

    def __init__(self, inner, table, fused: dict[str, tuple[str, str]]):
        super().__init__(inner, table)
        self.fused = fused

    def _names(self) -> list[str]:
        return [*self.table, *self.fused]

    def __contains__(self, name: object) -> bool:
        return name in self.table or name in self.fused

    def _src(self, name: str) -> str:
        return self.fused[name][0] if name in self.fused else self.table[name][0]

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self.fused:
            return super().shape_of(name)
        g, u = (self.inner.shape_of(s) for s in self.fused[name])
        if len(g) != 3 or g != u:
            raise BadTensor(self.inner.label(self.fused[name][1]), f"shape {list(u)}, expected {list(g)} (the "
                                                                   "gate stack's: [experts, ff, hidden])")
        return (g[0], 2 * g[1], g[2])

    def dtype_of(self, name: str) -> str:
        return self.inner.dtype_of(self._src(name))

    def element_bytes(self, name: str) -> int:
        return self.inner.element_bytes(self._src(name))

    def file_of(self, name: str) -> Path:
        return self.inner.file_of(self._src(name))

    def label(self, name: str) -> str:
        if name in self.fused:
            return f"{' + '.join(self.inner.label(s) for s in self.fused[name])} (= {name})"
        return super().label(name)

    def check_dtype(self, name: str) -> None:
        for s in self.fused.get(name, (self._src(name),)):
            self.inner.check_dtype(s)

    def _load(self, name: str) -> torch.Tensor:
        if name in self.fused:
            return torch.cat([self.inner[s] for s in self.fused[name]], dim=1)
        return super()._load(name)


def _per_layer(cfg: Cfg, key: str, n: int) -> float:
    """A per-layer float (one value or one per layer, the seed's ``per_layer_f32``) that must be one value here."""
    v = cfg.get(key)
    vals = v if isinstance(v, list) else [v] * n
    if len(vals) != n or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vals):
        raise cfg.bad(key, f"{v!r}; expected one number or one per layer ({n})")
    if len(set(vals)) != 1 or not vals[0] > 0:
        raise cfg.bad(key, f"{vals}; this build holds one positive clamp for every layer")
    return float(vals[0])


def _table(names: set[str], n: int, where: Path) -> tuple[dict, dict[str, tuple[str, str]]]:
    """GGUF names -> HF names; any tensor outside the table is refused by name."""
    table = {hf: (g, None, None) for g, hf in GLOBAL.items() if g in names}
    fused = {}
    known = set(GLOBAL)
    for layer in range(n):
        b, p = f"blk.{layer}.", f"model.layers.{layer}."
        table |= {p + hf: (b + g, None, None) for g, hf in BLOCK.items()}
        table |= {p + hf: (b + g, None, None) for g, hf in {**STREAM, **ENGRAM}.items() if b + g in names}
        fused[p + "mlp.experts.gate_up_proj"] = (b + FUSED[0], b + FUSED[1])
        known |= {b + g for g in (*BLOCK, *FUSED, *STREAM, *ENGRAM)}
    for name in sorted(names - known):
        if name.startswith("output_hc_"):
            raise BadTensor(f"{where}: tensor {name}", "present; a deepseek41 file collapses its streams with the "
                                                       "lagged mix (LastMix), not a trained head (docs/V41.md 4)")
        raise Refused(where, f"tensor {name}: not a deepseek41 tensor this build runs (no position table, "
                             "index-key compressor, engram table or hash table: docs/V41.md 3, 10)")
    missing = [src for src, _, _ in table.values() if src not in names] + \
              [s for pair in fused.values() for s in pair if s not in names]
    if missing:
        raise BadTensor(f"{where}: tensor {missing[0]}", "missing; every deepseek41 block carries it (docs/V41.md 3)")
    return table, fused


def deepseek41_from_gguf(path: Path) -> Deepseek41Spec:
    """A deepseek41 target from a GGUF in the seed's V4.1 layout (module docstring); no weight is read."""
    f = GGUFFile(path)
    arch = f.meta("general.architecture", None)
    if arch != ARCH:
        raise Refused(path, f"general.architecture is {arch!r}; this reader supports {ARCH!r}")
    a = f"{ARCH}."
    cfg = Cfg({k[len(a):]: f.meta(k) for k in f.meta_keys() if k.startswith(a)}, path, a)
    n = cfg.int("block_count")
    d = cfg.int("attention.key_length")
    if cfg.int("attention.value_length") != d:
        raise cfg.bad("attention.value_length", f"{cfg.get('attention.value_length')}; expected the key length {d}"
                                                " (one latent is every head's key and value)")
    heads, r = cfg.int("attention.head_count"), cfg.int("rope.dimension_count")
    cfg.int("attention.head_count_kv", minimum=1, maximum=1, what="1 (one shared K = V head)")
    if r % 2 or r > d:
        raise cfg.bad("rope.dimension_count", f"{r}; expected an even width <= key_length {d}")
    groups = cfg.int("attention.output_group_count")
    if heads % groups:
        raise cfg.bad("attention.output_group_count", f"{groups} does not divide head_count {heads}")
    ratios = cfg.int_list("attention.compress_ratios")
    if len(ratios) < n:
        raise cfg.bad("attention.compress_ratios", f"{len(ratios)} values for {n} layers")
    ratios = ratios[:n]
    if any(r < 0 for r in ratios):
        raise cfg.bad("attention.compress_ratios", f"{ratios}; expected ratios >= 0")
    if cfg.get("rope.scaling.type") != "yarn":
        raise cfg.bad("rope.scaling.type", f"{cfg.get('rope.scaling.type')!r}; the compressed layers' rope is yarn")
    scaling = RopeScaling("yarn", cfg.float("rope.scaling.factor"), cfg.int("rope.scaling.original_context_length"),
                          cfg.float("rope.scaling.yarn_beta_fast"), cfg.float("rope.scaling.yarn_beta_slow"))
    attn = V4AttnShape(heads, d, r, cfg.int("attention.q_lora_rank"), groups, cfg.int("attention.output_lora_rank"),
                       cfg.int("attention.sliding_window"), cfg.rope_base("rope.freq_base"),
                       cfg.rope_base("attention.compress_rope_freq_base"), scaling, 0, 0,
                       cfg.int("attention.indexer.head_count"), cfg.int("attention.indexer.key_length"),
                       cfg.int("attention.indexer.top_k"))
    if cfg.int("expert_gating_func") != SQRT_SOFTPLUS:
        raise cfg.bad("expert_gating_func", f"{cfg.get('expert_gating_func')}; the V4.1 router scores with "
                                            "sqrt-softplus (4)")
    e, k = cfg.int("expert_count"), cfg.int("expert_used_count")
    if k > e:
        raise cfg.bad("expert_used_count", f"{k} is more than expert_count {e}")
    cfg.int("expert_shared_count", minimum=1, maximum=1, what="1 (one ungated shared expert)")
    if not cfg.bool("expert_weights_norm"):
        raise cfg.bad("expert_weights_norm", "false; the V4.1 router renormalises its chosen weights")
    cfg.int("hash_layer_count", minimum=0, maximum=0, what="0 (a deepseek41 file has no hash tables)")
    cfg.int("leading_dense_block_count", 0, minimum=0, maximum=0, what="0 (every layer routed here)")
    ff = cfg.int("expert_feed_forward_length")
    moe = MoEShape(e, k, ff, ff, False, "sqrtsoftplus", 1, 1, True, cfg.float("expert_weights_scale"))
    limit = _per_layer(cfg, "swiglu_clamp_exp", n)
    if _per_layer(cfg, "swiglu_clamp_shexp", n) != limit:
        raise cfg.bad("swiglu_clamp_shexp", "differs from swiglu_clamp_exp; this build holds one clamp")
    hc = HCShape(cfg.int("hyper_connection.count", minimum=2), 0, cfg.int("hyper_connection.sinkhorn_iterations"),
                 cfg.float("hyper_connection.epsilon"))
    layer = LayerShape(cfg.int("embedding_length"), heads, 1, d, ff,
                       cfg.float("attention.layer_norm_rms_epsilon"), attn.rope_theta)
    if hc.count > layer.hidden_size:
        raise cfg.bad("hyper_connection.count", f"{hc.count} streams: more than embedding_length")
    names = set(f.tensor_names())
    table, fused = _table(names, n, path)
    streams = walk(cfg, names, ratios, path)
    eng = engram_of(cfg, names, n, path)
    if attn.rope_dim > attn.index_head_dim and any(streams):
        raise cfg.bad("attention.indexer.key_length", f"{attn.index_head_dim}; the index keys rotate the "
                                                      f"{attn.rope_dim}-wide rope tail")
    tensors = _Mapped(f.tensors(lambda s: s), table, fused)
    vocab = tensors.shape_of("model.embed_tokens.weight")[0]
    for key, v in ((a + "vocab_size", f.meta(a + "vocab_size", None)),
                   ("tokenizer.ggml.tokens", len(f.meta("tokenizer.ggml.tokens", [])) or None)):
        if v is not None and v != vocab:
            raise BadConfig(f"{path}: key {key}", f"{v}; token_embd.weight has {vocab} rows")
    fields = {"layer": layer, "num_layers": n, "layer_types": ("sliding",) * n, "mlp_types": ("moe",) * n,
              "attn": attn, "moe": moe, "hc": hc}
    tied = "lm_head.weight" not in tensors
    shapes = {k: v for k, v in tensor_shapes(fields, vocab, tied).items() if not k.startswith("model.hc_head.")}
    check_shapes(tensors, shapes | stream_shapes(attn, layer.hidden_size, table) |
                 engram_shapes(eng, hc.count, layer.hidden_size), path)
    if eng is not None and len(eng.token_map) != vocab:
        raise cfg.bad("engram.token_map", f"{len(eng.token_map)} entries; the vocabulary has {vocab} tokens")
    fields["layer_types"] = tuple("stream" if s else "sliding" for s in streams)
    return Deepseek41Spec(family=FAMILY, source=Path(path), source_format="gguf", vocab_size=vocab,
                          tie_word_embeddings=tied, max_position=cfg.int("context_length"), tensors=tensors,
                          swiglu_limit=limit, mtp_layers=0, streams=tuple(streams), engram=eng,
                          candidates=candidates_of(cfg, streams, attn.index_topk), **fields)


def candidates_of(cfg: Cfg, streams: list[V41Stream | None], top_k: int) -> CandidateMask | None:
    """The candidate mask's three keys (docs/V41.md 8): none of them, or a negative source layer (upstream's
    ``0 <= candidate_source_layer_id``), is no mask; otherwise all three, the source an index source (a layer
    that makes its own stream choice), block size and block count >= 1, and the fewest rows a full mask keeps,
    (topk_blocks - 1) block_size + 1, at least the indexer's top_k (the seed's refusal). Each refusal names its
    key (exit 2)."""
    there = [k for k in CANDIDATE if k in cfg.data]
    if not there:
        return None
    src_key, size_key, blocks_key = CANDIDATE
    if len(there) < len(CANDIDATE):
        missing = next(k for k in CANDIDATE if k not in cfg.data)
        raise cfg.bad(missing, f"missing, and the file has {cfg.prefix}{there[0]}: the candidate mask takes all three")
    src = cfg.int(src_key, what="a layer index", minimum=None)
    if src < 0:
        return None
    if src >= len(streams):
        raise cfg.bad(src_key, f"{src}; the file has {len(streams)} layers")
    s = streams[src]
    if s is None or s.topk_source != src:
        raise cfg.bad(src_key, f"{src}: layer {src} makes no stream choice of its own (no indexer.attn_q_b); the "
                               "candidate source must be an index source")
    cm = CandidateMask(src, cfg.int(size_key, what="a block size"), cfg.int(blocks_key, what="a block count"))
    if cm.fewest_rows() < top_k:
        raise cfg.bad(blocks_key, f"{cm.topk_blocks} blocks of {cm.block_size}: a full mask keeps as few as "
                                  f"{cm.fewest_rows()} entries, fewer than attention.indexer.top_k {top_k}")
    return cm


def engram_of(cfg: Cfg, names: set[str], n: int, where: Path) -> EngramHash | None:
    """The engram sites (docs/V41.md 7; the seed's ``Engram::read`` and ``Hash::from_gguf``): every key required
    once ``engram.layer_ids`` is present, a site's four tensors exactly on the listed layers."""
    sites = [layer for layer in range(n) if any(f"blk.{layer}.{g}" in names for g in ENGRAM)]
    if "engram.layer_ids" not in cfg.data:
        if sites:
            raise BadTensor(f"{where}: tensor blk.{sites[0]}.engram_embd.weight", "present, and the file has no "
                            "engram.layer_ids")
        return None
    ids = cfg.int_list("engram.layer_ids")
    if not ids or len(set(ids)) != len(ids) or any(not 0 <= x < n for x in ids):
        raise cfg.bad("engram.layer_ids", f"{ids}; expected distinct layers below {n}, at least one")
    for layer in sorted(set(ids) | set(sites)):
        for g in ENGRAM:
            if (f"blk.{layer}.{g}" in names) != (layer in ids):
                raise BadTensor(f"{where}: tensor blk.{layer}.{g}", "missing, and engram.layer_ids lists the layer"
                                if layer in ids else "present, and engram.layer_ids does not list the layer")
    heads, ngram = cfg.int("engram.head_count"), cfg.int("engram.max_ngram_size", minimum=2)
    cols = (ngram - 1) * heads
    lists = {k: cfg.int_list("engram." + k) for k in ("multipliers", "primes", "offsets", "token_map")}
    for k, want in (("multipliers", len(ids) * ngram), ("primes", len(ids) * cols), ("offsets", len(ids) * cols)):
        if len(lists[k]) != want:
            raise cfg.bad("engram." + k, f"{len(lists[k])} values; expected {want} ({len(ids)} sites)")
    for s in range(len(ids)):
        p, o = lists["primes"][s * cols:(s + 1) * cols], lists["offsets"][s * cols:(s + 1) * cols]
        if any(x <= 0 for x in p) or o != [sum(p[:c]) for c in range(cols)]:
            raise cfg.bad("engram.offsets", f"site {s}: {o}; expected the exclusive prefix sums of positive primes")
    return EngramHash(tuple(ids), heads, ngram, cfg.int("engram.key_length"), cfg.int("engram.pad_id", minimum=0),
                      tuple(lists["token_map"]), tuple(lists["multipliers"]), tuple(lists["primes"]),
                      tuple(lists["offsets"]))


def engram_shapes(e: EngramHash | None, s: int, h: int) -> dict:
    if e is None:
        return {}
    out = {}
    for site, layer in enumerate(e.layer_ids):
        p = f"model.layers.{layer}.engram."
        out |= {p + "embed.weight": ((e.table_rows(site), e.key_length), "[sum of the site's primes, key_length]"),
                p + "wkv.weight": (((s + 1) * h, e.n_cols * e.key_length), "[(streams + 1) hidden, n_cols key_length]"),
                p + "k_norm.weight": ((s, h), "[streams, hidden]"), p + "q_norm.weight": ((s, h), "[streams, hidden]")}
    return out


def stream_shapes(a: V4AttnShape, h: int, table: dict) -> dict:
    """The shapes of the stream tensors the file carries (the compressor one latent wide: no overlap)."""
    d, di = a.head_dim, a.index_head_dim
    want = {"self_attn.compressor.kv_proj.weight": (d, h), "self_attn.compressor.gate_proj.weight": (d, h),
            "self_attn.compressor.kv_norm.weight": (d,), "self_attn.indexer.k_proj.weight": (di, d),
            "self_attn.indexer.k_norm.weight": (di,),
            "self_attn.indexer.q_b_proj.weight": (a.index_heads * di, a.q_lora_rank),
            "self_attn.indexer.weights_proj.weight": (a.index_heads, h)}
    out = {}
    for name in table:
        tail = name.split(".", 3)[3] if name.startswith("model.layers.") else ""
        if tail in want:
            out[name] = (want[tail], f"{list(want[tail])} (V4.1: one latent wide, no overlap)")
    return out


def walk(cfg: Cfg, names: set[str], ratios: list[int], where: Path) -> list[V41Stream | None]:
    """The seed's stream walk (module docstring) over what each layer carries; a refusal names the key or the
    tensor at the layer that breaks it."""
    key = "attention.compress_ratios"
    last: dict[str, int | None] = {"kv": None, "key": None, "idx": None}
    seen: list[int] = []
    out: list[V41Stream | None] = []
    for layer, ratio in enumerate(ratios):
        b = f"blk.{layer}."
        has = {g: b + g in names for g in STREAM}
        for first, second in PAIRS:
            if has[first] != has[second]:
                miss = second if has[first] else first
                raise BadTensor(f"{where}: tensor {b}{miss}", f"missing; layer {layer} carries {b}"
                                f"{first if has[first] else second}")
        if has["indexer.attn_k.weight"] and not has["attn_compressor_kv.weight"]:
            raise BadTensor(f"{where}: tensor {b}indexer.attn_k.weight", f"on layer {layer}, which carries no "
                            "attn_compressor_kv: index keys come from the same layer's pooled latent")
        for part, g in (("kv", "attn_compressor_kv.weight"), ("key", "indexer.attn_k.weight"),
                        ("idx", "indexer.attn_q_b.weight")):
            if has[g]:
                last[part] = layer
        if ratio == 0:
            if has["attn_compressor_kv.weight"]:
                raise cfg.bad(key, f"is 0 at layer {layer}, which carries a compressor")
            out.append(None)
            continue
        for part, g in (("kv", "attn_compressor_kv"), ("key", "indexer.attn_k"), ("idx", "indexer.attn_q_b")):
            if last[part] is None:
                raise cfg.bad(key, f"is {ratio} at layer {layer}, and no layer up to it carries {g}")
        for part in ("kv", "key", "idx"):
            src = last[part]
            if ratios[src] != ratio:
                raise cfg.bad(key, f"is {ratio} at layer {layer}, which reads layer {src}'s "
                              f"{ {'kv': 'stream', 'key': 'index keys', 'idx': 'choice'}[part]}, at {ratios[src]}")
        if has["attn_compressor_kv.weight"] and not has["attn_compressor_gate.weight"] and ratio != 1:
            raise BadTensor(f"{where}: tensor {b}attn_compressor_gate.weight", f"missing, and layer {layer} pools "
                            f"{ratio} tokens per row")
        if ratio not in seen:
            if len(seen) == 2:
                raise cfg.bad(key, f"is {ratio} at layer {layer}, a third ratio after {seen[0]} and {seen[1]}")
            seen.append(ratio)
        out.append(V41Stream(ratio, last["kv"], last["key"], last["idx"]))
    return out
