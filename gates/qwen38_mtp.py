"""Gate qwen38-mtp: a qwen38 (Qwen3.5/3.8 dense hybrid) target drafting with its own shipped MTP head.

Width 3 (verify rows 4), fixed and flag-free. Why 3: it is the serving setting engines document for the
Qwen3-Next / Qwen3.5 MTP layer (SGLang: speculative-num-steps 3, num-draft-tokens 4), the chain depth the
fixture's head is trained for (3 chained steps, ``fixturegen.qwen38_drafts``), and the smallest width at
which every part of the MTP path runs in a window: the real-hidden row, chained rows fed the draft's own g
(twice, so a chained row also reads a chained row's KV), and the rewrite of up to 3 kept positions; a partial
accept can land after any chain step. Not chosen from acceptance: on the CPU fixture (8 prompts x 256 ids,
f32) accept_mean by width 1..5 is 1.96, 2.92, 3.86, 4.65, 5.57, its repetitive greedy text keeping the
conditional rate near 0.9 at every position (numbers of the build this was written with).

The (r) lines check the first window after the prompt, each drafted row against ``reference.drafts.mtp`` run
on the engine's own target taps (so they measure the draft alone, from the post-final-norm hidden on).
``check_oracle`` is the tier-3 line against transformers' ``MtpModel``, and for a GGUF target whose draft is its
own nextn layer, llama.cpp's MTP graph (``bloomery_cli.oracle.llamacpp.check_mtp``).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.bands import Op, layer_ops, worst_rel
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_cli.loading import load_mtp
from bloomery_gates.reference.families.qwen38.model import norm1p
from bloomery_gates.spec import MTPSpec

from ..kernels.drafts.mtp import MTPDraft
from ..kernels.drafts.mtp_fast import FastMTPDraft
from ..kernels.families.ffn import record_routing
from ..reference.drafts import mtp as ref_mtp
from ..reference.weights import as_f64
from .close import close, exact_and_emulated
from .fixtures import FIXTURES, PROMPTS
from .routing_flips import chained_choices
from .state_decls import MTP_STATE
from .targets import greedy_flips, to_np

WIDTH = 3


def mtp_ops(c: DraftCheck, row: int, logits: bool) -> list[Op]:
    """Row ``row`` (1-based) of a chain: the target's final norm, then per chained step the two input norms,
    fc (n = 2H), one gated layer, and mtp.norm (the g fed to the next step); logits add the head."""
    s, h = c.target_spec.layer, c.target_spec.hidden_size
    seq = len(c.prompt) + row
    step = [Op("pre_fc norms", h), Op("fc", 2 * h), *layer_ops(s, seq), Op("output gate", 1)]
    ops = [Op("target final norm", h)] + (step + [Op("mtp.norm", h)]) * (row - 1) + step
    if logits:
        ops += [Op("mtp.norm", h), Op("lm head", h)]
    return ops


def kernel_final(c: DraftCheck):
    """The target's post-final-norm rows over the prompt, in float64, from the engine's own last-layer taps."""
    last = to_np(c.prefill.taps[-1])
    return norm1p(last, as_f64(c.target_spec)["model.norm.weight"], c.target_spec.layer.rms_eps)


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    with record_routing() as calls:
        got = c.draft.propose(anchor, detail=True)

    def reference():                     # the final norm inside: the emulated run rounds it too
        return ref_mtp.draft(c.draft_spec, c.target_spec, c.prompt, kernel_final(c), anchor, c.draft.width,
                             chain_ids=got.ids)
    if getattr(c.target_spec, "moe", None) is None:              # a dense MTP layer: no choice to check
        ref, emu = exact_and_emulated(c.dtype, reference)
    else:                                                         # qwen35moe: the MTP's router (routing_flips)
        ref, emu = chained_choices(report, "mtp: ", reference, [r for _, r in calls], len(c.prompt), c.draft.width,
                                   c.dtype, lambda k: mtp_ops(c, k + 1, logits=False))
    layer_out, logits = to_np(got.layer_out[0]), to_np(got.logits)
    h, v = layer_out.shape[1], logits.shape[1]
    for i in range(layer_out.shape[0]):
        close(report, f"mtp row {i + 1} layer out [1x{h}]", layer_out[i], ref.layer_out[i], emu.layer_out[i],
              c.dtype, mtp_ops(c, i + 1, logits=False))
    bands = [close(report, f"mtp row {i + 1} logits [1x{v}]", logits[i], ref.logits[i], emu.logits[i], c.dtype,
                   mtp_ops(c, i + 1, logits=True)) for i in range(logits.shape[0])]
    differ, excused = greedy_flips(logits, ref.logits, max(bands, key=lambda b: b.value))
    report.integer_match("mtp draft ids", logits.shape[0], differ, excused)


HF_NAMES = {"mtp.fc.weight": "layers.0.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "layers.0.enorm.weight",
            "mtp.pre_fc_norm_hidden.weight": "layers.0.hnorm.weight", "mtp.norm.weight": "layers.0.post_norm.weight"}


def hf_mtp_logits(target, mtp: MTPSpec, ids: list[int]):
    """transformers' own ``MtpModel`` (modeling_layers) on the target's ``Qwen3_5ForCausalLM``, float64, CPU:
    logits [T-1, V] of the teacher-forced rows j = 1..T-1 (token j, HF's post-final-norm hidden j-1), or None
    where the installed transformers has no MtpModel or builds it with other norms than the trunk's."""
    import torch

    from bloomery_cli.oracle.hf import Float32AsFloat64, build_hf_qwen38

    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:
        return None
    build = build_hf_qwen38
    if target.family == "qwen35moe":            # the same MtpModel shim over the MoE trunk (FAMILIES_MOE.md 3)
        from bloomery_cli.families.qwen35moe.oracle import build_hf_qwen35moe as build
    model = build(target)
    model.config.num_mtp_layers, model.config.mtp_layer_types = mtp.num_layers, ["full_attention"]
    with Float32AsFloat64():
        hf = MtpModel(model, mtp.num_layers).to(torch.float64).eval()
    if type(hf.layers[0].enorm) is not type(model.model.norm):
        return None
    if not (hasattr(hf, "forward_layer") and hasattr(hf, "_project_to_logits")):   # transformers 5.17 lacks them
        return None
    state = {HF_NAMES.get(k, k.replace("mtp.layers.0.", "layers.0.mtp_block.")): v.detach().double()
             for k, v in mtp.tensors.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight", "shared_head.weight"}:
        raise ValueError(f"MtpModel state dict: missing {missing}, unexpected {unexpected}")
    x = torch.tensor([list(ids)])
    with torch.no_grad(), Float32AsFloat64():
        final = model(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states[-1]
        h = hf.forward_layer(0, final[:, :-1], torch.arange(1, len(ids))[None], None, input_ids=x[:, 1:])
        return hf._project_to_logits(h)[0].numpy()


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    """(o) the f64 reference's MTP logits and greedy ids against transformers' MtpModel, teacher-forced over the
    prompt and the plain run's first ids; a note instead where the class is absent or does not fit."""
    from bloomery_cli.bands import logits_band
    from bloomery_gates.reference.families.qwen38.model import forward

    seq = list(c.prompt) + list(plain_ids[:32])
    hf = hf_mtp_logits(c.target_spec, c.draft_spec, seq)
    if hf is None:
        report.note("(o) mtp: transformers' MtpModel does not exist in the installed transformers or does not "
                    "support this layout; no tier-3 line for the draft")
        _llamacpp(report, c, plain_ids)
        return
    ours = ref_mtp.teacher_forced(c.draft_spec, c.target_spec, seq, forward(c.target_spec, seq).final)
    band = logits_band("f64", c.target_spec.layer, c.target_spec.num_layers + 2, len(seq))
    report.reference(f"mtp logits [{hf.shape[0]}x{hf.shape[1]}]", hf.size, worst_rel(ours.logits, hf), band.value,
                     tag="(o)", ref="transformers MtpModel f64")
    differ, excused = greedy_flips(ours.logits, hf, band)
    report.integer_match("mtp greedy ids", hf.shape[0], differ, excused, tag="(o)", ref="transformers MtpModel f64")
    _llamacpp(report, c, plain_ids)


def _llamacpp(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    """llama.cpp's MTP graph on a GGUF target's own nextn layer, over the same rows as the target's llama.cpp lines."""
    from bloomery_cli.oracle.llamacpp import check_mtp, is_gguf_target

    if is_gguf_target(c.target_spec):
        check_mtp(report, c.target_spec, c.draft_spec, list(c.prompt) + list(plain_ids[:64]))


def describe(d: MTPSpec) -> dict:
    return {"width": WIDTH, "verify_rows": WIDTH + 1, "mtp_layers": d.num_layers, "format": d.source_format,
            "rotary_dim": d.rotary_dim}


GATE = GateDef(
    name="qwen38-mtp", family="qwen38", draft_kind="mtp",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny", prompts=PROMPTS,
    about="qwen38 hybrid target + its shipped MTP head (mtp.*): 3 chained drafts per window, own KV store",
    load_draft=lambda path, target: load_mtp(Path(path), target),
    make_draft=lambda spec, engine, max_len: MTPDraft(spec, engine, max_len, WIDTH),
    make_fast_draft=lambda spec, engine, max_len: FastMTPDraft(spec, engine, max_len, WIDTH),
    block=lambda d: WIDTH + 1, describe=describe, check_draft=check_draft,
    anchors=("anchor (external, DFlash2 blog, Qwen3.8-27B B=8, thinking on, T=1): MTP tau 4.28; "
             "Qwen3.5-4B mean of 5 sets: MTP 4.54",),
    check_draft_oracle=check_oracle,
    draft_state=MTP_STATE,
)
