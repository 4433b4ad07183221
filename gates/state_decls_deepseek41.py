"""The state a deepseek41 (DeepSeek V4.1, docs/V41.md) target holds after a run (``bloomery_cli.state_check``).

Target, per layer l, as the engine holds it (rows by position, the committed rows 0..length-1):
    window KV      kv [length, d]   the roped K = V head: rope(rms(a Wkv^T, kv_norm)) (``kernels.ops.v4_attention``)
    stream source  k | z [length, d (+ d)]  on a kv source: its compressor's projections a Wc^T (and a Wz^T where it
                   has a gate), pooled per pass (``kernels.ops.v41_stream.StreamCache``)
a = rms(fold of the (engram-gated) streams entering layer l by their lag, input_layernorm)
(``reference.families.deepseek41.model.input_rows``, from the reference's fresh run's input state of layer l).

Band depths (``ops``), L a target layer's ops at the committed length: L * l + input norm (H) + the projection (H)
(+ kv_norm and rope for the window KV).
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import StateDecl, StateRun, np64
from bloomery_gates.reference.families.deepseek41 import model as ref41

from ..reference.families.deepseek4.model import attn_weights_at, layer_rope
from ..reference.ops import v4_attention as rv4
from ..reference.rounding import linear
from ..reference.weights import as_f64
from ..reference.xp import ns


def _source(spec, l: int) -> bool:
    s = spec.stream(l)
    return s is not None and s.kv_source == l


def _names(spec, l: int) -> list[str]:
    out = [f"target layer {l} k_cache = v_cache (window, one K = V head)"]
    if _source(spec, l):
        out.append(f"target layer {l} stream source k|z")
    return out


def _t_read(engine, run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    n = run.length
    for l in range(run.target_spec.num_layers):
        arrays = [np64(engine.cache[l].kv[:n])]
        if _source(run.target_spec, l):
            c = engine.stream_cache[l]
            arrays.append(np.concatenate([np64(c.k[:n])] + ([np64(c.z[:n])] if c.z is not None else []), 1))
        out.update(zip(_names(run.target_spec, l), arrays, strict=True))
    return out


def _t_reference(run: StateRun) -> dict[str, np.ndarray]:
    spec, n = run.target_spec, run.length
    w, eps = as_f64(spec), spec.layer.rms_eps
    ids = np.asarray(run.seq[:n], dtype=np.int64)
    out = {}
    for l in range(spec.num_layers):
        p = ref41.P + f"layers.{l}.self_attn."
        a = ref41.input_rows(spec, w, l, run.ref.hidden[l][:n], ids)
        xp = ns(a)
        arrays = [rv4.tail_rope(rv4.kv_rows(a, attn_weights_at(w, p, "sliding"), eps), xp.arange(n),
                                layer_rope(spec, l))]
        if _source(spec, l):
            c = p + "compressor."
            parts = [linear(a, w[c + "kv_proj.weight"])]
            if c + "gate_proj.weight" in w:
                parts.append(linear(a, w[c + "gate_proj.weight"]))
            arrays.append(xp.concatenate(parts, 1))
        out.update(zip(_names(spec, l), arrays, strict=True))
    return out


def _t_ops(run: StateRun) -> dict[str, list[Op]]:
    spec = run.target_spec
    one, h = layer_ops(spec.layer, run.length), spec.hidden_size
    out = {}
    for l in range(spec.num_layers):
        pre = one * l + [Op("input_layernorm", h)]
        ops = [pre + [Op("kv proj", h), Op("kv_norm", spec.attn.head_dim), Op("rope", 2)], pre + [Op("proj", h)]]
        out.update(zip(_names(spec, l), ops, strict=False))
    return out


DEEPSEEK41_STATE = (StateDecl(_t_read, _t_reference, _t_ops),)
