"""The state a deepseek4 (DeepSeek V4) target and its MTP draft hold after a run (``bloomery_cli.state_check``).

Target, per layer l, as the engine holds it (``kernels.ops.v4_attention.V4Cache``, rows by position, the committed
rows 0..length-1):
    window KV      kv [length, d]      the roped K = V head: rope(rms(a Wkv^T, kv_norm)), a = layer l's normed input
    compressor     k | z [length, 2cd] (CSA / HCA) the compressor's projections a Wc^T and a Wg^T, pooled per pass
    indexer keys   ik | iz [length, 4di] (CSA) the indexer compressor's projections
a = rms(sum_s pre_s x_s, input_layernorm) from the streams x entering layer l (``reference.families.deepseek4.model``).
MTP draft: its window KV [n, d] of the real rows (``reference.families.deepseek4.mtp.store_rows``).

Band depths (``ops``), L a target layer's ops at the committed length: L * l + input norm (H) + the projection
(H) (+ kv_norm and rope for the window KV); the MTP's: L * layers + enorm / hnorm, eh_proj (2H), input norm,
kv proj, rope.
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import StateDecl, StateRun, np64
from bloomery_gates.reference.families.deepseek4 import dspark as ref_dspark
from bloomery_gates.reference.families.deepseek4 import model as ref_ds4
from bloomery_gates.reference.families.deepseek4 import mtp as ref_mtp

from ..reference.ops import mhc as rmhc
from ..reference.ops import v4_attention as rv4
from ..reference.ops.norm import rms_norm
from ..reference.rounding import linear
from ..reference.weights import as_f64
from ..reference.xp import ns


def _names(spec, l: int) -> list[str]:
    kind = spec.layer_types[l]
    out = [f"target layer {l} k_cache = v_cache (window, one K = V head)"]
    if kind != "sliding":
        out.append(f"target layer {l} compressor k|z")
    if kind == "csa":
        out.append(f"target layer {l} indexer k|z")
    return out


def _t_read(engine, run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    for l in range(run.target_spec.num_layers):
        c, n = engine.cache[l], run.length
        arrays = [c.kv[:n]]
        if c.k is not None:
            arrays.append(np.concatenate([np64(c.k[:n]), np64(c.z[:n])], 1))
        if c.ik is not None:
            arrays.append(np.concatenate([np64(c.ik[:n]), np64(c.iz[:n])], 1))
        out.update(zip(_names(run.target_spec, l), [a if isinstance(a, np.ndarray) else np64(a) for a in arrays],
                       strict=True))
    return out


def _t_reference(run: StateRun) -> dict[str, np.ndarray]:
    spec, n = run.target_spec, run.length
    w, eps = as_f64(spec), spec.layer.rms_eps
    out = {}
    for l in range(spec.num_layers):
        p = ref_ds4.P + f"layers.{l}."
        x = run.ref.hidden[l][:n]
        hw = rmhc.mhc_weights(x, w[p + "attn_hc.fn"], w[p + "attn_hc.base"], w[p + "attn_hc.scale"],
                              spec.hc.sinkhorn_iters, spec.hc.eps, eps)
        a = rms_norm(rmhc.mhc_collapse(x, hw.pre), w[p + "input_layernorm.weight"], eps)
        aw = ref_ds4.attn_weights(spec, w, l)
        xp = ns(a)
        arrays = [rv4.tail_rope(rv4.kv_rows(a, aw, eps), xp.arange(n), ref_ds4.layer_rope(spec, l))]
        if aw.comp is not None:
            arrays.append(xp.concatenate([linear(a, aw.comp.kv), linear(a, aw.comp.gate)], 1))
        if aw.indexer is not None:
            arrays.append(xp.concatenate([linear(a, aw.indexer.comp.kv), linear(a, aw.indexer.comp.gate)], 1))
        out.update(zip(_names(spec, l), arrays, strict=True))
    return out


def _t_ops(run: StateRun) -> dict[str, list[Op]]:
    spec = run.target_spec
    one, h = layer_ops(spec.layer, run.length), spec.hidden_size
    out = {}
    for l in range(spec.num_layers):
        pre = one * l + [Op("input_layernorm", h)]
        ops = [pre + [Op("kv proj", h), Op("kv_norm", spec.attn.head_dim), Op("rope", 2)], pre + [Op("proj", h)],
               pre + [Op("proj", h)]]
        out.update(zip(_names(spec, l), ops, strict=False))
    return out


DEEPSEEK4_STATE = (StateDecl(_t_read, _t_reference, _t_ops),)

MTP_NAME = "mtp store k = v (window)"


def _m_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    return {MTP_NAME: np64(draft.store_rows())}


def _m_reference(run: StateRun) -> dict[str, np.ndarray]:
    n = run.length + 1                   # tokens up to the anchor; streams up to length-1 (every row real)
    return {MTP_NAME: ref_mtp.store_rows(run.draft_spec, run.target_spec, run.seq[:n], run.ref.hidden[-1][:n - 1])}


def _m_ops(run: StateRun) -> dict[str, list[Op]]:
    t = run.target_spec
    h, one = t.hidden_size, layer_ops(t.layer, run.length)
    return {MTP_NAME: one * t.num_layers + [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), Op("input_layernorm", h),
                                            Op("kv proj", h), Op("kv_norm", t.attn.head_dim), Op("rope", 2)]}


DEEPSEEK4_MTP_STATE = (StateDecl(_m_read, _m_reference, _m_ops),)


# The DSV4 DSpark draft (``kernels.families.deepseek4.dspark``): each stage's context K = V [length, d] of the kept
# rows (``reference.families.deepseek4.dspark.context_rows`` over the fresh run's target taps), and the next block's
# confidence logits (the reference teacher-forced with the kernel's Markov chain). Band depths: the target's layers
# up to the deepest feature, fc + enc_norm, kv proj + kv_norm + rope; the block adds the stages and the HC head.

def collapse_op(d) -> Op:
    """The draft's HC collapse as one op: V4's trained head reads S x H (its rms over the flattened streams);
    V4.1's LastMix is a weighted sum over the S streams."""
    h = d.hidden_size
    return Op("hc_head", d.hc.count * h) if d.collapse == "hc_head" else Op(d.collapse, d.hc.count)


