"""Each tensor's group (token_embd, output, attn, ffn_dense, router, ffn_exps_routed, ...)."""

from __future__ import annotations

from .model import (
    _HF_NEXTN_MARKERS,
    _HF_PREFIXES,
    BLOCK_DRAFT_ARCHS,
    BLOCK_DRAFT_GGUF,
    ModelInventory,
    TensorRow,
)

# ---------------------------------------------------------------------------------------------
# grouping


def _hf_strip(name: str) -> str:
    for p in _HF_PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def _block_of(m: ModelInventory, name: str) -> tuple[int | None, str]:
    """(block index, the rest of the name) for a trunk-block tensor; (None, stripped name) otherwise."""
    if m.fmt == "gguf":
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
            return int(parts[1]), parts[2]
        return None, name
    s = _hf_strip(name)
    parts = s.split(".", 2)
    if len(parts) == 3 and parts[0] in ("layers", "h", "blocks") and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None, s


def _is_routed(m: ModelInventory, rest: str) -> bool:
    if m.fmt == "gguf":
        return "_exps" in rest.split(".")[0]
    parts = rest.split(".")
    return "experts" in parts and not any("shared" in p for p in parts)


def _is_shexp(m: ModelInventory, rest: str) -> bool:
    if m.fmt == "gguf":
        return "_shexp" in rest.split(".")[0]
    return any(p.startswith("shared_expert") for p in rest.split("."))


def _ffn_norm(m: ModelInventory, rest: str) -> bool:
    head = rest.split(".")[0]
    if m.fmt == "gguf":
        return head in ("ffn_norm", "post_ffw_norm", "ffn_pre_norm", "ffn_post_norm")
    return head in ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
                    "pre_mlp_layernorm")


def _block_group(m: ModelInventory, rest: str, moe: bool, mixer_mlp: bool, mixer_attn: bool = True) -> str:
    if _is_shexp(m, rest):
        return "ffn_shexp"
    if _is_routed(m, rest):
        return "ffn_exps_routed"
    parts = rest.split(".")
    head = parts[0]
    if _ffn_norm(m, rest):
        return "router" if moe else "ffn_dense"
    if m.fmt == "gguf":
        if head == "attn_norm" and not mixer_attn:   # nemotron_h: an FFN-only block's one pre-norm (as HF's "norm")
            return "router" if moe else "ffn_dense"
        if head.startswith("ffn_gate_inp") or head.startswith("exp_probs"):
            return "router"
        if head.startswith("ffn_") or head.startswith("channel_mix"):
            return "ffn_dense"
        if head.startswith(("attn_", "ssm_", "time_mix", "post_attention_norm", "indexer", "conv", "shortconv")):
            return "attn"
        return "other"
    if "e_score_correction_bias" in parts or "router" in parts or (
            moe and len(parts) == 3 and parts[1] == "gate" and head in ("mlp", "mixer", "block_sparse_moe",
                                                                        "feed_forward", "moe")):
        return "router"
    if head in ("mlp", "feed_forward", "block_sparse_moe", "moe", "mlp_conv", "ffn"):
        return "ffn_dense"
    if head == "mixer":  # nemotron_h: LatentMoE's latent projections run for every token, beside the experts
        return "ffn_dense" if parts[1] in ("up_proj", "down_proj", "gate_proj", "fc1_latent_proj",
                                           "fc2_latent_proj") else "attn"
    if head == "norm":  # nemotron_h style: the block's one pre-norm belongs to what the block holds
        return "router" if moe else "ffn_dense" if mixer_mlp else "attn"
    if head in ("input_layernorm", "self_attn", "linear_attn", "attention", "attn", "attention_conv",
                "temporal_block", "conv", "ln_1"):
        return "attn"
    return "other"


def _top_group(m: ModelInventory, stripped: str) -> str:
    if m.fmt == "gguf":
        if stripped.startswith(("token_embd", "per_layer_token_embd")):
            return "token_embd"
        if stripped.split(".")[0] in ("output", "output_norm"):
            return "output"
        return "other"
    head = stripped.split(".")[0]
    if head in ("mtp", "mtp_layers"):
        return "mtp_nextn"
    if head in ("embed_tokens", "embeddings", "wte", "tok_embeddings", "word_embeddings"):
        return "token_embd"
    if head in ("lm_head", "norm", "norm_f", "final_layernorm", "ln_f"):
        return "output"
    return "other"


def _classify(m: ModelInventory) -> None:
    blocks: dict[int, list[tuple[TensorRow, str]]] = {}
    for t in m.tensors:
        b, rest = _block_of(m, t.name)
        t.block = b
        if b is None:
            t.group = _top_group(m, rest)
        else:
            blocks.setdefault(b, []).append((t, rest))
    # which blocks are the MTP / NextN layer
    mtp: dict[int, str] = {}
    if m.fmt == "gguf":
        if m.block_count is not None and m.nextn_layers:
            first = m.block_count - m.nextn_layers
            for b in blocks:
                if b >= first:
                    mtp[b] = (f"block {b} >= {m.arch}.block_count {m.block_count} - "
                              f"{m.arch}.nextn_predict_layers {m.nextn_layers}")
        for b, rows in blocks.items():
            if b not in mtp and any(rest.startswith("nextn.") for _, rest in rows):
                mtp[b] = f"block {b} holds blk.{b}.nextn.* tensors"
    else:
        for b, rows in blocks.items():
            if m.block_count is not None and b >= m.block_count and not _block_draft_kind(m):
                mtp[b] = f"layer {b} >= num_hidden_layers {m.block_count}"
            elif any(rest.split(".")[0] in _HF_NEXTN_MARKERS for _, rest in rows):
                mtp[b] = f"layer {b} holds enorm/hnorm/eh_proj (DeepSeek/GLM NextN layout)"
    m.mtp_blocks = sorted(mtp)
    m.mtp_why = "; ".join(mtp[b] for b in m.mtp_blocks)
    for b, rows in blocks.items():
        if b in mtp:
            for t, _ in rows:
                t.group = "mtp_nextn"
            continue
        moe = any(_is_routed(m, rest) for _, rest in rows)
        mixer_mlp = any(rest.startswith(("mixer.up_proj", "mixer.down_proj")) for _, rest in rows)
        mixer_attn = any(rest.startswith(("attn_q", "attn_k", "attn_v", "attn_output", "ssm_", "time_mix", "conv",
                                          "shortconv", "indexer")) for _, rest in rows)
        if moe:
            m.moe_blocks.append(b)
        for t, rest in rows:
            t.group = _block_group(m, rest, moe, mixer_mlp, mixer_attn)
    m.moe_blocks.sort()


def _block_draft_kind(m: ModelInventory) -> str | None:
    if m.fmt == "gguf":
        return BLOCK_DRAFT_GGUF.get((m.arch or "").lower())
    for a in m.architectures:
        kind = BLOCK_DRAFT_ARCHS.get(a.lower())
        if kind:
            return kind
        low = a.lower()
        if "dspark" in low:
            return "dspark"
        if "dflash2" in low:
            return "dflash2"
        if "dflash" in low:
            return "dflash"
    spec = m.meta.get("speculators_model_type")
    if isinstance(spec, str) and spec.lower() in ("dflash", "dflash2", "dspark"):
        return spec.lower()
    return None
