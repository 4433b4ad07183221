"""llama.cpp's DSV4 DSpark draft file (GGUF ``general.architecture`` "dflash", ``dflash.hyper_connection.count``
> 0; docs/FAMILIES_MOE.md 5.1, ``src/models/dflash.cpp`` loader) -> ``Deepseek4DSparkSpec`` for a deepseek4 target.

Keys (``dflash.`` prefix; every one read or refused by name, exit 2):
    block_count, embedding_length, attention.{head_count, head_count_kv (1), key_length (= value_length),
    layer_norm_rms_epsilon, q_lora_rank, sliding_window (> 0), output_group_count, output_lora_rank,
    compress_ratios (all 0)}, rope.{dimension_count, freq_base}, expert_{count, used_count, feed_forward_length,
    shared_count (1), weights_scale, weights_norm (true), gating_func (4 = sqrt-softplus)},
    swiglu_clamp_exp / swiglu_clamp_shexp (one value for every stage, equal), hyper_connection.{count,
    sinkhorn_iterations, epsilon}, target_layers (= the DSpark config's ids + 1: the state ENTERING that layer),
    block_size (default 16, as llama.cpp), sample_from_anchor (absent or true: anchor-first);
    tokenizer.ggml.mask_token_id.
Tensors (GGUF name -> the spec's name; shapes in the logical [out, in] order):
    blk.i.{attn_norm, attn_sinks, attn_q_a, attn_q_a_norm, attn_q_b, attn_kv, attn_kv_a_norm, attn_output_a
    [G, ol, nh d / G] (-> o_a_proj [G ol, nh d / G]), attn_output_b, hc_{attn,ffn}_{fn,base,scale}, ffn_gate_inp,
    exp_probs_b.bias, ffn_norm, ffn_{gate,up}_exps (-> experts.gate_up_proj = [gate | up] [E, 2 ff, H]),
    ffn_down_exps, ffn_{gate,up,down}_shexp} -> layers.i.*  (the trunk's HF names, ``reader.tensor_shapes``)
    output_hc_{fn,base,scale} -> hc_head.*; fc -> fc.weight [H, n H]; enc.output_norm -> enc_norm.weight;
    output_norm -> norm.weight; markov_w1 / markov_w2 [V, r] -> markov_head.*; conf_proj.{weight [1, H + r],
    bias [1]} -> confidence_head.proj.*; optional token_embd / output -> embed_tokens / lm_head.
Refused by name: a fused-scale ``fc.scale`` / ``markov_w2.scale``, a reduced vocabulary (``d2t``), compressors,
hash tables, a target of another family, a hidden size, vocabulary or target layer the target does not have.
The tensors are read eagerly (dequantized to float32): a fixture-sized draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import BadConfig, BadTensor, Mismatch, Refused
from bloomery_gates.spec import Deepseek4DSparkSpec, Deepseek4Spec, LayerShape, MoEShape, V4AttnShape
from bloomery_gates.spec.shapes import HCShape

from ...formats.gguf_file import GGUFFile
from ...formats.lazy import check_shapes

A = "dflash."
GATING_SQRT_SOFTPLUS = 4
DEFAULT_BLOCK = 16            # llama.cpp's common/speculative.cpp when dflash.block_size is absent
BLOCK = {"attn_norm.weight": "input_layernorm.weight", "attn_sinks.weight": "self_attn.sinks",
         "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
         "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_kv.weight": "self_attn.kv_proj.weight",
         "attn_kv_a_norm.weight": "self_attn.kv_norm.weight", "attn_output_a.weight": "self_attn.o_a_proj.weight",
         "attn_output_b.weight": "self_attn.o_b_proj.weight", "hc_attn_fn.weight": "attn_hc.fn",
         "hc_attn_base.weight": "attn_hc.base", "hc_attn_scale.weight": "attn_hc.scale",
         "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_base.weight": "ffn_hc.base", "hc_ffn_scale.weight": "ffn_hc.scale",
         "ffn_gate_inp.weight": "mlp.gate.weight", "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_down_exps.weight": "mlp.experts.down_proj",
         "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
         "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
         "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}
ROOT = {"output_hc_fn.weight": "hc_head.hc_fn", "output_hc_base.weight": "hc_head.hc_base",
        "output_hc_scale.weight": "hc_head.hc_scale", "fc.weight": "fc.weight",
        "enc.output_norm.weight": "enc_norm.weight", "output_norm.weight": "norm.weight",
        "markov_w1.weight": "markov_head.markov_w1.weight", "markov_w2.weight": "markov_head.markov_w2.weight",
        "conf_proj.weight": "confidence_head.proj.weight", "conf_proj.bias": "confidence_head.proj.bias",
        "token_embd.weight": "embed_tokens.weight", "output.weight": "lm_head.weight"}
OPTIONAL = ("token_embd.weight", "output.weight", "conf_proj.weight", "conf_proj.bias")
REFUSED = {"fc.scale": "a scaled fc", "markov_w2.scale": "a scaled markov_w2", "d2t": "a reduced draft vocabulary"}


class Keys:
    """Typed reads of the file's metadata, each failure a ``BadConfig`` naming the key."""

    def __init__(self, f: GGUFFile):
        self.f = f

    def bad(self, key: str, problem: str) -> BadConfig:
        return BadConfig(f"{self.f.path}: key {key}", problem)

    def get(self, key: str, default: Any = None, required: bool = True) -> Any:
        v = self.f.meta(key, None)
        if v is None:
            if required:
                raise self.bad(key, "missing; the DSV4 DSpark loader (llama.cpp dflash.cpp) requires it")
            return default
        return v

    def int(self, key: str, minimum: int = 0, required: bool = True, default: int | None = None) -> int:
        v = self.get(key, default, required)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.bad(key, f"{v!r}; expected an integer >= {minimum}")
        return v

    def float(self, key: str) -> float:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(key, f"{v!r}; expected a number")
        return float(v)

    def ints(self, key: str, n: int | None = None) -> list[int]:
        v = self.get(key)
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.bad(key, f"{v!r}; expected a non-empty integer array")
        if n is not None and len(v) < n:
            raise self.bad(key, f"{len(v)} entries; expected one per stage ({n})")
        return v

    def per_stage(self, key: str, n: int) -> float:
        """A per-stage float array (or one value) that must hold one value for every stage."""
        v = self.get(key)
        vals = v if isinstance(v, list) else [v]
        if not vals or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
            raise self.bad(key, f"{v!r}; expected a number or one per stage")
        if isinstance(v, list) and len(v) < n:
            raise self.bad(key, f"{len(v)} entries; expected one per stage ({n})")
        if len({float(x) for x in vals[:n]}) != 1:
            raise self.bad(key, f"{vals[:n]}; the engine takes one clamp for every stage (expected them equal)")
        return float(vals[0])


