"""deepseek4 targets from an HF directory (model_type ``deepseek_v4``; docs/FAMILIES_MOE.md 4.4): ``Deepseek4Spec``.
Keys, each read and range-checked or refused by name (exit 2):

    size       hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (= 1: shared K = V),
               head_dim, vocab_size, moe_intermediate_size, rms_norm_eps, max_position_embeddings,
               tie_word_embeddings
    attention  q_lora_rank, qk_rope_head_dim (or partial_rotary_factor; even, <= head_dim and <= index_head_dim),
               o_groups (divides num_attention_heads), o_lora_rank, sliding_window, rope_theta,
               compress_rope_theta, rope_scaling / rope_parameters (the compress rope: default or yarn, attention
               factor 1 unless given; a nested {main, compress} form with main default),
               attention_bias = false
    kinds      layer_types (sliding_attention | compressed_sparse_attention | heavily_compressed_attention), or
               the legacy compress_ratios (0 / 4 / 128); compress_rates {compressed_sparse_attention,
               heavily_compressed_attention} (or compress_rate_csa / compress_rate_hca; default 4 / 128);
               mlp_layer_types (hash_moe | moe; default num_hash_layers, 3, hash layers first)
    indexer    index_n_heads, index_head_dim, index_topk
    experts    n_routed_experts, num_experts_per_tok, n_shared_experts (1), scoring_func = sqrtsoftplus,
               routed_scaling_factor, swiglu_limit, norm_topk_prob (unused by V4: always renormalised, true only),
               hidden_act = silu, mlp_bias = false
    mHC        hc_mult >= 2, hc_sinkhorn_iters >= 1, hc_eps > 0
    MTP        num_nextn_predict_layers (its tensors are read by ``reader_mtp``: DeepSeek's ``mtp.K.*`` spelled as this
               reader spells the trunk, HF's module names: ``mtp.0.{self_attn, mlp, attn_hc, ffn_hc}.*``,
               ``mtp.0.{input_layernorm, post_attention_layernorm, enorm, hnorm, norm}.weight``,
               ``mtp.0.{e_proj, h_proj}.weight``, ``mtp.0.hc_head.{hc_fn, hc_base, hc_scale}``)
    MTP        num_nextn_predict_layers (its ``mtp.*`` tensors are not read here)
    quant      expert_dtype (top level, V4's spelling) or quantization_config.expert_dtype (V4.1's; transformers
               5.24 folds the first into the second, configuration_deepseek_v4.py:246-254): absent = float experts;
               "fp4" = the routed experts in DeepSeek's native FP4 (``experts_fp4`` below); "fp8" refused.
               With a quantization_config: quant_method "fp8" and scale_fmt "ue8m0" (FineGrainedFP8Config's
               one FP4 form), and every other tensor still float (F32 / F16 / BF16: FP8 dense weights refused).

FP4 experts, the layout followed (transformers' ``FP8Experts`` with ``expert_dtype="fp4"``,
integrations/finegrained_fp8.py:749-784 and ``Fp8Dequantize._unpack_fp4``; DeepSeek's own files spell the same
bytes ``layers.L.ffn.experts.J.w{1,3,2}.{weight,scale}``, one tensor per expert, which HF's conversion mapping
merges into these):

    model.layers.L.mlp.experts.gate_up_proj            I8 / U8       [E, 2 ff, H/2]  e2m1 codes, element 2j in
    model.layers.L.mlp.experts.down_proj               I8 / U8       [E, H, ff/2]    the low nibble, 2j+1 high
    model.layers.L.mlp.experts.gate_up_proj_scale_inv  F8_E8M0 / U8  [E, 2 ff, H/32] one e8m0 scale per 32
    model.layers.L.mlp.experts.down_proj_scale_inv     F8_E8M0 / U8  [E, H, ff/32]   weights of a row

H and ff multiples of 32. The spec keeps them packed: each is handed out as its uint8 bytes when read (never
widened), and a scale byte 255 (e8m0's NaN) is a ``BadTensor`` naming the tensor, raised when it is read.

Tensors checked by shape: model.embed_tokens [V, H], lm_head [V, H] unless tied, model.hc_head.{hc_fn [S, S H],
hc_base [S], hc_scale [1]}, and per layer the attention's projections, its compressor / indexer (by the layer's
kind) and the router (``mlp.gate.tid2eid`` [V, k] on a hash layer, ``mlp.gate.e_score_correction_bias`` [E] on
the others).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.hf_dir import model_config, open_safetensors_dir
from bloomery_cli.formats.lazy import check_shapes
from bloomery_cli.formats.rope_scaling import rope_scaling_of
from bloomery_gates.errors import BadTensor
from bloomery_gates.registry import family
from bloomery_gates.spec import Deepseek4Spec, HCShape, LayerShape, MoEShape, RopeScaling, V4AttnShape

FAMILY = "deepseek4"
HF_KINDS = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa",
            "heavily_compressed_attention": "hca"}
RATIO_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
MLP_KINDS = {"hash_moe": "hash", "moe": "moe"}
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
SCALE = "_scale_inv"
CODE_DTYPES, SCALE_DTYPES = ("I8", "U8"), ("F8_E8M0", "U8")
E8M0_NAN = 255


def experts_fp4(top: Cfg, c: Cfg) -> bool:
    """Whether the routed experts are native FP4 (module docstring, "quant")."""
    where = c if c.get("quantization_config", None) is not None else top
    q = where.get("quantization_config", None)
    raw = c.get("expert_dtype", None)
    if q is not None:
        qc = where.sub("quantization_config")
        raw = qc.get("expert_dtype", raw if raw is not None else "fp8")
        if qc.get("quant_method", None) != "fp8":
            raise qc.bad("quant_method", f"{qc.get('quant_method', None)!r}; expected \"fp8\" (transformers' "
                                         "FineGrainedFP8Config, DeepSeek V4's FP4 experts)")
        if raw == "fp4" and qc.get("scale_fmt", "float") != "ue8m0":
            raise qc.bad("scale_fmt", f"{qc.get('scale_fmt', 'float')!r}; expected \"ue8m0\" (one e8m0 byte per "
                                      "32 FP4 weights)")
        key = "quantization_config.expert_dtype"
    else:
        key = "expert_dtype"
    if raw is None:
        return False
    if raw != "fp4":
        raise c.bad(key, f"{raw!r}; expected \"fp4\" (FP8 experts are not read here) or no quantization")
    return True


def packed_shapes(f: dict[str, Any], tensors: Any, fp4: bool) -> dict[str, Any]:
    """FP4: the shape table's entries for the packed experts and their scales (they replace the float ones). Float:
    nothing; an expert tensor stored packed is named (its config lacks the FP4 declaration)."""
    H, m = f["layer"].hidden_size, f["moe"]
    t: dict[str, Any] = {}
    for layer in range(f["num_layers"]):
        p = f"model.layers.{layer}."
        if not fp4:
            for name in (p + n for n in PACKED):
                if name in tensors and tensors.dtype_of(name) in CODE_DTYPES:
                    raise BadTensor(tensors.label(name), f"dtype {tensors.dtype_of(name)}: packed FP4 experts; "
                                                         "expected config expert_dtype (or quantization_config."
                                                         "expert_dtype) \"fp4\", or float experts")
            continue
        for name, rows, k in ((p + PACKED[0], 2 * m.expert_ff, H), (p + PACKED[1], H, m.expert_ff)):
            why = f"(layer {layer}: [n_routed_experts, {rows}, {k}] packed"
            t[name] = ((m.num_experts, rows, k // 2), why + ", two e2m1 codes a byte)")
            t[name + SCALE] = ((m.num_experts, rows, k // 32), why + ", one e8m0 scale per 32)")
    return t


def as_bytes(name: str, x: torch.Tensor) -> torch.Tensor:
    """A packed tensor as read: its uint8 bytes (I8 / F8_E8M0 viewed, never converted); scales checked."""
    b = x.view(torch.uint8)
    if name.endswith(SCALE) and bool((b == E8M0_NAN).any()):
        n = int((b == E8M0_NAN).sum())
        raise BadTensor(f"tensor {name}", f"{n} e8m0 scale byte(s) 255 (NaN); expected finite block scales 0..254")
    return b


def layer_kinds(c: Cfg, n: int) -> tuple[str, ...]:
    """layer_types, else the legacy compress_ratios, else V4's default (2 HCA, then CSA / HCA alternating)."""
    raw = c.get("layer_types", None)
    if raw is None and c.get("compress_ratios", None) is not None:
        ratios = c.get("compress_ratios")
        if not isinstance(ratios, list) or any(r not in RATIO_KINDS for r in ratios) or len(ratios) < n:
            raise c.bad("compress_ratios", f"{ratios!r}; expected >= {n} entries, each one of 0, 4, 128")
        raw = [RATIO_KINDS[r] for r in ratios[:n]]
    if raw is None:
        raw = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    if not isinstance(raw, list) or len(raw) != n or any(t not in HF_KINDS for t in raw):
        raise c.bad("layer_types", f"{raw!r}; expected {n} entries, each one of {list(HF_KINDS)}")
    return tuple(HF_KINDS[t] for t in raw)


