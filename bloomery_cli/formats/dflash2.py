"""DFlash2 block drafters (DRAFTERS.md section 3): ``DFlash2Spec`` from an HF directory.

config.json: architectures contains "DFlash2DraftModel"; the DFlash keys (see ``formats.dflash``:
Qwen3 layer keys, num_hidden_layers, block_size B >= 2, dflash_config.mask_token_id,
dflash_config.target_layer_ids or the default rule) plus, in dflash_config (or at the top level):

    conv_kernel_size T    1 <= T <= B            conv_group_size g    g >= 1 and g divides H
    selector_rank r       r >= 1                 selector_top_k K     2 <= K <= V
    output_multiplier     optional, > 0 (1)      final_logit_softcapping c   optional, > 0 (none)
    input_embedding_scale optional, > 0 (1)

Tensors: the DFlash ones (fc, hidden_norm, norm, layers.{i}.* as a Qwen3 layer), and with G = H / g
    layers.{i}.{attention_conv,mlp_conv}.base_kernel            [2, T, H]       (side in/out, tap, channel)
    layers.{i}.{attention_conv,mlp_conv}.kernel_projection.weight  [2*T*G, H]
    candidate_selector.hidden_projection.weight                  [r, H]
    candidate_selector.{predecessor,successor}_codebook          [V, r]
Every problem is a named ``BadConfig`` / ``BadTensor`` / ``Mismatch``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.dflash import (
    _block_size,
    backbone_shapes,
    feature_layer_ids,
    fit_block_draft,
    open_block_draft,
)
from bloomery_cli.formats.lazy import check_shapes, layer_bound
from bloomery_gates.spec import DFlash2Spec, ModelSpec

from ..families.qwen3.reader import Shapes, layer_shape_from_hf

ARCHITECTURE = "DFlash2DraftModel"
CONVS = ("attention_conv", "mlp_conv")


def _where(cfg: Cfg, dcfg: Cfg, key: str) -> Cfg | None:
    """The config object holding ``key`` (dflash_config first, then the top level); both must agree."""
    inner, top = dcfg.get(key, None), cfg.get(key, None)
    if inner is not None and top is not None and inner != top:
        raise dcfg.bad(key, f"{inner!r}, but the top-level {key} is {top!r}; expected one value")
    if inner is not None:
        return dcfg
    return cfg if top is not None else None


def _req_int(cfg: Cfg, dcfg: Cfg, key: str, what: str, minimum: int) -> int:
    src = _where(cfg, dcfg, key)
    if src is None:
        raise dcfg.bad(key, f"missing (also at the top level); expected {what}")
    return src.int(key, what=what, minimum=minimum)


def _bad(cfg: Cfg, dcfg: Cfg, key: str, problem: str):
    return (_where(cfg, dcfg, key) or dcfg).bad(key, problem)


def _opt_float(cfg: Cfg, dcfg: Cfg, key: str, default: Any) -> Any:
    src = _where(cfg, dcfg, key)
    return default if src is None else src.float(key, what="a positive number")


def conv_tensor_shapes(prefix: str, t: int, h: int, g: int) -> Shapes:
    """The two conv blocks of one draft layer (``prefix`` e.g. 'layers.0.')."""
    shapes: Shapes = {}
    for conv in CONVS:
        shapes[f"{prefix}{conv}.base_kernel"] = ((2, t, h), "[2, conv_kernel_size, hidden_size]")
        shapes[f"{prefix}{conv}.kernel_projection.weight"] = (
            (2 * t * (h // g), h), "[2*conv_kernel_size*hidden_size/conv_group_size, hidden_size]")
    return shapes


def selector_tensor_shapes(v: int, h: int, r: int) -> Shapes:
    return {
        "candidate_selector.hidden_projection.weight": ((r, h), "[selector_rank, hidden_size]"),
        "candidate_selector.predecessor_codebook": ((v, r), "[vocab_size, selector_rank]"),
        "candidate_selector.successor_codebook": ((v, r), "[vocab_size, selector_rank]"),
    }


def dflash2_from_hf(directory: Path, target: ModelSpec) -> DFlash2Spec:
    """A DFlash2 drafter from ``directory``, checked to fit ``target`` (``Mismatch`` naming both)."""
    cfg, tensors, dcfg = open_block_draft(directory, ARCHITECTURE)
    layer = layer_shape_from_hf(cfg)
    depth = cfg.int("num_hidden_layers", what="the draft depth", **layer_bound(tensors, "layers."))
    block = _block_size(cfg, dcfg)
    mask_id = dcfg.int("mask_token_id", what="the mask token id", minimum=0)
    H, V = target.hidden_size, target.vocab_size
    mismatch = fit_block_draft(directory, target, layer.hidden_size, cfg.int_opt("vocab_size"), mask_id,
                               cfg.int_opt("num_target_layers"), mask_key="dflash_config.mask_token_id")

    t = _req_int(cfg, dcfg, "conv_kernel_size", "the conv kernel size T", 1)
    if t > block:
        raise _bad(cfg, dcfg, "conv_kernel_size", f"{t}; expected 1 <= conv_kernel_size <= block_size {block}")
    g = _req_int(cfg, dcfg, "conv_group_size", "the conv group size g", 1)
    if H % g:
        raise _bad(cfg, dcfg, "conv_group_size", f"{g} does not divide hidden_size {H}; expected a divisor of {H}")
    r = _req_int(cfg, dcfg, "selector_rank", "the selector rank r", 1)
    k = _req_int(cfg, dcfg, "selector_top_k", "the selector top-K", 2)
    if k > V:
        raise _bad(cfg, dcfg, "selector_top_k", f"{k}; expected 2 <= selector_top_k <= vocab size {V}")
    mult = _opt_float(cfg, dcfg, "output_multiplier", 1.0)
    cap = _opt_float(cfg, dcfg, "final_logit_softcapping", None)
    emb_scale = _opt_float(cfg, dcfg, "input_embedding_scale", 1.0)

    ids = feature_layer_ids(directory, tensors, target, dcfg, mismatch, depth)
    shapes = {**backbone_shapes(H, len(ids), depth, layer), **selector_tensor_shapes(V, H, r)}
    for i in range(depth):
        shapes.update(conv_tensor_shapes(f"layers.{i}.", t, H, g))
    check_shapes(tensors, shapes, directory)
    return DFlash2Spec(
        kind="dflash2", source=directory, layer=layer, num_layers=depth, block_size=block,
        mask_token_id=mask_id, target_layer_ids=ids, vocab_size=V, conv_kernel_size=t, conv_group_size=g,
        selector_rank=r, selector_top_k=k, tensors=tensors, output_multiplier=mult,
        final_logit_softcapping=cap, input_embedding_scale=emb_scale,
    )
