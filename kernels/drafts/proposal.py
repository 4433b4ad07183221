"""What a draft's ``propose`` returns, one dataclass for every draft (the shapes are each draft's: its module
docstring and ``propose`` say them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    ids: list[int]                                  # the drafts (target ids), in order
    logits: torch.Tensor | None = None              # [drafts, V] when asked
    layer_out: torch.Tensor | None = None           # the draft's last layer output for its rows (the draft's shape)
