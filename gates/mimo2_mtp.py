"""Gate mimo2-mtp: a mimo2 (MiMo-V2-Flash) target drafting with its own 3 shipped MTP layers, chained: layer k drafts
the (k+1)-th token of a window (width 3, verify rows 4; the depth the checkpoint ships and llama.cpp's converter
hard-codes). Option ``mtp_hidden`` (CLI ``--mtp-hidden post|pre``): which target hidden the head reads and each
layer recycles; default "post", the checkpoint's own convention (HF MtpModel, vLLM), "pre" is llama.cpp's; the load
line names the one that ran.

(r) lines, beyond the target's: the chosen experts of every sparse target layer over the prompt (tier 1, against
the host transcription of the kernel's own rule on its own float32 scores, ``gates.moe_checks``; the expert load
goes to the record), then each drafted row (layer k's row at position T+k: its output before final_layernorm, its
logits) against ``reference.families.mimo2.mtp.draft`` on the engine's own target rows, following the kernel's chain
ids, and the draft ids. (o): transformers' ``MtpModel`` (FAMILIES_MOE.md section 3's shim) teacher-forced, per
layer, against the f64 reference chain (post-norm runs; a note for pre); on a GGUF target also llama.cpp's MTP graph,
its 3 layers chained in its pre-norm convention (``bloomery_cli.families.mimo2.oracle_llamacpp``).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.bands import Op, layer_ops, logits_band, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef, GateOption, one_of
from bloomery_cli.loading import load_mimo2_mtp
from bloomery_gates.kernels.families.mimo2.mtp import Mimo2MTPDraft
from bloomery_gates.reference.families.mimo2 import mtp as ref_mtp
from bloomery_gates.reference.families.mimo2.model import forward
from bloomery_gates.spec import Mimo2MTPSpec

from ..reference.ops.norm import rms_norm
from ..reference.weights import as_f64
from .close import close, exact_and_emulated
from .fixtures import FIXTURES, PROMPTS
from .moe_checks import chosen_experts, group_rule, routed_scale_probe
from .state_decls_mimo2 import MIMO2_MTP_STATE
from .targets import greedy_flips, to_np

HIDDEN_WHY = {"post": "post-norm in and recycled (HF MtpModel / vLLM; the checkpoint's own)",
              "pre": "pre-norm in and recycled (llama.cpp)"}


def mtp_ops(c: DraftCheck, k: int, logits: bool) -> list[Op]:
    """Layer k's drafted row: the target's layers and final norm, then per chained layer j <= k its input norms,
    eh_proj (2H), one SWA layer and final_layernorm; logits add the head."""
    t = c.target_spec
    h, seq = t.hidden_size, len(c.prompt) + k + 1
    trunk = layer_ops(t.layer, len(c.prompt)) * t.num_layers + [Op("target final norm", h)]
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), *layer_ops(t.layer, seq), Op("final_layernorm", h)]
    return trunk + step * (k + 1) + ([Op("lm head", h)] if logits else [])


def target_rows(c: DraftCheck, hidden: str):
    """The target rows the head reads over the prompt, float64, from the engine's own last-layer taps."""
    last = to_np(c.prefill.taps[-1])
    if hidden == "pre":
        return last
    return rms_norm(last, as_f64(c.target_spec)["model.norm.weight"], c.target_spec.layer.rms_eps)


def check_routing(report: Report, c: DraftCheck) -> None:
    """Tier 1: every sparse target layer's chosen experts over the prompt (the prefill's routing)."""
    m = c.target_spec.mimo.moe
    if m is None:
        return
    for l, routing in sorted(c.engine.routings.items()):
        chosen_experts(report, f"target layer {l}", routing, group_rule(m.top_k, m.n_group,
                                                                        m.topk_group))
    first = min(c.engine.routings, default=None)
    if first is not None:
        routed_scale_probe(report, m, c.target_spec.tensors[f"model.layers.{first}.mlp.gate.e_score_correction_bias"])