def read_keys(k: Keys, target: Deepseek4Spec) -> dict[str, Any]:
    arch = k.get("general.architecture")
    if arch != "dflash":
        raise Refused(k.f.path, f"general.architecture {arch!r}; expected \"dflash\" (llama.cpp's DFlash / DSpark)")
    hc = k.int(A + "hyper_connection.count", 0, required=False, default=0)
    if hc == 0:
        raise Refused(k.f.path, f"{A}hyper_connection.count absent or 0: a dense DFlash / DSpark backbone, not the "
                                "DSV4 one this reader takes (count > 0 selects it)")
    n = k.int(A + "block_count", 1)
    h = k.int(A + "embedding_length", 1)
    nh, nkv = k.int(A + "attention.head_count", 1), k.int(A + "attention.head_count_kv", 1)
    if nkv != 1:
        raise k.bad(A + "attention.head_count_kv", f"{nkv}; DSV4 attention has one K = V head (expected 1)")
    d = k.int(A + "attention.key_length", 1)
    if k.int(A + "attention.value_length", 1, required=False, default=d) != d:
        raise k.bad(A + "attention.value_length", f"expected {d} (= key_length: K = V)")
    rope_dim = k.int(A + "rope.dimension_count", 2)
    if rope_dim > d or rope_dim % 2:
        raise k.bad(A + "rope.dimension_count", f"{rope_dim}; expected an even number <= key_length {d}")
    window = k.int(A + "attention.sliding_window", 1)
    ratios = k.ints(A + "attention.compress_ratios", n)
    if any(ratios[:n]):
        raise k.bad(A + "attention.compress_ratios", f"{ratios}; the DSpark stages are uncompressed (expected all 0)")
    groups = k.int(A + "attention.output_group_count", 1)
    if (nh * d) % groups:
        raise k.bad(A + "attention.output_group_count", f"{groups} does not divide head_count * key_length {nh * d}")
    gating = k.int(A + "expert_gating_func")
    if gating != GATING_SQRT_SOFTPLUS:
        raise k.bad(A + "expert_gating_func", f"{gating}; expected 4 (sqrt-softplus: the DSV4 DSpark MoE)")
    if k.get(A + "expert_weights_norm") is not True:
        raise k.bad(A + "expert_weights_norm", "expected true (V4 always renormalises the chosen weights)")
    e, top = k.int(A + "expert_count", 1), k.int(A + "expert_used_count", 1)
    if top > e:
        raise k.bad(A + "expert_used_count", f"{top} is more than expert_count {e}")
    ff = k.int(A + "expert_feed_forward_length", 1)
    if k.int(A + "expert_shared_count", 1) != 1:
        raise k.bad(A + "expert_shared_count", "expected 1 (V4's one ungated shared expert)")
    clamp = k.per_stage(A + "swiglu_clamp_exp", n)
    if k.f.meta(A + "swiglu_clamp_shexp", None) is not None and k.per_stage(A + "swiglu_clamp_shexp", n) != clamp:
        raise k.bad(A + "swiglu_clamp_shexp", f"differs from swiglu_clamp_exp {clamp}; the engine takes one clamp")
    layers = k.ints(A + "target_layers")
    bad = [x for x in layers if not 1 <= x <= target.num_layers]
    if bad:
        raise Mismatch(f"{k.f.path}: key {A}target_layers",
                       f"{bad}: the target has layers 0..{target.num_layers - 1}; a value L is the state entering L "
                       f"(1..{target.num_layers})")
    block = k.int(A + "block_size", 1, required=False, default=DEFAULT_BLOCK)
    anchor = k.f.meta(A + "sample_from_anchor", True)
    if anchor not in (True, "true"):
        raise Refused(k.f.path, f"{A}sample_from_anchor {anchor!r}: a bonus-anchor block (B-1 drafts) is not built "
                                "here; expected true (anchor-first)")
    mask = k.int("tokenizer.ggml.mask_token_id")
    if mask >= target.vocab_size:
        raise Mismatch(f"{k.f.path}: key tokenizer.ggml.mask_token_id", f"{mask} >= the target's vocab "
                                                                         f"{target.vocab_size}")
    if h != target.hidden_size:
        raise Mismatch(f"{k.f.path}: key {A}embedding_length", f"{h} vs the target's hidden size {target.hidden_size}")
    theta, eps = k.float(A + "rope.freq_base"), k.float(A + "attention.layer_norm_rms_epsilon")
    attn = V4AttnShape(nh, d, rope_dim, k.int(A + "attention.q_lora_rank", 1), groups,
                       k.int(A + "attention.output_lora_rank", 1), window, theta, theta, None, 0, 0, 0, 0, 0)
    moe = MoEShape(e, top, ff, ff, False, "sqrtsoftplus", 1, 1, True, k.float(A + "expert_weights_scale"))
    hcs = HCShape(hc, 0, k.int(A + "hyper_connection.sinkhorn_iterations", 1), k.float(A + "hyper_connection.epsilon"))
    return {"n": n, "block": block, "ids": tuple(x - 1 for x in layers), "mask": mask, "attn": attn, "moe": moe,
            "hc": hcs, "clamp": clamp, "layer": LayerShape(h, nh, 1, d, ff, eps, theta)}


