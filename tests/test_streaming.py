"""The streamed float64 reference: a byte budget changes what is held, never a number it computes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import make_target

from bloomery_cli.formats.hf_dir import open_safetensors_dir
from bloomery_cli.formats.lazy import stored_bytes
from bloomery_cli.gate import tensor_bytes
from bloomery_gates.lru import ByteLRU
from bloomery_gates.reference import weights as weights_mod
from bloomery_gates.reference.families.qwen3 import model as qwen3
from bloomery_gates.reference.rounding import stored_as
from bloomery_gates.reference.weights import F64Weights


def _forward_with_budget(monkeypatch, spec, budget: int, chunk: int = weights_mod.CHUNK_BYTES, dtype=None):
    store = F64Weights(spec.tensors, budget=budget, chunk_bytes=chunk)
    monkeypatch.setattr(weights_mod, "as_f64", lambda s: store)
    monkeypatch.setattr(qwen3, "as_f64", lambda s: store)
    if dtype is None:
        return qwen3.forward(spec, [3, 1, 4, 1, 5, 9, 2, 6]), store
    with stored_as(dtype):
        return qwen3.forward(spec, [3, 1, 4, 1, 5, 9, 2, 6]), store


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_budget_zero_streams_and_changes_nothing(monkeypatch, dtype):
    spec = make_target(layers=3, vocab=101)
    whole, big = _forward_with_budget(monkeypatch, spec, 1 << 40, dtype=dtype)
    streamed, none = _forward_with_budget(monkeypatch, spec, 0, chunk=64 * 8 * 3, dtype=dtype)
    assert none.held_bytes() == 0 and big.held_bytes() > 0
    before_big, before_none = big.converted_bytes, none.converted_bytes
    monkeypatch.setattr(qwen3, "as_f64", lambda s: big)
    qwen3.forward(spec, [1, 2])
    assert big.converted_bytes == before_big                   # the second pass reads the store
    monkeypatch.setattr(qwen3, "as_f64", lambda s: none)
    qwen3.forward(spec, [1, 2])
    assert none.converted_bytes > before_none                  # streamed: converted again, never kept
    np.testing.assert_array_equal(streamed.hidden, whole.hidden)
    np.testing.assert_allclose(streamed.logits, whole.logits, rtol=1e-13, atol=1e-13)


def test_budget_bounds_what_is_held():
    spec = make_target(layers=3)
    layer = sum(t.numel() * 8 for n, t in spec.tensors.items() if n.startswith("model.layers.0."))
    store = F64Weights(spec.tensors, budget=layer)
    for name in spec.tensors:
        store[name]
        assert store.held_bytes() <= layer


def test_rows_and_project_equal_the_whole_matrix():
    spec = make_target(vocab=101)
    store = F64Weights(spec.tensors, budget=0, chunk_bytes=8 * 32 * 7)      # 7 rows of the head per chunk
    e = spec.tensors["model.embed_tokens.weight"].double().numpy()
    np.testing.assert_array_equal(store.rows("model.embed_tokens.weight", [5, 0, 5]), e[[5, 0, 5]])
    x = np.random.default_rng(0).standard_normal((4, 32))
    np.testing.assert_allclose(store.project("model.embed_tokens.weight", x), x @ e.T, rtol=1e-13, atol=1e-13)


def test_byte_lru_evicts_oldest_and_refuses_oversize():
    lru = ByteLRU(10, len)
    lru.put("a", "xxxx")
    lru.put("b", "xxxx")
    assert lru.get("a") == "xxxx"           # a is now the most recent
    lru.put("c", "xxxx")                    # 12 > 10: b (least recent) goes
    assert "b" not in lru and "a" in lru and "c" in lru and lru.held == 8
    lru.put("big", "x" * 11)
    assert "big" not in lru


def test_resident_bytes_come_from_headers(tmp_path):
    from safetensors.torch import save_file

    spec = make_target()
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in spec.tensors.items()}, str(tmp_path / "m.safetensors"))
    lazy = open_safetensors_dir(tmp_path)
    want = sum(v.numel() * 2 for v in spec.tensors.values())
    assert stored_bytes(lazy) == want == tensor_bytes(lazy)
    assert len(lazy._cache) == 0                 # nothing was read to count them
    small = dataclasses.replace(spec)
    assert tensor_bytes(small.tensors) == sum(v.numel() * v.element_size() for v in spec.tensors.values())


def test_lazy_store_is_bounded(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    spec = make_target()
    save_file({k: v.contiguous() for k, v in spec.tensors.items()}, str(tmp_path / "m.safetensors"))
    monkeypatch.setenv("BLOOMERY_TENSOR_CACHE_BYTES", "0")
    lazy = open_safetensors_dir(tmp_path)
    for name in lazy:
        torch.testing.assert_close(lazy[name], spec.tensors[name], rtol=0, atol=0)
    assert len(lazy._cache) == 0
