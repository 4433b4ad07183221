"""glm5next targets from an HF directory (model_type ``glm5_next``, the text model; docs/FAMILIES_MOE.md 4.3):
``Glm5NextSpec``. Numbers from ``text_config`` when the file is the conditional-generation wrapper. Keys, each
read and range-checked or refused by name (exit 2):

    size       hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (= heads), vocab_size,
               intermediate_size (the dense layers), rms_norm_eps, max_position_embeddings, tie_word_embeddings
    kinds      layer_types (linear_attention | indexed_attention, or its alias deepseek_sparse_attention;
               default idx % 4 == 3 indexed), mlp_layer_types
               (dense | sparse; default 3 dense then sparse)
    MLA        q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim, qk_rope_head_dim = 0 (NoPE)
    DSA        index_topk, index_head_dim, index_n_heads, index_kpool (> 1, divides index_topk),
               index_kpool_always_select_tail, indexer_types (full | shared per indexed layer; the first full)
    KDA        linear_head_dim, linear_num_heads (= num_attention_heads), linear_conv_kernel_dim,
               linear_lower_bound (< 0); or nested, linear_attn_config {head_dim, num_heads,
               short_conv_kernel_size, gate_lower_bound}
    router     scoring_func = sigmoid and mla_use_nope = true where present
    experts    n_routed_experts, num_experts_per_tok, n_shared_experts, moe_intermediate_size,
               routed_scaling_factor, n_group (divides the experts), topk_group <= n_group, norm_topk_prob,
               swiglu_limit
    mHC        hc_mult >= 2, hc_sinkhorn_iters >= 1, hc_eps > 0
    NextN      num_nextn_predict_layers (the blocks after the trunk, model.layers.{n + j})

Tensors checked by shape: model.embed_tokens [V, H], lm_head [V, H] unless tied, and per NextN block
model.layers.{k}.{eh_proj [H, 2H], enorm [H], hnorm [H]} (hnorm is [H]: the head is fed norm(mean of the streams)).
The trunk's MLA / KDA / mHC HF names are not in the design notes' HF column, so they are not checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.hf_dir import model_config, open_safetensors_dir
from bloomery_cli.formats.lazy import check_shapes
from bloomery_gates.registry import family
from bloomery_gates.spec import DSAShape, Glm5NextSpec, HCShape, KDAShape, LayerShape, MLAShape, MoEShape

FAMILY = "glm5next"
KINDS = ("linear_attention", "indexed_attention")
MLP_KINDS = ("dense", "sparse")


def _kinds(c: Cfg, key: str, n: int, allowed: tuple[str, ...], default: list[str]) -> tuple[str, ...]:
    v = c.get(key, default)
    if not isinstance(v, list) or len(v) != n or any(t not in allowed for t in v):
        raise c.bad(key, f"{v!r}; expected {n} entries, each one of {list(allowed)}")
    return tuple(v)


def dsa_types(c: Cfg, key: str, raw: Any, types: tuple[str, ...]) -> tuple[str, ...]:
    """Per layer "full" / "shared" / "" (KDA); ``raw`` one entry per layer (the KDA ones ignored)."""
    n = len(types)
    if not isinstance(raw, list) or len(raw) != n or any(t not in ("full", "shared") for t in raw):
        raise c.bad(key, f"{raw!r}; expected {n} entries, each full or shared")
    out = tuple(t if k == "indexed_attention" else "" for t, k in zip(raw, types, strict=True))
    first = next((t for t in out if t), "full")
    if first != "full":
        raise c.bad(key, f"{raw!r}: the first indexed layer is shared; expected full (a shared layer reuses the "
                         "previous full layer's choice)")
    return out


def kda_shape(c: Cfg, heads: int) -> KDAShape:
    """The flat linear_* keys, or the nested linear_attn_config {num_heads, head_dim, gate_lower_bound,
    short_conv_kernel_size} (the key names of a published glm5_next text config)."""
    if c.get("linear_attn_config", None) is not None:
        n = c.sub("linear_attn_config")
        names = ("num_heads", "head_dim", "short_conv_kernel_size", "gate_lower_bound")
    else:
        n, names = c, ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim", "linear_lower_bound")
    lb = n.float(names[3], -5.0, positive=False)
    if lb >= 0:
        raise n.bad(names[3], f"{lb}; expected a number < 0 (the gate's lower bound)")
    return KDAShape(n.int(names[0], heads, minimum=heads, maximum=heads, what=f"num_attention_heads {heads}"),
                    n.int(names[1]), n.int(names[2]), lb)


def read_shapes(c: Cfg) -> dict[str, Any]:
    """Every number of a glm5_next text config (the keys above) as the spec's fields."""
    n = c.int("num_hidden_layers")
    heads = c.int("num_attention_heads")
    c.int("num_key_value_heads", heads, minimum=heads, maximum=heads, what=f"num_attention_heads {heads}")
    raw = c.get("layer_types", [KINDS[i % 4 == 3] for i in range(n)])
    if isinstance(raw, list):       # a published text config spells the MLA + DSA kind deepseek_sparse_attention
        raw = ["indexed_attention" if t == "deepseek_sparse_attention" else t for t in raw]
    types = _kinds(Cfg({**c.data, "layer_types": raw}, c.where, c.prefix), "layer_types", n, KINDS, raw)
    if c.get("scoring_func", "sigmoid") != "sigmoid":
        raise c.bad("scoring_func", f"{c.get('scoring_func')!r}; expected \"sigmoid\" (glm5_next's router)")
    if not c.bool("mla_use_nope", True):
        raise c.bad("mla_use_nope", "false; expected true (glm5_next's MLA has no RoPE)")
    mlp = _kinds(c, "mlp_layer_types", n, MLP_KINDS, [MLP_KINDS[i >= 3] for i in range(n)])
    c.int("qk_rope_head_dim", 0, minimum=0, maximum=0, what="0 (glm5_next is NoPE)")
    mla = MLAShape(heads, c.int("q_lora_rank"), c.int("kv_lora_rank"), c.int("qk_nope_head_dim"), c.int("v_head_dim"))
    topk, kpool = c.int("index_topk"), c.int("index_kpool", minimum=2)
    if topk % kpool:
        raise c.bad("index_topk", f"{topk} is not a multiple of index_kpool {kpool}")
    dsa = DSAShape(c.int("index_n_heads"), c.int("index_head_dim"), topk, kpool,
                   c.bool("index_kpool_always_select_tail", True),
                   dsa_types(c, "indexer_types", c.get("indexer_types", ["full"] * n), types))
    kda = kda_shape(c, heads)
    e, k = c.int("n_routed_experts"), c.int("num_experts_per_tok")
    if k > e:
        raise c.bad("num_experts_per_tok", f"{k} is more than n_routed_experts {e}; expected <= {e}")
    ng = c.int("n_group", 1)
    if e % ng:
        raise c.bad("n_group", f"{ng} does not divide n_routed_experts {e}")
    tg = c.int("topk_group", 1, maximum=ng, why="n_group")
    ff, shared = c.int("moe_intermediate_size"), c.int("n_shared_experts", 1, minimum=0)
    moe = MoEShape(e, k, ff, ff * shared or None, False, "sigmoid", ng, tg, c.bool("norm_topk_prob", True),
                   c.float("routed_scaling_factor"))
    hc = HCShape(c.int("hc_mult", minimum=2, what="the stream count"), 0, c.int("hc_sinkhorn_iters"),
                 c.float("hc_eps"))
    H = c.int("hidden_size")
    layer = LayerShape(H, heads, heads, mla.qk_nope_head_dim, c.int("intermediate_size"), c.float("rms_norm_eps"), 0.0)
    return {"layer": layer, "num_layers": n, "layer_types": types, "mlp_types": mlp, "mla": mla, "dsa": dsa,
            "kda": kda, "moe": moe, "hc": hc, "swiglu_limit": c.float("swiglu_limit"),
            "nextn_layers": c.int("num_nextn_predict_layers", 0, minimum=0)}


def glm5next_from_hf(directory: Path) -> Glm5NextSpec:
    """A glm5next target from ``config.json`` + safetensors headers in ``directory`` (no weight is read)."""
    top, c = model_config(directory, family(FAMILY).hf_model_types)
    f = read_shapes(c)
    H, n, vocab = f["layer"].hidden_size, f["num_layers"], c.int("vocab_size")
    tied = c.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False))
    tensors = open_safetensors_dir(directory)
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in tensors else "model."
    table: dict[str, Any] = {pre + "embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]")}
    if not tied:
        table["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    for j in range(f["nextn_layers"]):
        p = f"{pre}layers.{n + j}."
        table.update({p + "eh_proj.weight": ((H, 2 * H), "[hidden_size, 2*hidden_size]"),
                      p + "enorm.weight": ((H,), "[hidden_size]"), p + "hnorm.weight": ((H,), "[hidden_size]")})
    check_shapes(tensors, table, directory)
    return Glm5NextSpec(family=FAMILY, source=directory, source_format="hf", vocab_size=vocab,
                        tie_word_embeddings=tied, max_position=c.int("max_position_embeddings", 1 << 20),
                        tensors=tensors, **f)
