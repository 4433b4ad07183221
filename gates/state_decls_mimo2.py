"""The state a mimo2 target and its 3-layer MTP draft hold after a run (``bloomery_cli.state_check.StateDecl``).

Band depths (``ops``), L a target layer's ops at the committed length:
    target K of layer l      L * l + input norm (H) + k proj (H) + rope
    target V of layer l      L * l + input norm (H) + v proj (H) + value scale
    MTP layer k store K / V  L * layers + target final norm (H) + per chained layer j < k its enorm / hnorm, eh_proj
                             (2H), one layer and final_layernorm, then layer k's enorm / hnorm, eh_proj, input norm
                             and k proj + rope (V: v proj + value scale)
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import StateDecl, StateRun
from bloomery_gates.reference.families.mimo2 import model as ref_mimo2
from bloomery_gates.reference.families.mimo2 import mtp as ref_mtp

from .state_decls import kv_layout


def _kv_ops(h: int, prefix: list[Op]) -> tuple[list[Op], list[Op]]:
    return prefix + [Op("k proj", h), Op("rope", 2)], prefix + [Op("v proj", h), Op("value scale", 1)]


def _names(what: str) -> tuple[str, str]:
    return f"{what} k_cache", f"{what} v_cache"


def _mtp_names(k: int) -> tuple[str, str]:
    return f"mtp store k layer {k}", f"mtp store v layer {k}"


def _t_read(engine, run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    for l in range(run.target_spec.num_layers):
        out.update(zip(_names(f"target layer {l}"), kv_layout(*engine.kv_rows(l)), strict=True))
    return out


def _t_reference(run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    for l, kv in ref_mimo2.kv_rows(run.target_spec, run.ref, run.length).items():
        out.update(zip(_names(f"target layer {l}"), kv, strict=True))
    return out


def _t_ops(run: StateRun) -> dict[str, list[Op]]:
    spec = run.target_spec
    one, h = layer_ops(spec.layer, run.length), spec.hidden_size
    out = {}
    for l in range(spec.num_layers):
        out.update(zip(_names(f"target layer {l}"), _kv_ops(h, one * l + [Op("input_layernorm", h)]), strict=True))
    return out


MIMO2_STATE = (StateDecl(_t_read, _t_reference, _t_ops),)


def _m_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    out = {}
    for k in range(run.draft_spec.num_layers):
        out.update(zip(_mtp_names(k), kv_layout(*draft.store_rows(k)), strict=True))
    return out


def _m_reference(run: StateRun) -> dict[str, np.ndarray]:
    spec, n = run.draft_spec, run.length + 1        # tokens up to the anchor; hidden rows up to length-1
    hidden = run.ref.final if spec.hidden == "post" else run.ref.hidden[-1]
    out = {}
    for k, kv in ref_mtp.store_rows(spec, run.target_spec, run.seq[:n], hidden[:n - 1], spec.hidden).items():
        out.update(zip(_mtp_names(k), kv, strict=True))
    return out


def _m_ops(run: StateRun) -> dict[str, list[Op]]:
    t = run.target_spec
    h, one = t.hidden_size, layer_ops(t.layer, run.length)
    trunk = one * t.num_layers + [Op("target final norm", h)]
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h)]
    out = {}
    for k in range(run.draft_spec.num_layers):
        pre = trunk + (step + one + [Op("final_layernorm", h)]) * k + step + [Op("input_layernorm", h)]
        out.update(zip(_mtp_names(k), _kv_ops(h, pre), strict=True))
    return out


MIMO2_MTP_STATE = (StateDecl(_m_read, _m_reference, _m_ops),)
