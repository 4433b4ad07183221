"""Gate glm5next-mtp: a glm5next (GLM-5.3) target drafting with its own NextN layer (``model.layers.{n}.*`` in the
target's file): a plain-residual MLA + full DSA indexer + sparse FFN block fed the target's post-norm row
rms(mean of the 4 streams, model.norm), chained WIDTH = 3 times a window (verify rows 4), each chained row fed the
block's own g = shared_head.norm(z) with the drafted id (DRAFTERS.md section 1; the qwen38-mtp gate's width and
reasons: the real row, chained rows reading chained rows' latent and indexer keys, rollback of up to 3 rows).

(r) lines, beyond the target's (each layer, the head, the chosen experts of every sparse layer): the rows the NextN
reads (the engine's post-norm rows against the reference's rms(mean of the streams) of the same streams: a band of two
ops, so the wrong stream or the pre-norm mean shows even in bf16), the NextN block's chosen experts and its indexer's
chosen tokens (tier 1, the host transcription of the kernel's rule on its own float32 scores; per pass of the first
window: the real rows and each chained row), then each
drafted row (its output z before shared_head.norm, its logits) against ``reference.families.glm5next.mtp.draft`` on
the engine's own target streams (so the lines measure the draft from the streams' mean on), following the kernel's
chain ids, and the draft ids. After the loop: the target's MLA latents, indexer inputs, KDA conv tails and states,
and the NextN store (``gates.state_decls_glm5next``). (o): no outside oracle runs the NextN layer (transformers
ignores ``layers.{n}``, llama.cpp throws on glm5-next's NextN graph): one note line says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.contract import Report
from bloomery_cli.families.glm5next.reader_mtp import glm5next_nextn_from_file
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_gates.spec import Glm5NextSpec

from ..kernels.families.glm5next.mtp import WIDTH, Glm5NextNDraft
from ..reference.families.glm5next import model as ref_model
from ..reference.families.glm5next import mtp as ref_mtp
from ..reference.ops import dsa as rdsa
from .close import close, exact_and_emulated
from .fixtures import FIXTURES, PROMPTS
from .moe_checks import HOST, chosen_experts, rule_of
from .routing_flips import chained_choices
from .state_decls_glm5next import GLM5NEXT_NEXTN_STATE
from .targets import greedy_flips, to_np


def nextn_ops(c: DraftCheck, row: int, logits: bool) -> list[Op]:
    """Row ``row`` (1-based) of a chain: the target's layers, the streams' mean and final norm, then per chained
    step enorm / hnorm, eh_proj (2H), one layer (MLA + MoE) and shared_head.norm; logits add the head."""
    t = c.target_spec
    h, seq = t.hidden_size, len(c.prompt) + row
    trunk = layer_ops(t.layer, len(c.prompt)) * t.num_layers + [Op("streams mean", t.hc.count),
                                                                Op("target final norm", h)]
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), *layer_ops(t.layer, seq)]
    ops = trunk + (step + [Op("shared_head.norm", h)]) * (row - 1) + step
    return ops + ([Op("shared_head.norm", h), Op("lm head", h)] if logits else [])


def target_rows(c: DraftCheck):
    """The target's post-norm rows over the prompt, float64, from the engine's own last-layer streams."""
    return ref_model.final_norm(c.target_spec, to_np(c.prefill.taps[-1]))


def chosen_tokens(report: Report, what: str, sel, dsa) -> bool:
    """Tier 1, the indexer's choice: the device's token mask [R, L] against the host transcription of the rule
    (``reference.ops.dsa``: candidates, ``choose_pools`` on the device's own float32 scores, the tail rule when the
    checkpoint sets it, ``token_mask``), row for row, no band. Also records how many tokens each row sees."""
    mask = sel.mask.detach().cpu().numpy()
    scores = sel.scores.detach().float().cpu().numpy()
    r, length = mask.shape
    pos = np.arange(length - r, length)
    cand = rdsa.candidates(pos, scores.shape[1], dsa.kpool)
    pools = rdsa.choose_pools(scores, cand, dsa.topk // dsa.kpool)
    want = rdsa.token_mask(pools, rdsa.tail_tokens(pos, dsa.kpool) if dsa.select_tail else None, length, dsa.kpool)
    differ = int((mask != want).any(axis=-1).sum())
    seen = mask.sum(-1)
    report.facts.setdefault("indexer", {})[what] = {"keys": length, "topk_tokens": dsa.topk, "kpool": dsa.kpool,
                                                    "tokens_seen_max": int(seen.max()),
                                                    "rows_selecting": int((seen < pos + 1).sum())}
    return report.integer_match(f"{what} chosen tokens [{r}x{length}]", r, differ, 0, ref=HOST)


def check_draft(report: Report, c: DraftCheck) -> None:
    spec: Glm5NextSpec = c.draft_spec
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    rows, rows_emu = exact_and_emulated(c.dtype, lambda: target_rows(c))
    h = c.draft.target_rows(c.prefill.taps)
    close(report, f"nextn hidden in [{h.shape[0]}x{h.shape[1]}]", to_np(h), rows, rows_emu, c.dtype,
          [Op("streams mean", spec.hc.count), Op("target final norm", spec.hidden_size)])
    got = c.draft.propose(anchor, detail=True)
    chosen_experts(report, "nextn (first window's real rows)", c.draft.routings[0], rule_of(spec.moe))
    for i, sel in enumerate(c.draft.selections):
        chosen_tokens(report, "nextn indexer " + ("(first window's real rows)" if i == 0 else f"chained row {i + 1}"),
                      sel, spec.dsa)
    ref, emu = chained_choices(             # the NextN's router with the kernel's choices (routing_flips)
        report, "nextn: ", lambda: ref_mtp.draft(spec, c.prompt, rows, anchor, c.draft.width, chain_ids=got.ids),
        c.draft.routings, len(c.prompt), c.draft.width, c.dtype, lambda k: nextn_ops(c, k + 1, logits=False))
    out, logits = to_np(got.layer_out[0]), to_np(got.logits)
    h, v = out.shape[1], logits.shape[1]
    for i in range(out.shape[0]):
        close(report, f"nextn row {i + 1} layer out [1x{h}]", out[i], ref.layer_out[i], emu.layer_out[i], c.dtype,
              nextn_ops(c, i + 1, logits=False))
    bands = [close(report, f"nextn row {i + 1} logits [1x{v}]", logits[i], ref.logits[i], emu.logits[i], c.dtype,
                   nextn_ops(c, i + 1, logits=True)) for i in range(logits.shape[0])]
    differ, excused = greedy_flips(logits, ref.logits, max(bands, key=lambda b: b.value))
    report.integer_match("nextn draft ids", logits.shape[0], differ, excused)


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    report.note("(o) nextn: no outside oracle runs the GLM-5.3 NextN layer (transformers ignores layers.{n}, "
                "llama.cpp's glm5-next NextN graph throws); the f64 reference is the only check of the draft")


def describe(d: Glm5NextSpec) -> dict:
    return {"width": WIDTH, "verify_rows": WIDTH + 1, "nextn_layers": d.nextn_layers,
            "hidden": "post: rms(mean of the streams, model.norm); chained rows g = shared_head.norm(z)",
            "indexer": f"full, top-{d.dsa.topk} tokens in pools of {d.dsa.kpool}, tail rule {d.dsa.select_tail}",
            "format": d.source_format}


GATE = GateDef(
    name="glm5next-mtp", family="glm5next", draft_kind="mtp",
    target=FIXTURES / "glm5next-tiny", draft=FIXTURES / "glm5next-tiny", prompts=PROMPTS,
    about="glm5next (GLM-5.3: KDA + MLA/DSA, mHC x4, sigmoid-routed MoE) target + its NextN layer (MLA + DSA + MoE, "
          "no mHC): 3 chained drafts",
    load_draft=lambda path, target: glm5next_nextn_from_file(Path(path), target),
    make_draft=lambda spec, engine, max_len: Glm5NextNDraft(spec, engine, max_len, WIDTH),
    block=lambda d: WIDTH + 1, describe=describe, check_draft=check_draft, check_draft_oracle=check_oracle,
    draft_state=GLM5NEXT_NEXTN_STATE,
)
