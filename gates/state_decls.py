"""What each target family's and each drafter's state IS after a run (``bloomery_cli.state_check.StateDecl``).

Arrays are compared per last-axis row (``bands.worst_rel``), so each is laid out with one meaningful vector per
row: a cached K or V head vector [positions, nkv, d], a conv tail row [K-1, C], one value head's whole delta-rule
state [nv, dk * dv], the confidence logits of a block [B].

Band depths (``ops``: the stored ops chained from the ids to the array, ``bands.Op``), L a target layer's ops
(``bands.layer_ops`` at the run's committed length):
    target K of layer l          L * l + input norm (H) + k proj (H) + k norm (d) + rope
    target V of layer l          L * l + input norm (H) + v proj (H)
    conv tail of layer l         L * l + input norm (H) + in_proj_qkv (H)
    delta-rule state of layer l  L * l + input norm, in_proj_qkv, a / b projections (H), conv (K), silu, l2 norm
                                 (dk), gates, and the state's sum over the committed positions (length)
    block-draft context K / V    L * (max feature layer + 1) [+ the target's final norm when it reads the last
                                 layer] + fc (n H) + hidden_norm (H) + k proj + k norm + rope (V: v proj)
    MTP store K / V              L * layers + final norm (H) + pre-fc norms (H) + fc (2H) + input norm (H)
                                 + k proj + k norm + rope (V: v proj)
    DSpark confidence logits     L * (max feature layer + 2 + draft layers) + final norm (H) + proj (H + r)
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import IntCheck, StateDecl, StateRun, emulated, np64, state_band
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3
from bloomery_gates.reference.families.qwen38 import model as ref_qwen38

from ..reference.drafts import dflash as ref_dflash
from ..reference.drafts import dspark as ref_dspark
from ..reference.drafts import mtp as ref_mtp


def kv_layout(k, v) -> tuple[np.ndarray, np.ndarray]:
    """Engine views [nkv, S, d] -> float64 [S, nkv, d] (the reference's layout)."""
    return np64(k).transpose(1, 0, 2), np64(v).transpose(1, 0, 2)


def kv_ops(shape, prefix: list[Op]) -> tuple[list[Op], list[Op]]:
    """The ops of a cached K and V from normed rows whose own depth is ``prefix`` (k: proj, norm, rope; v: proj)."""
    h, d = shape.hidden_size, shape.head_dim
    return prefix + [Op("k proj", h), Op("k norm", d), Op("rope", 2)], prefix + [Op("v proj", h)]


# ----------------------------------------------------------------------------------------------- target families


def _attn_layers(spec) -> list[int]:
    hy = getattr(spec, "hybrid", None)
    return [l for l in range(spec.num_layers) if hy is None or not hy.is_linear(l)]


def _lin_layers(spec) -> list[int]:
    hy = getattr(spec, "hybrid", None)
    return [] if hy is None else [l for l in range(spec.num_layers) if hy.is_linear(l)]


def _kv_names(l: int) -> tuple[str, str]:
    return f"target layer {l} k_cache", f"target layer {l} v_cache"


def _rec_names(l: int) -> tuple[str, str]:
    return f"target layer {l} conv tail", f"target layer {l} deltanet state"


def _target_read(engine, run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    for l in _attn_layers(run.target_spec):
        out.update(zip(_kv_names(l), kv_layout(*engine.kv_rows(l)), strict=True))
    for l in _lin_layers(run.target_spec):
        tail, state = engine.recurrent_state(l)
        out.update(zip(_rec_names(l), (np64(tail), np64(state).reshape(state.shape[0], -1)), strict=True))
    return out


def _target_reference(kv_rows, recurrent_state):
    def reference(run: StateRun) -> dict[str, np.ndarray]:
        out = {}
        for l, kv in kv_rows(run.target_spec, run.ref, run.length).items():
            out.update(zip(_kv_names(l), kv, strict=True))
        if recurrent_state is not None:
            for l, (tail, state) in recurrent_state(run.target_spec, run.ref, run.length).items():
                out.update(zip(_rec_names(l), (tail, state.reshape(state.shape[0], -1)), strict=True))
        return out
    return reference


def _target_ops(run: StateRun) -> dict[str, list[Op]]:
    spec = run.target_spec
    s, h = spec.layer, spec.hidden_size
    one = layer_ops(s, run.length)
    out = {}
    for l in _attn_layers(spec):
        out.update(zip(_kv_names(l), kv_ops(s, one * l + [Op("input_layernorm", h)]), strict=True))
    for l in _lin_layers(spec):
        hy = spec.hybrid
        tail = one * l + [Op("input_layernorm", h), Op("in_proj_qkv", h)]
        state = tail + [Op("in_proj_a / in_proj_b", h), Op("conv1d", hy.linear_conv_kernel_dim), Op("silu", 1),
                        Op("l2 norm", hy.linear_key_head_dim), Op("decay / strength gates", 1),
                        Op("delta-rule state sum", run.length)]
        out.update(zip(_rec_names(l), (tail, state), strict=True))
    return out


QWEN3_STATE = (StateDecl(_target_read, _target_reference(ref_qwen3.kv_rows, None), _target_ops),)
QWEN38_STATE = (StateDecl(_target_read, _target_reference(ref_qwen38.kv_rows, ref_qwen38.recurrent_state),
                          _target_ops),)


# ------------------------------------------------------------------------------------------------------- drafts


def feature_ops(run: StateRun) -> list[Op]:
    """The target ops behind a block draft's context features u (fc input through hidden_norm)."""
    d, t = run.draft_spec, run.target_spec
    ids, h = list(d.target_layer_ids), t.hidden_size
    ops = layer_ops(t.layer, run.length) * (max(ids) + 1)
    if t.num_layers - 1 in ids:
        ops = ops + [Op("target final norm", h)]
    return ops + [Op("fc", len(ids) * h), Op("hidden_norm", h)]


def block_store(kind: str) -> StateDecl:
    """A DFlash-backbone draft's context store (DFlash, DFlash2, DSpark): context K/V rows 0..length-1 written by
    prompt / accept, against the context K/V of the reference's context features of the fresh run's target taps."""
    def names(i: int) -> tuple[str, str]:
        return f"{kind} context layer {i} k", f"{kind} context layer {i} v"

    def read(draft, run: StateRun) -> dict[str, np.ndarray]:
        out = {}
        for i in range(run.draft_spec.num_layers):
            out.update(zip(names(i), kv_layout(*draft.context_kv(i)), strict=True))
        return out

    def reference(run: StateRun) -> dict[str, np.ndarray]:
        out = {}
        for i, kv in ref_dflash.context_kv(run.draft_spec, run.ref, run.length).items():
            out.update(zip(names(i), kv, strict=True))
        return out

    def ops(run: StateRun) -> dict[str, list[Op]]:
        kv = kv_ops(run.draft_spec.layer, feature_ops(run))
        return {n: o for i in range(run.draft_spec.num_layers) for n, o in zip(names(i), kv, strict=True)}

    return StateDecl(read, reference, ops)


MTP_NAMES = ("mtp store k", "mtp store v")


def _mtp_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    return dict(zip(MTP_NAMES, kv_layout(*draft.store_rows()), strict=True))


def _mtp_reference(run: StateRun) -> dict[str, np.ndarray]:
    n = run.length + 1                 # rows 1..length: tokens up to the anchor, hidden rows up to length-1
    kv = ref_mtp.store_rows(run.draft_spec, run.target_spec, run.seq[:n], run.ref.final[:n])
    return dict(zip(MTP_NAMES, kv, strict=True))


def _mtp_ops(run: StateRun) -> dict[str, list[Op]]:
    t = run.target_spec
    h = t.hidden_size
    pre = layer_ops(t.layer, run.length) * t.num_layers + [
        Op("target final norm", h), Op("pre_fc norms", h), Op("fc", 2 * h), Op("input_layernorm", h)]
    return dict(zip(MTP_NAMES, kv_ops(t.layer, pre), strict=True))


MTP_STATE = (StateDecl(_mtp_read, _mtp_reference, _mtp_ops),)


CONF = "dspark next block confidence logits"


def _conf_ref(run: StateRun) -> ref_dspark.DSparkRefOut:
    """The reference's block after the committed positions, its Markov inputs teacher-forced with the kernel's."""
    prev = np64(run.proposal.prev).astype(np.int64)
    return ref_dspark.forward(run.draft_spec, run.target_spec, run.ref, run.emitted[-1], s=run.length, prev=prev)


def _conf_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    z = run.proposal.conf_logits
    return {} if z is None else {CONF: np64(z)}


def _conf_reference(run: StateRun) -> dict[str, np.ndarray]:
    z = _conf_ref(run).conf_logits
    return {} if z is None else {CONF: z}


def _conf_ops(run: StateRun) -> dict[str, list[Op]]:
    d, t = run.draft_spec, run.target_spec
    h = t.hidden_size
    depth = max(d.target_layer_ids) + 1 + 1 + d.num_layers
    return {CONF: layer_ops(t.layer, run.length + d.block_size) * depth + [
        Op("final norm", h), Op("confidence proj", h + d.markov_rank)]}


def _cut(draft, run: StateRun) -> list[IntCheck]:
    """With a cut t > 0: the kept count of the next block (from the kernel's confidence) against the host rule
    on the reference's confidence. A difference is excused only where the first row at which the two sides
    decide differently has a reference confidence logit within the band of logit(t)."""
    t, z = draft.confidence_cut, run.proposal.conf_logits
    if t <= 0 or z is None:
        return []
    ref = _conf_ref(run)
    b, kept = len(ref.conf_logits), len(run.proposal.ids)
    want = ref_dspark.cut_length(ref.confidence, t)
    excused = 0
    if kept != want:
        zk = np64(z)
        logit_t = float(np.log(t / (1.0 - t))) if t < 1 else np.inf
        emu = emulated(run.dtype, lambda: _conf_ref(run.emu).conf_logits)
        band = state_band(run.dtype, CONF, ref.conf_logits, emu, _conf_ops(run)[CONF])
        split = np.nonzero((zk < logit_t) != (ref.conf_logits < logit_t))[0]
        if len(split):
            k = int(split[0])
            excused = int(abs(ref.conf_logits[k] - logit_t) <= band.value * np.max(np.abs(ref.conf_logits)))
    return [IntCheck(f"dspark confidence cut t={t:g} at the next block: kept {kept} of {b}", 1, int(kept != want),
                     excused)]


DSPARK_STATE = (block_store("dspark"), StateDecl(_conf_read, _conf_reference, _conf_ops, _cut))
DFLASH_STATE = (block_store("dflash"),)
DFLASH2_STATE = (block_store("dflash2"),)
