"""Tiny random mimo2 checkpoints for the tests: weights of the fixture's layout (trained-looking: norms and sinks
away from their init), written as an HF directory with MiMo's own keys and transformers' beside them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bloomery_cli.families.mimo2.fixture_shape import Mimo2Shape, hf_config, init_mimo2, init_mtp
from bloomery_cli.fixturegen.export_hf import write_safetensors

SHAPE = Mimo2Shape(vocab_size=512, window=5)


def params(shape: Mimo2Shape = SHAPE, seed: int = 0) -> dict[str, torch.Tensor]:
    p = {**init_mimo2(shape, seed, std=0.1), **init_mtp(shape, seed + 1, std=0.1)}
    g = torch.Generator().manual_seed(seed + 2)
    for k in p:
        if k.endswith(("attention_sink_bias", "e_score_correction_bias")):
            p[k] = torch.randn(p[k].shape, generator=g)
        elif "norm" in k:
            p[k] = 1 + 0.2 * torch.randn(p[k].shape, generator=g)
    return p


def write(d: Path, shape: Mimo2Shape = SHAPE, edit=None, drop: tuple[str, ...] = (), seed: int = 0) -> Path:
    """The checkpoint in ``d``; ``edit(cfg)`` changes config.json, ``drop`` leaves tensors out."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(shape)
    if edit is not None:
        edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", {k: v for k, v in params(shape, seed).items() if k not in drop})
    return d