def mlp_kinds(c: Cfg, n: int) -> tuple[str, ...]:
    raw = c.get("mlp_layer_types", None)
    if raw is None:
        k = c.int("num_hash_layers", 3, minimum=0)
        raw = ["hash_moe"] * min(n, k) + ["moe"] * max(0, n - k)
    if not isinstance(raw, list) or len(raw) != n or any(t not in MLP_KINDS for t in raw):
        raise c.bad("mlp_layer_types", f"{raw!r}; expected {n} entries, each one of {list(MLP_KINDS)}")
    return tuple(MLP_KINDS[t] for t in raw)


def rates(c: Cfg) -> tuple[int, int]:
    """(CSA rate, HCA rate)."""
    d = c.get("compress_rates", None)
    if d is not None:
        sub = c.sub("compress_rates")
        odd = sorted(set(sub.data) - {"compressed_sparse_attention", "heavily_compressed_attention"})
        if odd:
            raise c.bad(f"compress_rates.{odd[0]}", "not an attention kind; expected compressed_sparse_attention "
                                                    "or heavily_compressed_attention")
        return (sub.int("compressed_sparse_attention", 4, minimum=2),
                sub.int("heavily_compressed_attention", 128, minimum=1))
    return c.int("compress_rate_csa", 4, minimum=2), c.int("compress_rate_hca", 128, minimum=1)


