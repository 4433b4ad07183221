"""mimo2 targets in llama.cpp's GGUF layout (arch ``mimo2``): ``Mimo2Spec`` with the checkpoint's HF names.

The layout is what llama.cpp's converter (``conversion/mimo.py`` ``MimoV2Model``, llama.cpp 0c1e57098) writes and
``src/models/mimo2.cpp`` reads. Keys (``mimo2.`` prefix):

* ``block_count`` B = trunk L + ``nextn_predict_layers`` n (the converter hard-codes n = 3; the MTP layers are
  blocks L..B-1);
* ``embedding_length`` H, ``attention.head_count``, ``attention.head_count_kv`` (one entry per block: the SWA
  count on SWA blocks, MTP blocks included), ``attention.key_length`` (q/k head dim), ``attention.value_length``
  (v head dim), ``feed_forward_length`` (dense MLP width), ``context_length``;
* ``attention.sliding_window`` W (keys per query counting itself: llama.cpp masks j when i - j >= W) and
  ``attention.sliding_window_pattern`` (B flags, 1 = SWA; the converter appends 1 for each MTP block);
* ``rope.freq_base`` (full layers), ``rope.freq_base_swa`` (SWA layers), ``rope.dimension_count`` (the rotary
  channels of a head: int(head_dim * partial_rotary_factor); NEOX rotation);
* ``attention.layer_norm_rms_epsilon``, ``attention.value_scale`` (absent = 1);
* ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``, ``expert_group_count`` /
  ``expert_group_used_count`` (absent = no group limit), ``expert_gating_func`` (2 = sigmoid, the only one
  mimo2.cpp runs). mimo2.cpp renormalises the chosen weights and reads no weight scale, so a file with
  ``expert_weights_scale`` other than 1 is refused (llama.cpp would not apply it).

Tensors (ggml dims reversed to [out, in]) -> the HF checkpoint's names, so the kernels and the reference are the HF
path's: ``token_embd``, ``output_norm``, ``output`` (absent = tied); per block ``attn_norm``, ``attn_qkv`` (rows
[Q | K | V], split into q/k/v_proj; MiMo-V2.5's fused layout, the only one llama.cpp's MTP graph runs) or
``attn_q/k/v``, ``attn_output``, ``attn_sinks`` [nh] (-> ``attention_sink_bias``), ``ffn_norm``, dense
``ffn_{gate,up,down}`` or sparse ``ffn_gate_inp`` [E, H], ``exp_probs_b.bias`` [E] (-> ``e_score_correction_bias``),
``ffn_{gate,up}_exps`` [E, ff, H] and ``ffn_down_exps`` [E, H, ff] (one HF tensor per expert); MTP block L+k ->
``model.mtp.layers.{k}.``: the same attention and dense MLP names, ``ffn_norm`` -> ``pre_mlp_layernorm``,
``nextn.{eh_proj, enorm, hnorm}``, ``layer_output_norm`` -> ``final_layernorm``, and the optional
``nextn.{embed_tokens, shared_head_head, shared_head_norm}`` (``formats.mimo2_mtp`` refuses them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bloomery_gates.errors import BadConfig, BadTensor, Refused
from bloomery_gates.registry import family
from bloomery_gates.spec import AttnShape, LayerShape, Mimo2Spec, MimoShape, MoEShape

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile, is_gguf
from ...formats.lazy import check_shapes, layer_bound
from ..qwen38.reader import MappedTensors
from .reader import FAMILY, tensor_shapes

ARCH = family("mimo2").gguf_archs[0]     # the registry names it
SIGMOID = 2                     # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
BLOCK = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight", "attn_sinks.weight": "self_attn.attention_sink_bias",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         "ffn_gate_inp.weight": "mlp.gate.weight", "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
MTP_BLOCK = {**{k: v for k, v in BLOCK.items() if not k.startswith(("ffn_gate_inp", "exp_probs_b"))},
             "ffn_norm.weight": "pre_mlp_layernorm.weight", "nextn.eh_proj.weight": "eh_proj.weight",
             "nextn.enorm.weight": "enorm.weight", "nextn.hnorm.weight": "hnorm.weight",
             "layer_output_norm.weight": "final_layernorm.weight",
             "nextn.embed_tokens.weight": "embed_tokens.weight",
             "nextn.shared_head_head.weight": "shared_head.head.weight",
             "nextn.shared_head_norm.weight": "shared_head.norm.weight"}
EXPS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj", "ffn_down_exps.weight": "down_proj"}


def is_mimo2_gguf(path: Path) -> bool:
    return path.is_file() and is_gguf(path) and GGUFFile(path).meta("general.architecture", None) == ARCH


def _flags(cfg: Cfg, key: str, blocks: int) -> list[int]:
    v = cfg.get(key, what=f"{blocks} per-block values")
    if isinstance(v, bool) or not isinstance(v, list) or len(v) != blocks:
        raise cfg.bad(key, f"{v!r:.120}; expected {blocks} per-block values (block_count)")
    if not all(isinstance(x, int) for x in v):             # a GGUF typed array of strings or floats: named
        raise cfg.bad(key, f"{v!r:.120}; expected {blocks} per-block integers (or booleans)")
    return [int(x) for x in v]


def _per_block(cfg: Cfg, key: str, blocks: int) -> list[int]:
    v = cfg.get(key)
    return _flags(cfg, key, blocks) if isinstance(v, list) else [cfg.int(key)] * blocks


def _moe(cfg: Cfg, a: str) -> MoEShape:
    e = cfg.int(a + "expert_count")
    k = cfg.int(a + "expert_used_count", maximum=e, why=f"expert_count is {e}")
    g = cfg.int(a + "expert_group_count", 0, minimum=0) or 1
    tg = (cfg.int(a + "expert_group_used_count", maximum=g - 1, why=f"expert_group_count is {g}") if g > 1
          else 1)
    if e % g or e // g < 2:
        raise cfg.bad(a + "expert_group_count", f"{g} groups of {e} experts; expected a divisor leaving >= 2 each")
    if tg * (e // g) < k:
        raise cfg.bad(a + "expert_group_used_count", f"{tg} groups of {e // g} cannot hold expert_used_count {k}")
    gate = cfg.int(a + "expert_gating_func", SIGMOID)
    if gate != SIGMOID:
        raise cfg.bad(a + "expert_gating_func", f"{gate}; expected {SIGMOID} (sigmoid: llama.cpp's mimo2 graph "
                                                "runs only that)")
    if cfg.float(a + "expert_weights_scale", 1.0) != 1.0:
        raise cfg.bad(a + "expert_weights_scale", f"{cfg.get(a + 'expert_weights_scale')}; llama.cpp's mimo2 graph "
                                                  "does not read it (it scales by 1); expected absent or 1")
    key = a + "expert_feed_forward_length"
    widths = ({x for x in cfg.int_list(key, "expert widths (integers)") if x} if isinstance(cfg.get(key), list)
              else {cfg.int(key)})
    if len(widths) != 1:
        raise cfg.bad(a + "expert_feed_forward_length", f"{sorted(widths)}; expected one expert width")
    ff = widths.pop()
    return MoEShape(num_experts=e, top_k=k, expert_ff=ff, router="sigmoid", n_group=g, topk_group=tg,
                    norm_topk=True, routed_scale=1.0)


def _window(cfg: Cfg, a: str) -> int:
    """Keys per SWA query counting itself (llama.cpp masks key j of query i when i - j >= W)."""
    return cfg.int(a + "attention.sliding_window")


def _kind_sinks(f: GGUFFile, blocks: list[int], swa: list[int], kind: int) -> bool:
    """Whether the blocks of one kind (1 SWA, 0 full) carry attn_sinks: all or none."""
    have = [f"blk.{i}.attn_sinks.weight" in f._by_name for i in blocks if swa[i] == kind]
    if have and any(have) != all(have):
        raise BadTensor(f"{f.path}: tensors blk.*.attn_sinks.weight", f"on {sum(have)} of {len(have)} "
                        f"{'SWA' if kind else 'full-attention'} blocks; expected all or none")
    return bool(have) and all(have)


def _table(f: GGUFFile, raw, trunk: int, blocks: int, attn: dict[int, AttnShape], experts: int
           ) -> dict[str, tuple[str, object, tuple[int, ...] | None]]:
    """HF name -> (GGUF name, slice fn or None, shape or None) for every tensor of the file (``raw``: the file's
    tensors under their GGUF names)."""
    t: dict[str, tuple[str, object, tuple[int, ...] | None]] = {}
    for g in f.tensor_names():
        if g in GLOBAL:
            t[GLOBAL[g]] = (g, None, None)
            continue
        parts = g.split(".", 2)
        if parts[0] != "blk" or len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= blocks:
            raise BadTensor(f"{f.path}: tensor {g}", "not a mimo2 tensor name (llama.cpp's converter writes "
                            "token_embd, output_norm, output and blk.<i>.* for i < block_count)")
        i, rest = int(parts[1]), parts[2]
        mtp = i >= trunk
        head = f"model.mtp.layers.{i - trunk}." if mtp else f"model.layers.{i}."
        names = MTP_BLOCK if mtp else BLOCK
        if rest in names:
            t[head + names[rest]] = (g, None, None)
        elif rest in EXPS and not mtp:
            for e in range(experts):
                t[f"{head}mlp.experts.{e}.{EXPS[rest]}.weight"] = (g, lambda x, e=e: x[e], None)
        elif rest == "attn_qkv.weight":
            a = attn[i]
            q, k, v = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.v_head_dim
            for name, lo, n in (("q_proj", 0, q), ("k_proj", q, k), ("v_proj", q + k, v)):
                t[f"{head}self_attn.{name}.weight"] = (g, lambda x, lo=lo, n=n: x[lo:lo + n].contiguous(), None)
            if raw.shape_of(g)[0] != q + k + v:
                raise BadTensor(f"{f.path}: tensor {g}", f"shape {list(raw.shape_of(g))}; expected "
                                f"[{q + k + v}, hidden] (Q {q} | K {k} | V {v} rows)")
        else:
            raise BadTensor(f"{f.path}: tensor {g}", f"not a tensor of a mimo2 {'MTP' if mtp else 'trunk'} block")
    return t


class _Sliced(MappedTensors):
    """MappedTensors whose per-expert / fused-qkv slices get their shape from the source's."""

    def shape_of(self, name: str) -> tuple[int, ...]:
        src, fn, shape = self.table[name]
        if fn is None or shape is not None:
            return super().shape_of(name)
        full = self.inner.shape_of(src)
        return tuple(fn(torch.empty(full, device="meta")).shape)


