"""The state a qwen4exp target and its MTP draft hold after a run (``bloomery_cli.state_check.StateDecl``).

Target: qwen38's items (``gates.state_decls``: K / V of the attention layers, conv tail and delta-rule state of the
GDN layers, the same band depths with the gated residual's norm and mix in the input norm's place), from
``reference.families.qwen4exp.model.kv_rows`` / ``recurrent_state`` (the latter takes the ids: the PLE layer).

MTP store K / V (``reference.families.qwen4exp.mtp.store_rows``, slots 1..length): L * layers (the raw streams) +
enorm / hnorm (H) + eh_proj (2H) + the attention's gated residual (norm S*H, down S*H, up r, mix mean S) + k proj +
k norm + rope (V: v proj).
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import StateDecl, StateRun
from bloomery_gates.reference.families.qwen4exp import model as ref_qwen4exp
from bloomery_gates.reference.families.qwen4exp import mtp as ref_mtp

from .state_decls import MTP_NAMES, _kv_names, _rec_names, _target_ops, _target_read, kv_layout, kv_ops


def _t_reference(run: StateRun) -> dict[str, np.ndarray]:
    spec, out = run.target_spec, {}
    for l, kv in ref_qwen4exp.kv_rows(spec, run.ref, run.length).items():
        out.update(zip(_kv_names(l), kv, strict=True))
    for l, (tail, state) in ref_qwen4exp.recurrent_state(spec, run.ref, run.length, run.seq).items():
        out.update(zip(_rec_names(l), (tail, state.reshape(state.shape[0], -1)), strict=True))
    return out


QWEN4EXP_STATE = (StateDecl(_target_read, _t_reference, _target_ops),)


def hc_residual_ops(spec) -> list[Op]:
    """A gated residual's chained stored ops (``ops.gated_hc``): grouped norm, down, silu, up, mix mean."""
    sh = spec.hc.count * spec.hidden_size
    return [Op("hc grouped norm", spec.hidden_size), Op("hc down", sh), Op("hc silu", 1), Op("hc up", spec.hc.low_rank),
            Op("hc mix mean", spec.hc.count)]


def _m_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    return dict(zip(MTP_NAMES, kv_layout(*draft.store_rows()), strict=True))


def _m_reference(run: StateRun) -> dict[str, np.ndarray]:
    n = run.length + 1                 # rows 1..length: tokens up to the anchor, streams up to length-1
    kv = ref_mtp.store_rows(run.draft_spec, run.target_spec, run.seq[:n], run.ref.hidden[-1][:n])
    return dict(zip(MTP_NAMES, kv, strict=True))


def _m_ops(run: StateRun) -> dict[str, list[Op]]:
    t = run.target_spec
    h = t.hidden_size
    pre = layer_ops(t.layer, run.length) * t.num_layers + [Op("enorm / hnorm", h), Op("eh_proj", 2 * h),
                                                           *hc_residual_ops(t)]
    return dict(zip(MTP_NAMES, kv_ops(t.layer, pre), strict=True))


QWEN4EXP_MTP_STATE = (StateDecl(_m_read, _m_reference, _m_ops),)