def compress_scaling(c: Cfg) -> RopeScaling | None:
    """The compress rope's scaling: the flat rope_scaling / rope_parameters (partial_rotary_factor and
    rope_theta, read elsewhere, set aside) or the nested rope_parameters.compress; yarn's attention factor is 1
    unless given (V4 leaves cos / sin unscaled)."""
    keep = ("max_position_embeddings", "original_max_position_embeddings")
    data: dict[str, Any] = {k: c.data[k] for k in keep if k in c.data}
    rp = c.get("rope_parameters", None)
    if isinstance(rp, dict) and ("main" in rp or "compress" in rp):
        main = rp.get("main") or {}
        if (main.get("rope_type") or main.get("type") or "default") != "default":
            raise c.bad("rope_parameters.main", f"{main!r}; expected the default rope (V4's sliding layers)")
        data["rope_parameters"] = rp.get("compress") or {}
    else:
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(c.get(key, None), dict):
                data[key] = c.get(key)
    for key in ("rope_parameters", "rope_scaling"):
        if key in data:
            data[key] = {k: v for k, v in data[key].items() if k not in ("partial_rotary_factor", "rope_theta")}
    s = rope_scaling_of(Cfg(data, c.where, c.prefix))
    if s is not None and s.kind == "yarn" and s.attention_factor is None:
        s = RopeScaling(**{**s.__dict__, "attention_factor": 1.0})
    return s


