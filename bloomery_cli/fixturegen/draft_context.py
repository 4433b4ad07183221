"""What an extra drafter of the fixture build gets (``DraftContext``) and what it is (``ExtraDrafter``): apart from
``build`` so that the drafters (``extra_drafters``) and the build that runs them each import it, not each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .train import TargetShape, TrainConfig


@dataclass
class DraftContext:
    """What an extra drafter (DFlash2, DSpark, ...) gets to train on; it writes under ``work`` and returns
    ``(manifest model name, files written, manifest entry)``. Everything here is already on ``device``."""

    work: Path
    device: torch.device
    quick: bool
    seed: int
    target_params: dict                        # the stored (bf16-rounded) target weights, float32
    target_spec: object                        # ModelSpec over target_params
    target_shape: TargetShape
    train_stream: torch.Tensor                 # 1-D training tokens
    held_stream: torch.Tensor                  # 1-D held-out tokens
    pool: torch.Tensor                         # [n, seq] greedy-continuation rows (the DFlash draft's data)
    held_greedy: torch.Tensor                  # [m, seq] held-out prefix + greedy continuation
    held_greedy_first_anchor: int
    draft: TrainConfig                         # the DFlash draft's steps / batch / seq / lr
    anchors_per_row: int
    progress: object
    target_forward: object


ExtraDrafter = Callable[[DraftContext], tuple[str, list[Path], dict]]
