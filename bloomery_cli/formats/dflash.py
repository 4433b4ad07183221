"""DFlash block drafters (z-lab layout, DRAFTERS.md section 2): ``DFlashSpec`` from an HF directory.

config.json: architectures contains "DFlashDraftModel"; the usual Qwen3 layer keys (hidden_size,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope);
num_hidden_layers = draft depth; block_size at the top level or in dflash_config (>= 2);
dflash_config.mask_token_id (required); dflash_config.target_layer_ids (optional; default, z-lab's: with
n = num_hidden_layers (the draft depth), n == 1 -> [L // 2], else round(1 + i*(L-4)/(n-1)) for
i = 0..n-1, L = target layers; fc.weight must then have n*H columns); optional num_target_layers,
vocab_size (checked against the target).
dflash_config.causal true is refused. Sliding-window layers (``layer_types`` "sliding_attention",
``sliding_window``) are read by ``formats.sliding`` (vLLM's rule: causal, window W over absolute positions).

Tensors: fc.weight [H, n*H], hidden_norm.weight [H], norm.weight [H], and per draft layer i
layers.{i}.{input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
mlp.{gate,up,down}_proj}.weight, shapes as in a Qwen3 layer.

Target layer ids: id l means the OUTPUT of target layer l (HF ``hidden_states[l + 1]``); -1 the
embedding output (``hidden_states[0]``). Ids -1..L-1 are accepted. Caveat for l = L-1: HF's
``hidden_states[L]`` is taken after the final norm, while this harness's taps are pre-norm for every
layer (so that feature goes through the final norm); z-lab's default rule never picks L-1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.hf_dir import open_safetensors_dir, read_config
from bloomery_cli.formats.lazy import check_shapes, layer_bound
from bloomery_cli.formats.sliding import draft_windows
from bloomery_gates.errors import BadTensor, Mismatch
from bloomery_gates.spec import DFlashSpec, LayerShape, ModelSpec

from ..families.qwen3.reader import Shapes, layer_shape_from_hf, layer_tensor_shapes

ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(n: int, num_target_layers: int) -> tuple[int, ...]:
    """z-lab's rule: n == 1 -> (L // 2,), else round(1 + i*(L-4)/(n-1)) for i in 0..n-1."""
    L = num_target_layers
    if n == 1:
        return (L // 2,)
    # Python's round() (half to even), as z-lab's build_target_layer_ids uses.
    return tuple(int(round(1 + i * (L - 4) / (n - 1))) for i in range(n))


def _block_size(cfg: Cfg, dcfg: Cfg) -> int:
    top = cfg.get("block_size", None)
    inner = dcfg.get("block_size", None)
    if top is None and inner is None:
        raise cfg.bad("block_size", "missing (also in dflash_config); expected the draft block size >= 2")
    if top is not None and inner is not None and top != inner:
        raise dcfg.bad("block_size", f"{inner}, but the top-level block_size is {top}; expected one value")
    return cfg.int("block_size", minimum=2) if top is not None else dcfg.int("block_size", minimum=2)


def open_block_draft(directory: Path, architecture: str) -> tuple[Cfg, Any, Cfg]:
    """config.json (``architectures`` must list ``architecture``), the tensors (headers only) and the
    ``dflash_config`` section, whose ``causal`` must be false (bidirectional block)."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    tensors = open_safetensors_dir(directory)  # headers only
    archs = cfg.get("architectures", what=f'a list containing "{architecture}"')
    if not isinstance(archs, list) or architecture not in archs:
        raise cfg.bad("architectures", f"{archs!r}; expected a list containing \"{architecture}\"")
    dcfg = cfg.sub("dflash_config")
    if dcfg.get("causal", False) is not False:
        raise dcfg.bad("causal", f"{dcfg.get('causal')!r} is not supported; expected false (bidirectional block)")
    return cfg, tensors, dcfg


def dflash_from_hf(directory: Path, target: ModelSpec) -> DFlashSpec:
    """A DFlash drafter from ``directory``, checked to fit ``target`` (``Mismatch`` naming both)."""
    cfg, tensors, dcfg = open_block_draft(directory, ARCHITECTURE)
    layer = layer_shape_from_hf(cfg, sliding=True)
    depth = cfg.int("num_hidden_layers", what="the draft depth", **layer_bound(tensors, "layers."))
    windows = draft_windows(cfg, dcfg, depth)
    block = _block_size(cfg, dcfg)
    mask_id = dcfg.int("mask_token_id", what="the mask token id", minimum=0)

    mismatch = fit_block_draft(directory, target, layer.hidden_size, cfg.int_opt("vocab_size"), mask_id,
                               cfg.int_opt("num_target_layers"), mask_key="dflash_config.mask_token_id",
                               reads=" (the draft reads the target's embeddings and features)")
    H, V = target.hidden_size, target.vocab_size
    ids = feature_layer_ids(directory, tensors, target, dcfg, mismatch, depth)
    shapes = backbone_shapes(H, len(ids), depth, layer)
    check_shapes(tensors, shapes, directory)
    return DFlashSpec(
        kind="dflash", source=directory, layer=layer, num_layers=depth, block_size=block,
        mask_token_id=mask_id, target_layer_ids=ids, vocab_size=V, tensors=tensors, windows=windows,
    )


def fit_block_draft(directory: Path, target: ModelSpec, hidden: int, vocab: int | None, mask_id: int,
                    n_target: int | None, mask_key: str = "mask_token_id",
                    reads: str = "") -> Callable[[str], Mismatch]:
    """What every block drafter's config (DFlash, DFlash2, DSpark) must agree on with its target, checked in one
    order: the hidden size (``reads`` says why), the vocab (when the draft states one), the mask id inside the
    target's vocab, num_target_layers (when stated). -> the ``Mismatch`` maker naming both, for the drafter's own
    checks after these."""

    def mismatch(problem: str) -> Mismatch:
        return Mismatch(f"draft {directory} vs target {target.source}", problem)

    H, L, V = target.hidden_size, target.num_layers, target.vocab_size
    if hidden != H:
        raise mismatch(f"draft hidden_size {hidden} != target hidden size {H}; expected equal{reads}")
    if vocab is not None and vocab != V:
        raise mismatch(f"draft vocab_size {vocab} != target vocab {V}; expected equal")
    if mask_id >= V:
        raise mismatch(f"{mask_key} {mask_id} >= target vocab {V}; expected an id < {V}")
    if n_target is not None and n_target != L:
        raise mismatch(f"draft num_target_layers {n_target} != target layers {L}; expected equal")
    return mismatch


def feature_layer_ids(directory, tensors, target: ModelSpec, holder: Cfg | None, mismatch,
                      depth: int | None = None) -> tuple[int, ...]:
    """The target layers whose outputs a block drafter reads, each checked against the target.

    From ``holder.target_layer_ids`` when present (n = its length; fc.weight must be [H, n*H]). When absent,
    z-lab's rule over the draft depth: ``build_target_layer_ids(num_target_layers, num_hidden_layers)``, one
    id per draft layer, so fc.weight must be [H, depth*H]; a file whose fc width disagrees is refused (z-lab
    fails to load it), never read with ids made up from the fc width. Id -1 is the embedding output (HF
    ``hidden_states[0]``, as DeepSpec's ``extract_context_feature`` and speculators' index 0 read it); ids
    -1..L-1 are accepted."""
    H, L = target.hidden_size, target.num_layers
    if "fc.weight" not in tensors:
        raise BadTensor(f"{directory}: tensor fc.weight", f"missing; expected shape [{H}, n*{H}]")
    fc_shape = tensors.shape_of("fc.weight")
    if len(fc_shape) != 2 or fc_shape[0] != H or fc_shape[1] % H or fc_shape[1] == 0:
        raise mismatch(f"fc.weight shape {list(fc_shape)}; expected [{H}, n*{H}] (n target features of "
                       f"the target hidden size {H})")
    n = fc_shape[1] // H
    where = f"{holder.prefix}target_layer_ids" if holder is not None else "target_layer_ids"
    if holder is None or holder.get("target_layer_ids", None) is None:
        if depth is None:
            depth = n
        ids, how = default_target_layer_ids(depth, L), f"by the default rule, {where} being absent"
        if len(ids) != n:
            raise mismatch(f"{where} is absent, so z-lab's default builds one id per draft layer "
                           f"(num_hidden_layers {depth}: {list(ids)}), but fc.weight has {fc_shape[1]} = {n}*{H} "
                           f"columns; expected fc.weight [{H}, {depth * H}] or an explicit {where}")
    else:
        ids, how = tuple(holder.int_list("target_layer_ids", "a list of target layer indices")), f"from {where}"
        if len(ids) != n:
            raise mismatch(f"{where} lists {len(ids)} layers but fc.weight has {fc_shape[1]} = {n}*{H} "
                           f"columns; expected {n} ids")
    bad = [i for i in ids if not -1 <= i < L]
    if bad:
        raise mismatch(f"target_layer_ids {list(ids)} ({how}): {bad} outside the target's layers 0..{L - 1} "
                       "(or -1, the embedding output)")
    return ids


def backbone_shapes(hidden: int, n_features: int, depth: int, layer: LayerShape) -> Shapes:
    """The DFlash backbone every block drafter shares: fc, hidden_norm, norm and ``depth`` Qwen3 layers."""
    shapes: Shapes = {
        "fc.weight": ((hidden, n_features * hidden), "[hidden_size, n_features*hidden_size]"),
        "hidden_norm.weight": ((hidden,), "[hidden_size]"),
        "norm.weight": ((hidden,), "[hidden_size]"),
    }
    for i in range(depth):
        shapes.update(layer_tensor_shapes(f"layers.{i}.", layer))
    return shapes
