"""DFlash2's op lists and its top-K set excuse: what the qwen3-dflash2 gate's (r) lines and the (o) oracle lines
(``draft_oracle``) both band with, apart from both so that neither imports the other."""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Band, Op, layer_ops
from bloomery_cli.gatekit import DraftCheck
from bloomery_gates.spec import DFlash2Spec


def conv_ops(d: DFlash2Spec) -> list[Op]:
    """The stored ops the conv adds to one draft layer."""
    h, t = d.layer.hidden_size, d.conv_kernel_size
    return [Op("kernel projection", h), Op("conv in", t), Op("conv out + residual", t)] * 2


def dflash2_ops(c: DraftCheck, layers: int, stage: str) -> list[Op]:
    """stage: "layer" (output of draft layer ``layers``), "logits" or "scores": the chained ops behind the tap."""
    d, shape = c.draft_spec, c.target_spec.layer
    seq = len(c.prompt) + d.block_size
    ops = layer_ops(shape, seq) * (1 + layers) + conv_ops(d) * layers
    if stage != "layer":
        ops += [Op("final norm", shape.hidden_size), Op("lm head", shape.hidden_size), Op("multiplier/softcap", 1)]
    if stage == "scores":
        ops += [Op("hidden projection", shape.hidden_size), Op("codebook scores", d.selector_rank)]
    return ops


def set_excused(ref_logits: np.ndarray, k: int, band: Band) -> bool:
    """A top-K set may differ only when the reference's K-th and (K+1)-th logits sit inside the band."""
    top = np.sort(ref_logits)[::-1]
    return bool(len(top) > k and top[k - 1] - top[k] <= 2.0 * band.value * np.max(np.abs(ref_logits)))
