"""DSpark block drafters (DeepSpec layout, DRAFTERS.md section 4): ``DSparkSpec`` from an HF directory.

config.json: architectures contains "Qwen3DSparkModel"; the Qwen3 layer keys of the draft stack
(hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
rope); num_hidden_layers = draft depth. The DSpark keys may sit at the top level or inside a
``dspark_config`` or ``dflash_config`` object (the same value twice is fine, two values are a
``BadConfig``): block_size (>= 1; B rows give B drafts), mask_token_id (required), target_layer_ids
(optional, DFlash's default rule over the draft depth when absent), markov_rank r (required, >= 0; 0 = no
Markov head), markov_head_type (required when r > 0, as DeepSpec requires it: "vanilla", DeepSpec's
VanillaMarkov, logits_k += W2 W1[prev_k], is built; "gated" and "rnn" are refused),
enable_confidence_head (required, as DeepSpec's model requires it: no default is assumed) and, when it is
true, confidence_head_with_markov (required: true with r > 0, the head reading [h_k ; W1[prev_k]]; false
with r = 0, h_k alone). Optional vocab_size / num_target_layers are checked against the target.

Tensors (H hidden, V vocab, n features): the DFlash set fc.weight [H, n*H], hidden_norm.weight [H],
norm.weight [H], layers.{i}.* (a Qwen3 layer); optional embed_tokens.weight [V, H] and
lm_head.weight [V, H] (the drafter's own copies, else the target's are used);
markov_head.markov_w1.weight [V, r] and markov_head.markov_w2.weight [V, r] when r > 0
(logits_k += W2 . W1[x_{k-1}]); confidence_head.proj.weight [1, H + r] and .bias [1] when the
confidence head is enabled (c_k = sigmoid(proj . [h_k ; W1[x_{k-1}]] + bias)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.dflash import backbone_shapes, feature_layer_ids, fit_block_draft
from bloomery_cli.formats.hf_dir import open_safetensors_dir, read_config
from bloomery_cli.formats.lazy import check_shapes, layer_bound
from bloomery_gates.spec import DSparkSpec, ModelSpec

from ..families.qwen3.reader import layer_shape_from_hf

ARCHITECTURE = "Qwen3DSparkModel"
BUILT_MARKOV_HEADS = ("vanilla",)
DEFINED_MARKOV_HEADS = ("vanilla", "gated", "rnn")      # DeepSpec's markov_head.py / speculators' MarkovHead
NESTED = ("dspark_config", "dflash_config")


def find_key(cfg: Cfg, key: str) -> Cfg | None:
    """The Cfg (top level, dspark_config or dflash_config) that holds ``key``; None if none does.

    Raises ``BadConfig`` when two places hold different values.
    """
    holders = [c for c in (cfg, *(cfg.sub(n) for n in NESTED)) if c.get(key, None) is not None]
    for other in holders[1:]:
        if other.get(key) != holders[0].get(key):
            raise other.bad(key, f"{other.get(key)!r}, but {holders[0].prefix}{key} is "
                                 f"{holders[0].get(key)!r}; expected one value")
    return holders[0] if holders else None


def _need(cfg: Cfg, key: str, what: str) -> Cfg:
    where = find_key(cfg, key)
    if where is None:
        raise cfg.bad(key, f"missing (also in {' / '.join(NESTED)}); expected {what}")
    return where


def _optional(cfg: Cfg, key: str, default: Any) -> Any:
    where = find_key(cfg, key)
    return default if where is None else where.get(key)


def dspark_from_hf(directory: Path, target: ModelSpec) -> DSparkSpec:
    """A DSpark drafter from ``directory``, checked to fit ``target`` (``Mismatch`` naming both)."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    tensors = open_safetensors_dir(directory)  # headers only
    archs = cfg.get("architectures", what=f'a list containing "{ARCHITECTURE}"')
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise cfg.bad("architectures", f"{archs!r}; expected a list containing \"{ARCHITECTURE}\"")
    layer = layer_shape_from_hf(cfg)
    depth = cfg.int("num_hidden_layers", what="the draft depth", **layer_bound(tensors, "layers."))
    block = _need(cfg, "block_size", "the block size B >= 1").int("block_size", minimum=1)
    mask_id = _need(cfg, "mask_token_id", "the mask token id").int("mask_token_id", minimum=0)
    rank = _need(cfg, "markov_rank", "the Markov head rank r >= 0 (0: no Markov head)").int("markov_rank", minimum=0)
    head_type = _optional(cfg, "markov_head_type", None)
    if rank > 0 and head_type is None:
        raise cfg.bad("markov_head_type", f"missing with markov_rank {rank} (DeepSpec requires it then); expected "
                                          f"one of: {', '.join(BUILT_MARKOV_HEADS)}")
    if rank > 0 and head_type not in BUILT_MARKOV_HEADS:
        where = find_key(cfg, "markov_head_type") or cfg
        what = "is defined by DeepSpec and speculators but not built" if head_type in DEFINED_MARKOV_HEADS else \
            f"is not a DeepSpec Markov head type ({', '.join(DEFINED_MARKOV_HEADS)})"
        raise where.bad("markov_head_type", f"{head_type!r} {what}; built Markov head types: "
                                            f"{', '.join(BUILT_MARKOV_HEADS)}")
    conf = _optional(cfg, "enable_confidence_head", None)
    if conf is None:
        raise cfg.bad("enable_confidence_head", f"missing (also in {' / '.join(NESTED)}); expected true or false "
                                                "(DeepSpec requires it; no default is assumed)")
    if not isinstance(conf, bool):
        raise (find_key(cfg, "enable_confidence_head") or cfg).bad("enable_confidence_head",
                                                                    f"{conf!r}; expected true or false")
    with_markov = _optional(cfg, "confidence_head_with_markov", None)
    if conf:
        where = find_key(cfg, "confidence_head_with_markov") or cfg
        if with_markov is None:
            raise cfg.bad("confidence_head_with_markov", "missing with enable_confidence_head true (DeepSpec "
                                                         "requires it then); expected true or false")
        if not isinstance(with_markov, bool):
            raise where.bad("confidence_head_with_markov", f"{with_markov!r}; expected true or false")
        if with_markov != (rank > 0):
            raise where.bad("confidence_head_with_markov",
                            f"{str(with_markov).lower()} with markov_rank {rank}: the head built reads [h_k ; "
                            f"W1[prev_k]] (r > 0) or h_k alone (r = 0); expected {str(rank > 0).lower()}")
    head_type = head_type or BUILT_MARKOV_HEADS[0]

    mismatch = fit_block_draft(directory, target, layer.hidden_size, cfg.int_opt("vocab_size"), mask_id,
                               _optional(cfg, "num_target_layers", None),
                               reads=" (the draft reads the target's features)")
    H, V = target.hidden_size, target.vocab_size

    ids = feature_layer_ids(directory, tensors, target, find_key(cfg, "target_layer_ids"), mismatch, depth)
    shapes = backbone_shapes(H, len(ids), depth, layer)
    for name in ("embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            shapes[name] = ((V, H), "[target vocab_size, hidden_size] (the drafter's own copy)")
    if rank > 0 or "markov_head.markov_w1.weight" in tensors:
        for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
            shapes[name] = ((V, rank), f"[target vocab_size, markov_rank] (markov_rank {rank})")
    if conf:
        shapes["confidence_head.proj.weight"] = ((1, H + rank), f"[1, hidden_size + markov_rank] ({H} + {rank})")
        shapes["confidence_head.proj.bias"] = ((1,), "[1]")
    check_shapes(tensors, shapes, directory)
    return DSparkSpec(
        kind="dspark", source=directory, layer=layer, num_layers=depth, block_size=block, mask_token_id=mask_id,
        target_layer_ids=ids, vocab_size=V, markov_rank=rank, markov_head_type=head_type, confidence=conf,
        tensors=tensors,
    )