def mimo2_from_gguf(path: Path) -> Mimo2Spec:
    """A mimo2 target (and its MTP blocks, as ``model.mtp.layers.{k}.*``) from a llama.cpp GGUF (arch mimo2)."""
    f = GGUFFile(path)
    arch = f.meta("general.architecture", None)
    if arch != ARCH:
        raise Refused(path, f"general.architecture is {arch!r}; this reader supports {ARCH!r}")
    a = f"{ARCH}."
    cfg = Cfg({k: f.meta(k) for k in f.meta_keys() if k.startswith(a)}, path)
    blocks = cfg.int(a + "block_count", what="the block count", **layer_bound(f.tensor_names(), "blk."))
    nextn = cfg.int(a + "nextn_predict_layers", 0, minimum=0)
    trunk = blocks - nextn
    if trunk < 1:
        raise cfg.bad(a + "block_count", f"{blocks} with nextn_predict_layers {nextn}; expected a trunk")
    H, nh, d = cfg.int(a + "embedding_length"), cfg.int(a + "attention.head_count"), cfg.int(a + "attention.key_length")
    dv = cfg.int(a + "attention.value_length")
    kv = _per_block(cfg, a + "attention.head_count_kv", blocks)
    swa = _flags(cfg, a + "attention.sliding_window_pattern", blocks)
    if any(x not in (0, 1) for x in swa):
        raise cfg.bad(a + "attention.sliding_window_pattern", f"{swa}; expected 0 (full) / 1 (SWA) per block")
    if any(swa[i] != 1 for i in range(trunk, blocks)):
        raise cfg.bad(a + "attention.sliding_window_pattern", f"{swa}: an MTP block (>= {trunk}) is not SWA; "
                      "MiMo's MTP layers use the SWA attention (the converter appends 1 per MTP block)")
    rot = cfg.int(a + "rope.dimension_count")
    if rot < 2 or rot % 2 or rot > d:
        raise cfg.bad(a + "rope.dimension_count", f"{rot}; expected an even number in [2, {d}]")
    kinds = {k: [kv[i] for i in range(blocks) if swa[i] == k] for k in (0, 1)}
    for k, counts in kinds.items():
        if len(set(counts)) > 1:
            raise cfg.bad(a + "attention.head_count_kv", f"{kv}: {'SWA' if k else 'full'} blocks disagree")
    theta = cfg.rope_base(a + "rope.freq_base")
    window = _window(cfg, a) if 1 in swa else None
    full = AttnShape(nh, kinds[0][0] if kinds[0] else kv[0], d, dv, theta, rot, None,
                     _kind_sinks(f, list(range(trunk)), swa, 0))
    swa_attn = AttnShape(nh, kinds[1][0], d, dv, cfg.rope_base(a + "rope.freq_base_swa"), rot, window,
                         _kind_sinks(f, list(range(blocks)), swa, 1)) if kinds[1] else full
    for x in (full, swa_attn):
        if nh % x.num_kv_heads:
            raise cfg.bad(a + "attention.head_count_kv", f"{x.num_kv_heads} does not divide head_count {nh}")
    names = set(f.tensor_names())
    mlps = tuple("sparse" if f"blk.{i}.ffn_gate_inp.weight" in names else "dense" for i in range(trunk))
    moe = _moe(cfg, a) if "sparse" in mlps else None
    attn = {i: swa_attn if swa[i] else full for i in range(blocks)}
    raw = f.tensors(lambda s: s)
    tensors = _Sliced(raw, _table(f, raw, trunk, blocks, attn, moe.num_experts if moe else 0))
    layer = LayerShape(H, nh, full.num_kv_heads, d, cfg.int(a + "feed_forward_length"),
                       cfg.float(a + "attention.layer_norm_rms_epsilon"), theta)
    types = tuple("sliding_attention" if swa[i] else "full_attention" for i in range(trunk))
    m = MimoShape(types, mlps, full, swa_attn, cfg.float(a + "attention.value_scale", 1.0), rot / d, moe, nextn)
    vocab = tensors.shape_of("model.embed_tokens.weight")[0] if "model.embed_tokens.weight" in tensors else None
    if vocab is None:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [hidden, vocab] (the embedding)")
    tied = "lm_head.weight" not in tensors
    check_shapes(tensors, tensor_shapes(layer, m, trunk, vocab, tied), path)
    if nextn and not any(n.startswith("model.mtp.layers.") for n in tensors):
        raise BadConfig(f"{path}: key {a}nextn_predict_layers", f"{nextn}, but no blk.{trunk}.* tensors; expected "
                        "the MTP blocks (or nextn_predict_layers 0)")
    return Mimo2Spec(family=FAMILY, source=Path(path), source_format="gguf", layer=layer, num_layers=trunk,
                     vocab_size=vocab, tie_word_embeddings=tied, max_position=cfg.int(a + "context_length"),
                     tensors=tensors, mimo=m)
