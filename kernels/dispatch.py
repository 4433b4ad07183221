"""Which decode ops a fast engine runs: the fused Triton kernels (``kernels.triton.decode``) or the torch versions
(``kernels.graphs.TorchOps``, same signatures and rule). Apart from ``kernels.graphs`` so that the graphs and their
torch ops import nothing of the Triton kernels, which build on them."""

from __future__ import annotations

import torch

from . import triton as kt
from .graphs import TorchOps


def decode_ops(impl: str, device: torch.device | str):
    """"auto": the Triton kernels where they can run (CUDA + triton, or TRITON_INTERPRET=1), else torch."""
    if impl == "auto":
        impl = "triton" if kt.has_triton() and torch.device(device).type == "cuda" else "torch"
    if impl == "triton":
        if not kt.available(device):
            raise ValueError(f"decode ops impl='triton' asked for, but {kt.why_unavailable(device)}")
        from .triton.decode import TritonOps  # triton is optional: imported only when its kernels are asked for
        return TritonOps
    if impl != "torch":
        raise ValueError(f"decode ops impl={impl!r}: expected auto, torch or triton")
    return TorchOps
