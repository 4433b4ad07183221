"""Our folders kernels/, reference/, gates/ live under bloomery_gates and cannot shadow PyPI names."""

from __future__ import annotations

import importlib.util

import pytest


def test_no_top_level_kernels_shadow():
    spec = importlib.util.find_spec("kernels")
    if spec is not None:   # the PyPI `kernels` package may be installed; it must not be ours
        assert "bloomery" not in str(spec.origin) and "/work/" not in str(spec.origin), (
            f"a top-level `kernels` resolves to {spec.origin}: run `pytest`, not `python -m pytest` from the repo root "
            "(which puts the root, and its kernels/ folder, on sys.path)")
    import bloomery_gates.kernels as ours
    import bloomery_gates.reference  # noqa: F401

    assert ours.__name__ == "bloomery_gates.kernels"


def test_transformers_imports_beside_ours():
    """transformers probes for a `kernels` package; ours must never be taken for it."""
    pytest.importorskip("transformers")
    from transformers.utils import import_utils

    probe = getattr(import_utils, "is_kernels_available", None)
    if probe is not None and importlib.util.find_spec("kernels") is None:
        assert not probe()
    import transformers
    from transformers import Qwen3Config

    import bloomery_gates.gates  # noqa: F401
    import bloomery_gates.kernels.families.qwen3.model  # noqa: F401

    assert Qwen3Config(hidden_size=8, num_attention_heads=2).hidden_size == 8
    assert transformers.__version__
