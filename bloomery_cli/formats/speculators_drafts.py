"""DFlash, DFlash2 and DSpark drafters in the speculators layout -> the z-lab / DeepSpec readers' specs.

The shared config keys, the layer-id rule (aux_hidden_state_layer_ids a -> target layer id a - 1) and the
tensor checks are ``formats.speculators``'. What each kind adds, with speculators 0.9.0's defaults:

    dflash   (speculators_model_type "dflash"):  nothing; B >= 2, B-1 drafts per block (sample_from_anchor false)
    dflash2  ("dflash2"): conv_kernel_size T (2, 1 <= T <= B), conv_group_size g (16, divides H),
             selector_rank r (256), selector_top_k K (16, 2 <= K <= V). speculators' DFlash2 has no
             output_multiplier / final_logit_softcapping / input_embedding_scale: the spec gets 1, none, 1
             (and those keys, not being speculators keys, are refused)
    dspark   ("dspark"): markov_rank r (256; 0 = no Markov head), markov_head_type ("vanilla": logits_k +=
             W2 W1[prev_k], W1 = markov_w1 [V, r] an embedding, W2 = markov_w2 [V, r] a linear's weight, the
             math the kernels run; "gated" and "rnn", which speculators and DeepSpec define, are refused),
             enable_confidence_head (TRUE: speculators' default, so a config that omits the key has the head),
             confidence_head_with_markov (true: the head reads [h_k ; W1[prev_k]]; false is built only with
             r = 0, where both read h_k alone; speculators itself refuses true with r = 0), B >= 1, B drafts
             (sample_from_anchor true)

Tensors, per kind, the same names and shapes as the z-lab / DeepSpec layouts (``backbone_shapes``,
``conv_tensor_shapes``, ``selector_tensor_shapes``, markov_head.markov_w{1,2}.weight [V, r],
confidence_head.proj.weight [1, H + r] and .bias [1]).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.formats.dflash import backbone_shapes
from bloomery_cli.formats.dflash2 import conv_tensor_shapes, selector_tensor_shapes
from bloomery_cli.formats.speculators import SpecConfig, check_tensors, read_config_checked
from bloomery_gates.spec import DFlash2Spec, DFlashSpec, DSparkSpec, ModelSpec

DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DSPARK_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")
BUILT_MARKOV_HEADS = ("vanilla",)
DEFINED_MARKOV_HEADS = ("vanilla", "gated", "rnn")


def _backbone(sc: SpecConfig, target: ModelSpec):
    return backbone_shapes(target.hidden_size, len(sc.target_layer_ids), sc.num_layers, sc.layer)


def dflash_from_speculators(directory: Path, target: ModelSpec) -> DFlashSpec:
    """A speculators "dflash" drafter, checked to fit ``target``."""
    sc = read_config_checked(directory, "dflash", target, (), min_block=2)
    tensors = check_tensors(sc, _backbone(sc, target), target, directory)
    return DFlashSpec(kind="dflash", source=directory, layer=sc.layer, num_layers=sc.num_layers,
                      block_size=sc.block_size, mask_token_id=sc.mask_token_id, target_layer_ids=sc.target_layer_ids,
                      vocab_size=target.vocab_size, tensors=tensors, windows=sc.windows, window_rule=sc.window_rule)


def dflash2_from_speculators(directory: Path, target: ModelSpec) -> DFlash2Spec:
    """A speculators "dflash2" drafter, checked to fit ``target``."""
    sc = read_config_checked(directory, "dflash2", target, DFLASH2_KEYS, min_block=2)
    cfg, H, V, B = sc.cfg, target.hidden_size, target.vocab_size, sc.block_size
    t = cfg.int("conv_kernel_size", 2, what="the conv kernel size T")
    if t > B:
        raise cfg.bad("conv_kernel_size", f"{t}; expected 1 <= conv_kernel_size <= block_size {B}")
    g = cfg.int("conv_group_size", 16, what="the conv group size g")
    if H % g:
        raise cfg.bad("conv_group_size", f"{g} does not divide hidden_size {H}; expected a divisor of {H}")
    r = cfg.int("selector_rank", 256, what="the selector rank r")
    k = cfg.int("selector_top_k", 16, what="the selector top-K", minimum=2)
    if k > V:
        raise cfg.bad("selector_top_k", f"{k}; expected 2 <= selector_top_k <= vocab size {V}")
    shapes = {**_backbone(sc, target), **selector_tensor_shapes(V, H, r)}
    for i in range(sc.num_layers):
        shapes.update(conv_tensor_shapes(f"layers.{i}.", t, H, g))
    tensors = check_tensors(sc, shapes, target, directory)
    return DFlash2Spec(kind="dflash2", source=directory, layer=sc.layer, num_layers=sc.num_layers, block_size=B,
                       mask_token_id=sc.mask_token_id, target_layer_ids=sc.target_layer_ids, vocab_size=V,
                       conv_kernel_size=t, conv_group_size=g, selector_rank=r, selector_top_k=k, tensors=tensors)


def dspark_from_speculators(directory: Path, target: ModelSpec) -> DSparkSpec:
    """A speculators "dspark" drafter, checked to fit ``target``."""
    sc = read_config_checked(directory, "dspark", target, DSPARK_KEYS, min_block=1)
    cfg, H, V = sc.cfg, target.hidden_size, target.vocab_size
    rank = cfg.int("markov_rank", 256, what="the Markov head rank r (0: no Markov head)", minimum=0)
    head = cfg.get("markov_head_type", "vanilla")
    if head not in BUILT_MARKOV_HEADS:
        what = "defined by speculators and DeepSpec but not built here" if head in DEFINED_MARKOV_HEADS else \
            f"not a speculators Markov head type ({', '.join(DEFINED_MARKOV_HEADS)})"
        raise cfg.bad("markov_head_type", f"{head!r}: {what}; built: {', '.join(BUILT_MARKOV_HEADS)}")
    conf = cfg.bool("enable_confidence_head", True)
    with_markov = cfg.bool("confidence_head_with_markov", True)
    if conf and with_markov and rank == 0:
        raise cfg.bad("confidence_head_with_markov", "true with markov_rank 0: the head would read W1[prev] of no "
                                                     "Markov head (speculators refuses it too); expected false")
    if conf and not with_markov and rank > 0:
        raise cfg.bad("confidence_head_with_markov", f"false with markov_rank {rank}: a confidence head over h_k "
                                                     "alone is not built (it reads [h_k ; W1[prev_k]]); expected true")
    shapes = _backbone(sc, target)
    if rank:
        for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
            shapes[name] = ((V, rank), f"[vocab_size, markov_rank] (markov_rank {rank})")
    if conf:
        shapes["confidence_head.proj.weight"] = ((1, H + rank), f"[1, hidden_size + markov_rank] ({H} + {rank})")
        shapes["confidence_head.proj.bias"] = ((1,), "[1]")
    tensors = check_tensors(sc, shapes, target, directory)
    return DSparkSpec(kind="dspark", source=directory, layer=sc.layer, num_layers=sc.num_layers,
                      block_size=sc.block_size, mask_token_id=sc.mask_token_id, target_layer_ids=sc.target_layer_ids,
                      vocab_size=V, markov_rank=rank, markov_head_type=head, confidence=conf, tensors=tensors)