def attn_shape(c: Cfg) -> V4AttnShape:
    heads, d = c.int("num_attention_heads"), c.int("head_dim")
    c.int("num_key_value_heads", 1, minimum=1, maximum=1, what="1 (V4's one shared K = V head)")
    if c.bool("attention_bias", False):
        raise c.bad("attention_bias", "true; expected false (V4's projections have no bias)")
    di = c.int("index_head_dim")
    if c.get("qk_rope_head_dim", None) is not None:
        r = c.int("qk_rope_head_dim", maximum=min(d, di), why="head_dim and index_head_dim")
    else:
        r = int(d * c.float("partial_rotary_factor", 64 / 512))
    if r % 2 or not 0 < r <= min(d, di):
        raise c.bad("qk_rope_head_dim", f"{r}; expected an even width in (0, {min(d, di)}]")
    groups = c.int("o_groups")
    if heads % groups:
        raise c.bad("o_groups", f"{groups} does not divide num_attention_heads {heads}")
    csa, hca = rates(c)
    return V4AttnShape(heads, d, r, c.int("q_lora_rank"), groups, c.int("o_lora_rank"), c.int("sliding_window"),
                       c.rope_base("rope_theta", 10000.0), c.rope_base("compress_rope_theta", 160000.0),
                       compress_scaling(c), csa, hca, c.int("index_n_heads"), di, c.int("index_topk"))


def read_shapes(c: Cfg, fp4: bool = False) -> dict[str, Any]:
    """Every number of a deepseek_v4 config (the keys above) as the spec's fields (``fp4``: the experts packed)."""
    n = c.int("num_hidden_layers")
    attn = attn_shape(c)
    if c.get("hidden_act", "silu") != "silu":
        raise c.bad("hidden_act", f"{c.get('hidden_act')!r}; expected \"silu\" (V4's clamped SwiGLU)")
    if c.bool("mlp_bias", False):
        raise c.bad("mlp_bias", "true; expected false (V4's experts have no bias)")
    if c.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise c.bad("scoring_func", f"{c.get('scoring_func')!r}; expected \"sqrtsoftplus\" (V4's router)")
    if not c.bool("norm_topk_prob", True):
        raise c.bad("norm_topk_prob", "false; V4 always renormalises its chosen weights (expected true)")
    e, k = c.int("n_routed_experts"), c.int("num_experts_per_tok")
    if k > e:
        raise c.bad("num_experts_per_tok", f"{k} is more than n_routed_experts {e}; expected <= {e}")
    ff = c.int("moe_intermediate_size")
    c.int("n_shared_experts", 1, minimum=1, maximum=1, what="1 (V4's one ungated shared expert)")
    if fp4:
        for key, v in (("hidden_size", c.int("hidden_size")), ("moe_intermediate_size", ff)):
            if v % 32:
                raise c.bad(key, f"{v}; FP4 experts hold whole blocks of 32 weights: expected a multiple of 32")
    moe = MoEShape(e, k, ff, ff, False, "sqrtsoftplus", 1, 1, True, c.float("routed_scaling_factor"))
    hc = HCShape(c.int("hc_mult", 4, minimum=2, what="the stream count"), 0, c.int("hc_sinkhorn_iters", 20),
                 c.float("hc_eps", 1e-6))
    layer = LayerShape(c.int("hidden_size"), attn.num_heads, 1, attn.head_dim, ff, c.float("rms_norm_eps"),
                       attn.rope_theta)
    return {"layer": layer, "num_layers": n, "layer_types": layer_kinds(c, n), "mlp_types": mlp_kinds(c, n),
            "attn": attn, "moe": moe, "hc": hc, "swiglu_limit": c.float("swiglu_limit", 10.0),
            "mtp_layers": c.int("num_nextn_predict_layers", 0, minimum=0), "experts_mxfp4": fp4}