def _ds_names(spec) -> list[str]:
    return [f"dspark context layer {i} k = v (window, stage {i})" for i in range(spec.num_layers)]


def _ds_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    return {n: np64(draft.context_kv(i)) for i, n in enumerate(_ds_names(run.draft_spec))}


def _ds_reference(run: StateRun) -> dict[str, np.ndarray]:
    rows = ref_dspark.context_rows(run.draft_spec, run.ref.hidden, run.length)
    return dict(zip(_ds_names(run.draft_spec), rows, strict=True))


def _ds_feature_ops(run: StateRun, rows: int) -> list[Op]:
    t, d = run.target_spec, run.draft_spec
    h = t.hidden_size
    return layer_ops(t.layer, rows) * (max(d.target_layer_ids) + 1) + [
        Op("hc mean", t.hc.count), Op("fc", len(d.target_layer_ids) * h), Op("enc_norm", h)]


def _ds_ops(run: StateRun) -> dict[str, list[Op]]:
    d = run.draft_spec
    ops = _ds_feature_ops(run, run.length) + [Op("kv proj", d.hidden_size), Op("kv_norm", d.attn.head_dim),
                                              Op("rope", 2)]
    return {n: ops for n in _ds_names(d)}


DS_CONF = "dspark next block confidence logits"


def _ds_conf_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    z = run.proposal.conf_logits
    return {} if z is None else {DS_CONF: np64(z)}


def _ds_conf_reference(run: StateRun) -> dict[str, np.ndarray]:
    prev = np.concatenate([[run.emitted[-1]], np64(run.proposal.prev).astype(np.int64)[1:]])   # row 0: the anchor
    z = ref_dspark.forward(run.draft_spec, run.target_spec, run.ref, run.emitted[-1], s=run.length,
                           prev=prev).conf_logits
    return {} if z is None else {DS_CONF: z}


def _ds_conf_ops(run: StateRun) -> dict[str, list[Op]]:
    d = run.draft_spec
    h = d.hidden_size
    return {DS_CONF: _ds_feature_ops(run, run.length + d.block_size)
            + layer_ops(d.layer, run.length + d.block_size) * d.num_layers
            + [collapse_op(d), Op("confidence proj", h + d.markov_rank)]}


DEEPSEEK4_DSPARK_STATE = (StateDecl(_ds_read, _ds_reference, _ds_ops),
                          StateDecl(_ds_conf_read, _ds_conf_reference, _ds_conf_ops))