def check_draft(report: Report, c: DraftCheck) -> None:
    check_routing(report, c)
    spec: Mimo2MTPSpec = c.draft_spec
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    rows = target_rows(c, spec.hidden)
    ref, emu = exact_and_emulated(c.dtype, lambda: ref_mtp.draft(spec, c.target_spec, c.prompt, rows, anchor,
                                                                 spec.hidden, chain_ids=got.ids))
    y, logits = to_np(got.layer_out[0]), to_np(got.logits)
    h, v = y.shape[1], logits.shape[1]
    for k in range(y.shape[0]):
        close(report, f"mtp layer {k} row {k + 1} out [1x{h}]", y[k], ref.y[k], emu.y[k], c.dtype,
              mtp_ops(c, k, logits=False))
    bands = [close(report, f"mtp layer {k} row {k + 1} logits [1x{v}]", logits[k], ref.logits[k], emu.logits[k],
                   c.dtype, mtp_ops(c, k, logits=True)) for k in range(logits.shape[0])]
    differ, excused = greedy_flips(logits, ref.logits, max(bands, key=lambda b: b.value))
    report.integer_match("mtp draft ids", logits.shape[0], differ, excused)


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    """(o) the f64 reference chain against transformers' MtpModel, teacher-forced over the prompt and the plain
    run's first ids, per layer: logits and greedy ids."""
    from bloomery_cli.families.mimo2.oracle import hf_mtp_chain
    from bloomery_cli.families.mimo2.oracle_llamacpp import check_mtp_chain
    from bloomery_cli.oracle.llamacpp import is_gguf_target

    spec: Mimo2MTPSpec = c.draft_spec
    if is_gguf_target(c.target_spec):       # llama.cpp's MTP graph on the file (its pre-norm chain)
        check_mtp_chain(report, c.target_spec, spec, list(c.prompt) + list(plain_ids[:32]))
    if spec.hidden != "post":
        report.note("(o) mtp: transformers' MtpModel runs the post-norm convention only; this run is --mtp-hidden "
                    "pre, so no tier-3 line for the draft")
        return
    seq = list(c.prompt) + list(plain_ids[:32])
    hf = hf_mtp_chain(c.target_spec, seq, spec.num_layers)
    if hf is None:
        report.note("(o) mtp: the installed transformers has no MtpModel with forward_layer / _project_to_logits "
                    "(5.17 lacks them); no tier-3 line for the draft")
        return
    ours = ref_mtp.chain(spec, c.target_spec, seq, forward(c.target_spec, seq).final, "post")
    t = c.target_spec
    for k, want in enumerate(hf):
        band = logits_band("f64", t.layer, t.num_layers + 2 * (k + 1), len(seq))
        report.reference(f"mtp layer {k} logits [{want.shape[0]}x{want.shape[1]}]", want.size,
                         worst_rel(ours.logits[k], want), band.value, tag="(o)", ref="transformers MtpModel f64")
        differ, excused = greedy_flips(ours.logits[k], want, band)
        report.integer_match(f"mtp layer {k} greedy ids", want.shape[0], differ, excused, tag="(o)",
                             ref="transformers MtpModel f64")


MTP_HIDDEN = GateOption("post", "mimo2-mtp: which target hidden the MTP head reads and recycles: post (HF / vLLM, "
                        "the checkpoint's own; default) or pre (llama.cpp).", one_of("post", "pre"), "post|pre")


def make_draft(spec: Mimo2MTPSpec, engine, max_len: int, mtp_hidden: str = "post") -> Mimo2MTPDraft:
    return Mimo2MTPDraft(spec, engine, max_len, hidden=mtp_hidden)


def describe(d: Mimo2MTPSpec, mtp_hidden: str = "post") -> dict:
    return {"width": d.num_layers, "verify_rows": d.num_layers + 1, "mtp_layers": d.num_layers,
            "mtp_hidden": f"{mtp_hidden}: {HIDDEN_WHY[mtp_hidden]}", "window": d.attn.window,
            "format": d.source_format}


GATE = GateDef(
    name="mimo2-mtp", family="mimo2", draft_kind="mtp",
    target=FIXTURES / "mimo2-tiny", draft=FIXTURES / "mimo2-tiny", prompts=PROMPTS,
    about="mimo2 (MiMo-V2-Flash) target: SWA + sinks, routed experts; its 3 shipped MTP layers chained, one draft "
          "per layer, own KV stores",
    load_draft=lambda path, target: load_mimo2_mtp(Path(path), target),
    make_draft=make_draft, block=lambda d: d.num_layers + 1, describe=describe, check_draft=check_draft,
    check_draft_oracle=check_oracle, options={"mtp_hidden": MTP_HIDDEN},
    draft_state=MIMO2_MTP_STATE,
)