def tensor_shapes(f: dict[str, Any], vocab: int, tied: bool) -> dict[str, Any]:
    """The shape table of every trunk tensor (name -> (shape, why))."""
    H, a, s, m = f["layer"].hidden_size, f["attn"], f["hc"].count, f["moe"]
    nd, hc = a.num_heads * a.head_dim, (2 + s) * s
    t: dict[str, Any] = {"model.embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]"),
                         "model.norm.weight": ((H,), "[hidden_size]"),
                         "model.hc_head.hc_fn": ((s, s * H), "[hc_mult, hc_mult*hidden_size]"),
                         "model.hc_head.hc_base": ((s,), "[hc_mult]"), "model.hc_head.hc_scale": ((1,), "[1]")}
    if not tied:
        t["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    for layer in range(f["num_layers"]):
        p, kind = f"model.layers.{layer}.", f["layer_types"][layer]
        q = p + "self_attn."
        rows = {q + "q_a_proj.weight": (a.q_lora_rank, H), q + "q_a_norm.weight": (a.q_lora_rank,),
                q + "q_b_proj.weight": (nd, a.q_lora_rank), q + "kv_proj.weight": (a.head_dim, H),
                q + "kv_norm.weight": (a.head_dim,), q + "o_a_proj.weight": (a.o_groups * a.o_lora_rank,
                                                                            nd // a.o_groups),
                q + "o_b_proj.weight": (H, a.o_groups * a.o_lora_rank), q + "sinks": (a.num_heads,),
                p + "attn_hc.fn": (hc, s * H), p + "ffn_hc.fn": (hc, s * H),
                p + "mlp.gate.weight": (m.num_experts, H),
                p + "mlp.experts.gate_up_proj": (m.num_experts, 2 * m.expert_ff, H),
                p + "mlp.experts.down_proj": (m.num_experts, H, m.expert_ff)}
        if kind != "sliding":
            c, rate = (2, a.csa_rate) if kind == "csa" else (1, a.hca_rate)
            cp = q + "compressor."
            rows |= {cp + "kv_proj.weight": (c * a.head_dim, H), cp + "position_bias": (rate, c * a.head_dim)}
            if kind == "csa":
                ip = cp + "indexer."
                rows |= {ip + "kv_proj.weight": (2 * a.index_head_dim, H),
                         ip + "position_bias": (rate, 2 * a.index_head_dim),
                         ip + "q_b_proj.weight": (a.index_heads * a.index_head_dim, a.q_lora_rank),
                         ip + "scorer.weights_proj.weight": (a.index_heads, H)}
        if f["mlp_types"][layer] == "hash":
            rows[p + "mlp.gate.tid2eid"] = (vocab, m.top_k)
        else:
            rows[p + "mlp.gate.e_score_correction_bias"] = (m.num_experts,)
        t |= {name: (shape, f"{list(shape)} (layer {layer}, {kind})") for name, shape in rows.items()}
    return t


def check_tables(tensors: Any, tables: dict[str, Any], where: Path, experts: int) -> None:
    """The hash tables (``mlp.gate.tid2eid`` [V, k]): present, that shape, an integer dtype (I32 / I64); their
    entries are checked when the engine or the reference reads them (an expert id outside [0, E))."""
    for name, (shape, why) in tables.items():
        if name not in tensors:
            raise BadTensor(f"{where}: tensor {name}", f"missing; expected shape {list(shape)} {why}")
        if tuple(tensors.shape_of(name)) != tuple(shape):
            raise BadTensor(f"{where}: tensor {name}", f"shape {list(tensors.shape_of(name))}, expected "
                                                       f"{list(shape)} {why}")
        if tensors.dtype_of(name) not in ("I32", "I64"):
            raise BadTensor(f"{where}: tensor {name}", f"dtype {tensors.dtype_of(name)}; expected I32 or I64 (a "
                                                       f"token -> expert table of {experts} experts)")


def deepseek4_from_hf(directory: Path) -> Deepseek4Spec:
    """A deepseek4 target from ``config.json`` + safetensors headers in ``directory`` (no weight is read)."""
    top, c = model_config(directory, family(FAMILY).hf_model_types)
    f = read_shapes(c, experts_fp4(top, c))
    vocab = c.int("vocab_size")
    tied = c.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False))
    tensors = open_safetensors_dir(directory)
    packed = packed_shapes(f, tensors, f["experts_mxfp4"])
    for name in packed:
        tensors.allow([name], SCALE_DTYPES if name.endswith(SCALE) else CODE_DTYPES, as_bytes)
    table = tensor_shapes(f, vocab, tied) | packed
    tables = {n: table.pop(n) for n in [n for n in table if n.endswith(".tid2eid")]}
    check_shapes(tensors, table, directory)
    check_tables(tensors, tables, directory, f["moe"].num_experts)
    return Deepseek4Spec(family=FAMILY, source=directory, source_format="hf", vocab_size=vocab,
                         tie_word_embeddings=tied, max_position=c.int("max_position_embeddings", 1 << 20),
                         tensors=tensors, **f)