def shapes(f: dict[str, Any], vocab: int, rank: int, own: set[str]) -> dict[str, Any]:
    """GGUF name -> (logical shape, why)."""
    a, m, s, h = f["attn"], f["moe"], f["hc"].count, f["layer"].hidden_size
    nd, mix = a.num_heads * a.head_dim, (2 + s) * s
    out: dict[str, Any] = {
        "output_hc_fn.weight": ((s, s * h), "[hc, hc*H]"), "output_hc_base.weight": ((s,), "[hc]"),
        "output_hc_scale.weight": ((1,), "[1]"), "fc.weight": ((h, len(f["ids"]) * h), "[H, |target_layers|*H]"),
        "enc.output_norm.weight": ((h,), "[H]"), "output_norm.weight": ((h,), "[H]"),
        "markov_w1.weight": ((vocab, rank), "[V, rank]"), "markov_w2.weight": ((vocab, rank), "[V, rank]")}
    for n in own:
        out[n] = ((1,), "[1]") if n == "conf_proj.bias" else ((1, h + rank), "[1, H + rank]") \
            if n == "conf_proj.weight" else ((vocab, h), "[V, H]")
    for i in range(f["n"]):
        rows = {"attn_norm.weight": (h,), "attn_sinks.weight": (a.num_heads,), "attn_q_a.weight": (a.q_lora_rank, h),
                "attn_q_a_norm.weight": (a.q_lora_rank,), "attn_q_b.weight": (nd, a.q_lora_rank),
                "attn_kv.weight": (a.head_dim, h), "attn_kv_a_norm.weight": (a.head_dim,),
                "attn_output_a.weight": (a.o_groups, a.o_lora_rank, nd // a.o_groups),
                "attn_output_b.weight": (h, a.o_groups * a.o_lora_rank), "hc_attn_fn.weight": (mix, s * h),
                "hc_attn_base.weight": (mix,), "hc_attn_scale.weight": (3,), "hc_ffn_fn.weight": (mix, s * h),
                "hc_ffn_base.weight": (mix,), "hc_ffn_scale.weight": (3,), "ffn_gate_inp.weight": (m.num_experts, h),
                "exp_probs_b.bias": (m.num_experts,), "ffn_norm.weight": (h,),
                "ffn_gate_exps.weight": (m.num_experts, m.expert_ff, h),
                "ffn_up_exps.weight": (m.num_experts, m.expert_ff, h),
                "ffn_down_exps.weight": (m.num_experts, h, m.expert_ff), "ffn_gate_shexp.weight": (m.expert_ff, h),
                "ffn_up_shexp.weight": (m.expert_ff, h), "ffn_down_shexp.weight": (h, m.expert_ff)}
        out |= {f"blk.{i}.{n}": (shape, f"{list(shape)} (stage {i})") for n, shape in rows.items()}
    return out


def internal_name(gname: str) -> str:
    if gname in ROOT:
        return ROOT[gname]
    _, i, rest = gname.split(".", 2)
    return f"layers.{i}.{BLOCK[rest]}"


def markov_shape(lazy, names: set[str], path: Path, target_vocab: int) -> tuple[int, int]:
    """(V, r) of ``markov_w1`` [V, r], which a DSpark file must carry with the target's V rows."""
    if "markov_w1.weight" not in names:
        raise BadTensor(f"{path}: tensor markov_w1.weight", "missing; a DSpark file carries its Markov head")
    vocab, rank = lazy.shape_of("markov_w1.weight")
    if vocab != target_vocab:
        raise Mismatch(f"{path}: tensor markov_w1.weight", f"{vocab} rows vs the target's vocab {target_vocab}")
    return vocab, rank


def read_tensors(lazy, table: dict[str, Any], n: int) -> dict[str, torch.Tensor]:
    """The ``table``'s tensors (float32) under the spec's names (``internal_name``), with attn_output_a
    [G, ol, nh d / G] -> o_a_proj [G ol, nh d / G] and ffn_{gate,up}_exps [E, ff, H] each -> experts.gate_up_proj
    = [gate | up] [E, 2 ff, H] for each of the ``n`` stages."""
    t: dict[str, torch.Tensor] = {}
    for g in table:
        if g.startswith("blk.") and g.split(".", 2)[2] in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            continue
        x = lazy[g]
        if g.endswith("attn_output_a.weight"):
            x = x.reshape(-1, x.shape[-1])
        t[internal_name(g)] = x
    for i in range(n):
        t[f"layers.{i}.mlp.experts.gate_up_proj"] = torch.cat([lazy[f"blk.{i}.ffn_gate_exps.weight"],
                                                               lazy[f"blk.{i}.ffn_up_exps.weight"]], dim=1)
    return t


def deepseek4_dspark_from_gguf(path: Path, target: Deepseek4Spec) -> Deepseek4DSparkSpec:
    """The DSV4 DSpark draft in the GGUF ``path`` for the deepseek4 ``target``."""
    if target.family != "deepseek4":
        raise Mismatch(f"DSpark file {path} vs target {target.source}", f"target family {target.family!r}; this is "
                                                                        "the DeepSeek V4 (deepseek4) DSpark layout")
    f = GGUFFile(Path(path))
    fields = read_keys(Keys(f), target)
    names = set(f.tensor_names())
    for n, why in REFUSED.items():
        if n in names or n + ".weight" in names:
            raise Refused(f"{path}: tensor {n}", f"{why} is not built here")
    odd = sorted(n for n in names if "compressor" in n or "indexer" in n or "tid2eid" in n)
    if odd:
        raise Refused(f"{path}: tensor {odd[0]}", "compressors / indexers / hash tables: the DSpark stages are "
                                                  "uncompressed, sqrt-softplus routed")
    lazy = f.tensors(rename=lambda g: g)
    vocab, rank = markov_shape(lazy, names, path, target.vocab_size)
    own = {n for n in OPTIONAL if n in names}
    if ("conf_proj.weight" in own) != ("conf_proj.bias" in own):
        raise BadTensor(f"{path}: tensor conf_proj", "weight and bias come together (one of them is missing)")
    table = shapes(fields, vocab, rank, own)
    check_shapes(lazy, table, path)
    extra = sorted(names - set(table))
    if extra:
        raise BadTensor(f"{path}: tensor {extra[0]}", "not a DSV4 DSpark tensor this reader knows")
    t = read_tensors(lazy, table, fields["n"])
    return Deepseek4DSparkSpec(kind="deepseek4-dspark", source=Path(path), source_format="gguf", num_layers=fields["n"],
                               block_size=fields["block"], target_layer_ids=fields["ids"],
                               mask_token_id=fields["mask"], markov_rank=rank,
                               confidence="conf_proj.weight" in own, collapse="hc_head", vocab_size=vocab,
                               layer=fields["layer"], attn=fields["attn"], moe=fields["moe"], hc=fields["hc"],
                               swiglu_limit=fields["clamp"], tensors=t)
