"""Fused Triton kernels for DFlash2 (the grouped dynamic conv, the selector's scores + walk).

This package imports triton only when a kernel is asked for: ``available(device)`` says whether one can
run (triton importable, and a CUDA device, or ``TRITON_INTERPRET=1`` for the CPU interpreter), and
``resolve_impl`` turns ``impl = "auto" | "torch" | "triton"`` into the path a draft uses:
"auto" is "triton" on CUDA when triton imports, else "torch".
"""

from __future__ import annotations

import importlib.util
import os

import torch

from .limits import delta_dims_ok as delta_dims_ok  # the engines ask the package

IMPLS = ("auto", "torch", "triton")


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on ``device``."""
    return has_triton() and (torch.device(device).type == "cuda" or interpreting())


def why_unavailable(device: torch.device | str) -> str:
    if not has_triton():
        return "triton is not installed"
    return f"device {device} is not CUDA (set TRITON_INTERPRET=1 to run the kernels in the CPU interpreter)"


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """"auto" -> "triton" on CUDA with triton, else "torch"; "triton" where it cannot run is a ValueError."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}: expected one of {', '.join(IMPLS)}")
    if impl == "auto":
        return "triton" if torch.device(device).type == "cuda" and has_triton() else "torch"
    if impl == "triton" and not available(device):
        raise ValueError(f"impl='triton' asked for, but {why_unavailable(device)}")
    return impl


def conv_impl(impl: str):
    """The dynamic conv function of a resolved impl (same signature as ``ops.dynamic_conv.dynamic_conv``)."""
    if impl == "triton":
        from .dynamic_conv import dynamic_conv
    else:
        from ..ops.dynamic_conv import dynamic_conv
    return dynamic_conv


def select_impl(impl: str):
    """The scores-and-walk function of a resolved impl (same signature as ``ops.selector.scores_and_walk``)."""
    if impl == "triton":
        from .selector import scores_and_walk
    else:
        from ..ops.selector import scores_and_walk
    return scores_and_walk


def topk_impl(impl: str):
    """The selector's top-K of a resolved impl (same signature as ``ops.selector.topk_candidates``)."""
    if impl == "triton":
        from .selector import topk_candidates
    else:
        from ..ops.selector import topk_candidates
    return topk_candidates


def delta_impl(impl: str):
    """The delta-rule recurrence of a resolved impl: (q, k, v, g, b, state, s_out=None) -> (o, state after the
    last row), the triton kernel or ``ops.gated_deltanet.delta_recurrent`` (the torch scan)."""
    if impl == "triton":
        from .deltanet import delta_recurrent
    else:
        from ..ops.gated_deltanet import delta_recurrent
    return delta_recurrent
