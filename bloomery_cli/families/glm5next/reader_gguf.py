"""glm5next targets from a llama.cpp GGUF (arch ``glm5-next``; docs/FAMILIES_MOE.md 4.3): ``Glm5NextSpec`` whose
tensors are renamed to the HF checkpoint's names (``gguf_names``; the KDA convolutions' thirds, MLA's k_b / v_b and
the experts' gate / up halves joined back), so the engine, the reference, transformers and the NextN draft run it.
Keys under ``glm5-next.``, each read and range-checked or refused by name (exit 2):

    block_count = trunk + nextn_predict_layers; embedding_length H; context_length; feed_forward_length (dense)
    attention.{head_count, head_count_kv (per block: 0 KDA, 1 MLA; the NextN blocks MLA), layer_norm_rms_epsilon,
        key_length_mla, value_length_mla, q_lora_rank, kv_lora_rank, key_length = value_length = kv_lora_rank}
    ssm.conv_kernel, kda.head_dim, kda.gate_lower_bound (< 0)           (KDA heads = attention.head_count)
    expert_{count, used_count, feed_forward_length, shared_count, weights_scale, weights_norm,
        gating_func (2, sigmoid; default 2), group_count, group_used_count (optional: llama.cpp's loader reads
        them for every arch and build_moe_ffn keeps the best groups; docs/ORACLES.md)}, leading_dense_block_count
    attention.indexer.{head_count, key_length, top_k, kpool (> 1, divides top_k), kpool_select_tail, types
        (per block "full" / "shared", or the converter's booleans, true = full; the first indexed block full)}
    hyper_connection.{count = 4 (llama.cpp asserts it), sinkhorn_iterations, epsilon}; swiglu_clamp_exp (per block)

Tensors (numpy order): token_embd [V, H], output [V, H] (or tied), output_norm [H]; per trunk block
hc_{attn,ffn}_{fn, base, scale}; MLA blocks attn_q_a [q_lora, H], attn_q_b [heads nope, q_lora],
attn_kv_a_mqa [kv_lora, H], attn_k_b, attn_v_b, attn_output; KDA blocks attn_{q,k,v}, ssm_a, ssm_conv1d_q;
sparse blocks ffn_gate_inp [E, H], ffn_{gate,up}_exps [E, ff, H], ffn_down_exps [E, H, ff]; dense ones
ffn_{gate,up,down}. NextN blocks: nextn.{eh_proj [H, 2H], enorm [H], hnorm [H]} and the MLA stems, and no hc_*
tensor (the NextN block has no mHC).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.gguf_file import GGUFFile
from bloomery_cli.formats.joined import Joined
from bloomery_cli.formats.lazy import LazyTensors, check_shapes
from bloomery_gates.errors import BadTensor
from bloomery_gates.registry import family
from bloomery_gates.spec import DSAShape, Glm5NextSpec, HCShape, KDAShape, LayerShape, MLAShape, MoEShape

from ..qwen35moe.reader import FusedGateUp
from ..qwen38.reader import MappedTensors
from .gguf_names import hf_table
from .reader import dsa_types

FAMILY = "glm5next"
A = "glm5-next."
HC_PARTS = tuple(f"hc_{p}_{w}" for p in ("attn", "ffn") for w in ("fn", "base", "scale"))


def read_keys(c: Cfg) -> dict[str, Any]:
    blocks = c.int(A + "block_count")
    nextn = c.int(A + "nextn_predict_layers", 0, minimum=0, maximum=blocks - 1, why="block_count - 1")
    n = blocks - nextn
    H, heads = c.int(A + "embedding_length"), c.int(A + "attention.head_count")
    kvs = c.get(A + "attention.head_count_kv", what=f"{blocks} per-block counts, 0 (KDA) or 1 (MLA)")
    if not isinstance(kvs, list) or len(kvs) != blocks or any(x not in (0, 1) for x in kvs) or 0 in kvs[n:]:
        raise c.bad(A + "attention.head_count_kv", f"{kvs!r}; expected {blocks} entries, 0 (KDA) or 1 (MLA), "
                                                   "the NextN blocks 1")
    types = tuple("indexed_attention" if x else "linear_attention" for x in kvs[:n])
    kv_lora = c.int(A + "attention.kv_lora_rank")
    for key in ("attention.key_length", "attention.value_length"):
        c.int(A + key, minimum=kv_lora, maximum=kv_lora, what=f"kv_lora_rank {kv_lora} (the cache holds the latent)")
    mla = MLAShape(heads, c.int(A + "attention.q_lora_rank"), kv_lora, c.int(A + "attention.key_length_mla"),
                   c.int(A + "attention.value_length_mla"))
    lb = c.float(A + "kda.gate_lower_bound", positive=False)
    if lb >= 0:
        raise c.bad(A + "kda.gate_lower_bound", f"{lb}; expected a number < 0")
    kda = KDAShape(heads, c.int(A + "kda.head_dim"), c.int(A + "ssm.conv_kernel"), lb)
    lead = c.int(A + "leading_dense_block_count", 0, minimum=0, maximum=n, why="the trunk's blocks")
    mlp = tuple("dense" if i < lead else "sparse" for i in range(n))
    e, k = c.int(A + "expert_count"), c.int(A + "expert_used_count")
    if k > e:
        raise c.bad(A + "expert_used_count", f"{k} is more than expert_count {e}; expected <= {e}")
    c.int(A + "expert_gating_func", 2, minimum=2, maximum=2, what="2 (sigmoid)")
    ff, shared = c.int(A + "expert_feed_forward_length"), c.int(A + "expert_shared_count", 1, minimum=0)
    groups = c.int(A + "expert_group_count", 0, minimum=0) or 1          # llama.cpp's loader reads both keys for
    used = c.int(A + "expert_group_used_count", 0, minimum=0) or 1        # every arch; build_moe_ffn applies them
    if groups > 1 and (e % groups or not 0 < used < groups or used * (e // groups) < k):
        raise c.bad(A + "expert_group_used_count", f"{used} of {groups} groups of {e} experts; expected a divisor "
                    f"of expert_count, 0 < used < groups, and room for expert_used_count {k}")
    moe = MoEShape(e, k, ff, ff * shared or None, False, "sigmoid", groups, used if groups > 1 else 1,
                   c.bool(A + "expert_weights_norm", True), c.float(A + "expert_weights_scale"))
    topk, kpool = c.int(A + "attention.indexer.top_k"), c.int(A + "attention.indexer.kpool", minimum=2)
    if topk % kpool:
        raise c.bad(A + "attention.indexer.top_k", f"{topk} is not a multiple of attention.indexer.kpool {kpool}")
    raw = c.get(A + "attention.indexer.types", what=f"{blocks} entries, full or shared")
    if isinstance(raw, list) and raw and all(isinstance(x, bool) for x in raw):     # the converter: true = full
        raw = ["full" if x else "shared" for x in raw]
    dsa = DSAShape(c.int(A + "attention.indexer.head_count"), c.int(A + "attention.indexer.key_length"), topk, kpool,
                   c.bool(A + "attention.indexer.kpool_select_tail", True),
                   dsa_types(c, "attention.indexer.types", raw[:n] if isinstance(raw, list) else raw, types))
    hc = HCShape(c.int(A + "hyper_connection.count", minimum=4, maximum=4, what="4 (llama.cpp asserts it)"), 0,
                 c.int(A + "hyper_connection.sinkhorn_iterations"), c.float(A + "hyper_connection.epsilon"))
    clamp = c.get(A + "swiglu_clamp_exp", what=f"{blocks} per-block limits")
    if not isinstance(clamp, list) or len(clamp) != blocks or not all(isinstance(x, int | float) for x in clamp):
        raise c.bad(A + "swiglu_clamp_exp", f"{clamp!r}; expected {blocks} numbers")
    limit = max(clamp) if clamp else 0.0
    if not limit > 0:
        raise c.bad(A + "swiglu_clamp_exp", f"{clamp!r}; expected a positive limit")
    layer = LayerShape(H, heads, heads, mla.qk_nope_head_dim, c.int(A + "feed_forward_length"),
                       c.float(A + "attention.layer_norm_rms_epsilon"), 0.0)
    return {"layer": layer, "num_layers": n, "layer_types": types, "mlp_types": mlp, "mla": mla, "dsa": dsa,
            "kda": kda, "moe": moe, "hc": hc, "swiglu_limit": float(limit), "nextn_layers": nextn}


def tensor_table(f: dict[str, Any], V: int, tied: bool) -> dict[str, Any]:
    """name -> (shape, why) checked exactly, or None checked present."""
    L, m, moe = f["layer"], f["mla"], f["moe"]
    H, n = L.hidden_size, f["num_layers"]
    s: dict[str, Any] = {"token_embd.weight": ((V, H), "[vocab, H]"), "output_norm.weight": ((H,), "[H]")}
    if not tied:
        s["output.weight"] = ((V, H), "[vocab, H]")
    E, ff = moe.num_experts, moe.expert_ff
    mla_t = {"attn_q_a.weight": ((m.q_lora_rank, H), "[q_lora_rank, H]"),
             "attn_q_b.weight": ((m.num_heads * m.qk_nope_head_dim, m.q_lora_rank), "[heads*key_length_mla, q_lora]"),
             "attn_kv_a_mqa.weight": ((m.kv_lora_rank, H), "[kv_lora_rank, H]"),
             "attn_k_b.weight": None, "attn_v_b.weight": None, "attn_output.weight": None}
    moe_t = {"ffn_gate_inp.weight": ((E, H), "[expert_count, H]"),
             "ffn_gate_exps.weight": ((E, ff, H), "[expert_count, expert_ff, H]"),
             "ffn_up_exps.weight": ((E, ff, H), "[expert_count, expert_ff, H]"),
             "ffn_down_exps.weight": ((E, H, ff), "[expert_count, H, expert_ff]")}
    for i in range(n + f["nextn_layers"]):
        p = f"blk.{i}."
        if i >= n:
            s.update({p + "nextn.eh_proj.weight": ((H, 2 * H), "[H, 2H]"), p + "nextn.enorm.weight": ((H,), "[H]"),
                      p + "nextn.hnorm.weight": ((H,), "[H] (fed norm(mean of the streams))")})
        else:
            s.update({f"{p}{x}.weight": None for x in HC_PARTS})
        if i >= n or f["layer_types"][i] == "indexed_attention":
            s.update({p + k: v for k, v in mla_t.items()})
        else:
            s.update({p + x: None for x in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ssm_a",
                                            "ssm_conv1d_q.weight")})
        if i >= n or f["mlp_types"][i] == "sparse":
            s.update({p + k: v for k, v in moe_t.items()})
        else:
            s.update({p + x: None for x in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")})
    return s


def glm5next_from_gguf(path: Path) -> Glm5NextSpec:
    """A glm5next target from a llama.cpp GGUF's keys and tensor infos (no tensor data is read)."""
    g = GGUFFile(path)
    c = Cfg({k: g.meta(k) for k in g.meta_keys()}, g.path)
    arch = c.get("general.architecture", what=str(list(family(FAMILY).gguf_archs)))
    if arch not in family(FAMILY).gguf_archs:
        raise c.bad("general.architecture", f"{arch!r}; expected one of {list(family(FAMILY).gguf_archs)}")
    f = read_keys(c)
    tensors = g.tensors(rename=lambda x: x)
    if "token_embd.weight" not in tensors:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [vocab, H]")
    V, tied = tensors.shape_of("token_embd.weight")[0], "output.weight" not in tensors
    table = tensor_table(f, V, tied)
    n = f["num_layers"]
    for i in range(n, n + f["nextn_layers"]):
        stray = next((x for x in tensors if x.startswith(f"blk.{i}.hc_")), None)
        if stray:
            raise BadTensor(f"{path}: tensor {stray}", "present; the NextN block has no mHC (plain residual)")
    for name, want in table.items():
        if want is None and name not in tensors:
            raise BadTensor(f"{path}: tensor {name}", "missing")
    check_shapes(tensors, {k: v for k, v in table.items() if v is not None}, path)
    joined = joins(FusedGateUp(tensors))
    return Glm5NextSpec(family=FAMILY, source=Path(path), source_format="gguf", vocab_size=V, tie_word_embeddings=tied,
                        max_position=c.int(A + "context_length"),
                        tensors=MappedTensors(joined, hf_table(list(joined))), **f)


def joins(inner: LazyTensors) -> Joined:
    """The GGUF's split tensors joined back into HF's: ssm_conv1d_{q,k,v} -> ssm_conv1d_qkv [3d, 1, K];
    attn_k_b [h, kv_lora, nope] + attn_v_b [h, v, kv_lora] -> attn_kv_b [h (nope + v), kv_lora]."""
    def conv(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([x.reshape(-1, 1, x.shape[-1]) for x in xs], 0)

    def kv_b(xs: list[torch.Tensor]) -> torch.Tensor:
        k, v = xs
        return torch.cat([k.transpose(1, 2), v], 1).reshape(-1, k.shape[1])

    j: dict = {}
    for n in inner:
        if n.endswith("ssm_conv1d_q.weight"):
            j[n.replace("_q.", "_qkv.")] = ((n, n.replace("_q.", "_k."), n.replace("_q.", "_v.")), conv)
        elif n.endswith("attn_k_b.weight"):
            j[n.replace("attn_k_b", "attn_kv_b")] = ((n, n.replace("attn_k_b", "attn_v_b")), kv_b)
    return Joined(inner, j)
