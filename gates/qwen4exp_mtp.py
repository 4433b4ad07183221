"""Gate qwen4exp-mtp: a qwen4exp (Qwen3.8-Flash-Next) target drafting with its MTP head (the HF ``mtp.*`` layout
in the target's own safetensors; docs/FAMILIES_MOE.md 4.5 and 6).

Width 3 (verify rows 4): bloomery's serving window for this target (4-row windows, issue 25), the qwen38 / qwen35moe
MTP gates' width, and the chain depth the fixture's head is trained for (``families.qwen4exp.fixture``).

The head reads the target's 4 RAW hyper-connection streams of the last layer (neither their mean nor the
mixer's normed streams), per stream ``[n(e) enorm | n(h_s) hnorm_s]`` and eh_proj, an HC-wrapped dense gated
attention and an HC-wrapped MoE, then its own hc_head (``reference.families.qwen4exp.mtp``). The (r) lines check
the first window after the prompt, each drafted row (its output streams, its logits) against that f64 reference
run on the engine's own target streams, following the kernel's chain ids, then the draft ids; the target's MoE
routing lines come from the family's ``check_extra``. Tier 3: no outside oracle exists for this head
(transformers ignores ``^mtp.*``, llama.cpp has no qwen4exp MTP graph): a note says so; the trunk's (o) lines are
the family's transformers oracle.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.contract import Report
from bloomery_cli.families.qwen4exp.reader_mtp_hf import load_qwen4exp_mtp
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_gates.spec import Qwen4ExpMTPSpec

from ..kernels.families.ffn import record_routing
from ..kernels.families.qwen4exp.mtp import WIDTH, Qwen4ExpMTPDraft
from ..reference.families.qwen4exp import mtp as ref_mtp
from .close import close
from .fixtures import FIXTURES, PROMPTS
from .routing_flips import chained_choices
from .state_decls_qwen4exp import QWEN4EXP_MTP_STATE, hc_residual_ops
from .targets import greedy_flips, to_np


def mtp_ops(c: DraftCheck, row: int, logits: bool) -> list[Op]:
    """Row ``row`` (1-based) of a chain: the target's layers, then per chained step enorm / hnorm, eh_proj (2H), the
    attention and MoE layer each behind its gated residual; logits add the hc_head collapse and the head."""
    t = c.target_spec
    h, seq = t.hidden_size, len(c.prompt) + row
    hc = hc_residual_ops(t)
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), *hc, *layer_ops(t.layer, seq), *hc, Op("hc inject", 1)]
    ops = layer_ops(t.layer, len(c.prompt)) * t.num_layers + step * row
    return ops + ([*hc, Op("lm head", h)] if logits else [])


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    with record_routing() as calls:
        got = c.draft.propose(anchor, detail=True)
    streams = to_np(c.prefill.taps[-1])                  # the engine's own raw streams of the last layer
    ref, emu = chained_choices(             # the MTP's router with the kernel's choices (routing_flips)
        report, "mtp: ", lambda: ref_mtp.draft(c.draft_spec, c.target_spec, c.prompt, streams, anchor,
                                               c.draft.width, chain_ids=got.ids),
        [r for _, r in calls], len(c.prompt), c.draft.width, c.dtype, lambda k: mtp_ops(c, k + 1, logits=False))
    out, logits = to_np(got.layer_out[0]), to_np(got.logits)
    sh, v = out.shape[1], logits.shape[1]
    for i in range(out.shape[0]):
        close(report, f"mtp row {i + 1} output streams [1x{sh}]", out[i], ref.layer_out[i], emu.layer_out[i],
              c.dtype, mtp_ops(c, i + 1, logits=False))
    bands = [close(report, f"mtp row {i + 1} logits [1x{v}]", logits[i], ref.logits[i], emu.logits[i], c.dtype,
                   mtp_ops(c, i + 1, logits=True)) for i in range(logits.shape[0])]
    differ, excused = greedy_flips(logits, ref.logits, max(bands, key=lambda b: b.value))
    report.integer_match("mtp draft ids", logits.shape[0], differ, excused)


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    report.note("(o) mtp: no outside oracle exists for qwen4exp's MTP head (transformers ignores ^mtp.*, llama.cpp "
                "has no qwen4exp MTP graph); the f64 reference above is the only check of the draft")


def describe(d: Qwen4ExpMTPSpec) -> dict:
    return {"width": WIDTH, "verify_rows": WIDTH + 1, "mtp_layers": d.num_layers, "format": d.source_format,
            "hidden": f"the {d.hc.count} raw HC streams of the last layer", "rotary_dim": d.rotary_dim,
            "borrows": "embedding and head from the target" if d.borrows else "its own embedding and head"}


GATE = GateDef(
    name="qwen4exp-mtp", family="qwen4exp", draft_kind="mtp",
    target=FIXTURES / "qwen4exp-tiny", draft=FIXTURES / "qwen4exp-tiny", prompts=PROMPTS,
    about="qwen4exp (Qwen3.8-Flash-Next: HC streams, QSA, PLE, MoE) target + its MTP head (mtp.*) fed the 4 raw "
          "streams: 3 chained drafts, own KV store",
    load_draft=lambda path, target: load_qwen4exp_mtp(Path(path), target),
    make_draft=lambda spec, engine, max_len: Qwen4ExpMTPDraft(spec, engine, max_len, WIDTH),
    block=lambda d: WIDTH + 1, describe=describe, check_draft=check_draft,
    check_draft_oracle=check_oracle,
    draft_state=QWEN4EXP_MTP_STATE,
)
