"""The state a glm5next target and its NextN draft hold after a run (``bloomery_cli.state_check.StateDecl``).

Target (``kernels.families.glm5next.model.Glm5NextTarget``), by layer kind, against one fresh f64 run
(``reference.families.glm5next.model.kv_rows`` / ``recurrent_state``) cut at the committed length:
    MLA layer l      the latent cache [length, kl]; on a full indexer layer the normed block inputs [length, H]
    KDA layer l      the conv tail [K-1, 3C] and the recurrent state [n, d*d] (float32), after a reject the state
                     after the last kept row: exact rollback shows as these lines passing after the loop
NextN draft (``kernels.families.glm5next.mtp.Glm5NextNDraft``): its store's real rows, NextN positions 0..length-1
(the anchor's row included: read after ``propose``), latent [length, kl] and normed block inputs [length, H], against
``reference.families.glm5next.mtp.store_rows`` on the fresh run's post-norm rows.

Band depths (``ops``), L a target layer's ops at the committed length (``bands.layer_ops``):
    MLA latent / inputs of layer l   L * l + mHC collapse + input_layernorm (H) [+ kv_a (H) + kv_a_layernorm]
    KDA tail / state of layer l      L * l + mHC collapse + input_layernorm (H) + q/k/v proj (H)
                                     [+ conv, silu, l2 norms, gates, the state's sum over the rows]
    NextN latent / inputs            L * layers + mean + final norm (H) + enorm / hnorm, eh_proj (2H),
                                     input_layernorm (H) [+ kv_a (H) + kv_a_layernorm]
"""

from __future__ import annotations

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.state_check import StateDecl, StateRun, np64
from bloomery_gates.reference.families.glm5next import model as ref_glm
from bloomery_gates.reference.families.glm5next import mtp as ref_mtp


def _mla(l: int) -> tuple[str, str]:
    return f"target layer {l} latent cache", f"target layer {l} indexer inputs"


def _kda(l: int) -> tuple[str, str]:
    return f"target layer {l} conv tail", f"target layer {l} kda state"


def _full(spec, l: int) -> bool:
    return spec.dsa.types[l] == "full"


def _t_read(engine, run: StateRun) -> dict[str, np.ndarray]:
    spec, out = run.target_spec, {}
    for l, kind in enumerate(spec.layer_types):
        if kind == "indexed_attention":
            c, a = engine.kv_rows(l)
            out[_mla(l)[0]] = np64(c)
            if _full(spec, l):
                out[_mla(l)[1]] = np64(a)
        else:
            tail, state = engine.recurrent_state(l)
            out.update(zip(_kda(l), (np64(tail), np64(state).reshape(state.shape[0], -1)), strict=True))
    return out


def _t_reference(run: StateRun) -> dict[str, np.ndarray]:
    spec, out = run.target_spec, {}
    for l, (c, a) in ref_glm.kv_rows(spec, run.ref, run.length).items():
        out[_mla(l)[0]] = c
        if _full(spec, l):
            out[_mla(l)[1]] = a
    for l, (tail, state) in ref_glm.recurrent_state(spec, run.ref, run.length).items():
        out.update(zip(_kda(l), (tail, state.reshape(state.shape[0], -1)), strict=True))
    return out


def _t_ops(run: StateRun) -> dict[str, list[Op]]:
    spec = run.target_spec
    h, one = spec.hidden_size, layer_ops(spec.layer, run.length)
    out = {}
    for l, kind in enumerate(spec.layer_types):
        inp = one * l + [Op("mHC collapse", spec.hc.count), Op("input_layernorm", h)]
        if kind == "indexed_attention":
            out[_mla(l)[0]] = inp + [Op("kv_a", h), Op("kv_a_layernorm", spec.mla.kv_lora_rank)]
            if _full(spec, l):
                out[_mla(l)[1]] = inp
        else:
            k = spec.kda
            tail = inp + [Op("q/k/v proj", h)]
            state = tail + [Op("f_a / f_b / b proj", h), Op("conv1d", k.conv_kernel), Op("silu", 1),
                            Op("l2 norm", k.head_dim), Op("gates", 1), Op("kda state sum", run.length)]
            out.update(zip(_kda(l), (tail, state), strict=True))
    return out


GLM5NEXT_STATE = (StateDecl(_t_read, _t_reference, _t_ops),)

_NEXTN = ("nextn store latent", "nextn store indexer inputs")


def _n_read(draft, run: StateRun) -> dict[str, np.ndarray]:
    return dict(zip(_NEXTN, (np64(x) for x in draft.store_rows()), strict=True))


def _n_reference(run: StateRun) -> dict[str, np.ndarray]:
    n = run.length + 1                   # tokens up to the anchor; the target's post-norm rows up to length-1
    return dict(zip(_NEXTN, ref_mtp.store_rows(run.target_spec, run.seq[:n], run.ref.final[:n - 1]), strict=True))


def _n_ops(run: StateRun) -> dict[str, list[Op]]:
    t = run.target_spec
    h = t.hidden_size
    inp = layer_ops(t.layer, run.length) * t.num_layers + [
        Op("streams mean", t.hc.count), Op("final norm", h), Op("enorm / hnorm", h), Op("eh_proj", 2 * h),
        Op("input_layernorm", h)]
    return {_NEXTN[0]: inp + [Op("kv_a", h), Op("kv_a_layernorm", t.mla.kv_lora_rank)], _NEXTN[1]: inp}


GLM5NEXT_NEXTN_STATE = (StateDecl(_n_read, _n_reference, _n_ops),)
