"""The drafters trained after the DFlash fixture, from the same frozen target, greedy pool and budget:
DSpark (block 7, anchor-first) and DFlash2 (block 8, conv + selector), each with the DFlash fixture's
depth, so the gates can put their acceptance side by side."""

from __future__ import annotations

from pathlib import Path

from .draft_context import DraftContext

DSPARK_DIR = "qwen3-tiny-dspark-b7"
DFLASH2_DIR = "qwen3-tiny-dflash2-b8"


def _budget(ctx: DraftContext) -> dict:
    d = ctx.draft
    return {"batch": d.batch, "anchors_per_row": ctx.anchors_per_row, "lr": d.lr, "warmup": d.warmup,
            "eval_rows": ctx.held_greedy, "eval_first_anchor": ctx.held_greedy_first_anchor}


def _mask_id(ctx: DraftContext) -> int:
    from tokenizers import Tokenizer

    from . import tokenizer_train

    return Tokenizer.from_file(str(ctx.work / "tokenizer.json")).token_to_id(tokenizer_train.MASK)


def dspark(ctx: DraftContext) -> tuple[str, list[Path], dict]:
    from .train_dspark import DSparkShape, train_dspark, write_dspark

    depth = _draft_depth(ctx)
    shape = DSparkShape(num_layers=depth, target_layer_ids=(1, 2, 4), mask_token_id=_mask_id(ctx))
    stored, dspec, stats = train_dspark(ctx.target_params, ctx.target_spec, ctx.pool, ctx.device, ctx.draft.steps,
                                        ctx.seed + 7, ctx.progress, shape=shape, seq=ctx.pool.shape[1],
                                        **_budget(ctx))
    files = write_dspark(ctx.work / DSPARK_DIR, stored, dspec, ctx.target_spec)
    return DSPARK_DIR, files, {"kind": "dspark", "layers": depth, "block_size": shape.block_size,
                               "steps": ctx.draft.steps, "seed": ctx.seed + 7, **_plain(stats)}


def dflash2(ctx: DraftContext) -> tuple[str, list[Path], dict]:
    from .train_dflash2 import DFlash2Shape, train_dflash2, write_dflash2

    depth = _draft_depth(ctx)
    shape = DFlash2Shape(num_layers=depth, mask_token_id=_mask_id(ctx))
    _, dspec, stats = train_dflash2(ctx.target_params, ctx.target_spec, ctx.pool, ctx.device, ctx.draft.steps,
                                    ctx.seed + 9, ctx.progress, dshape=shape, seq=ctx.pool.shape[1], **_budget(ctx))
    files = write_dflash2(ctx.work / DFLASH2_DIR, ctx.target_spec, dspec)
    return DFLASH2_DIR, files, {"kind": "dflash2", "layers": depth, "block_size": shape.block_size,
                                "steps": ctx.draft.steps, "seed": ctx.seed + 9, **_plain(stats)}


def _draft_depth(ctx: DraftContext) -> int:
    import json

    return int(json.loads((ctx.work / "qwen3-tiny-dflash-b8" / "config.json").read_text())["num_hidden_layers"])


def _plain(stats: dict) -> dict:
    """Drop anything that is not JSON-able plain data (tensors, long loss curves stay out of the manifest)."""
    import json

    out = {}
    for k, v in stats.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[k] = v
    return out


DEFAULT = [dspark, dflash2]
