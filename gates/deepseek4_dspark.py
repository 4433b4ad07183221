"""Gate ds4-dspark: a deepseek4 (DeepSeek V4) target with llama.cpp's DSV4 DSpark block draft (GGUF arch "dflash",
docs/FAMILIES_MOE.md 5.1): 2 DSV4 stages (window-only attention, mHC, sqrt-softplus MoE + shared expert) behind fc
over the hc-stream mean ENTERING target layers 2 and 4, V4's trained HC head as the collapse, a Markov head of rank
16 and a confidence head. Verify rows per pass: B + 1 (the anchor + B anchor-first drafts).

(r) lines, beyond the target's: the chosen experts of every target layer over the prompt (``deepseek4_mtp.
check_routing``), then on the first block after the first prompt the kernel against
``reference.families.deepseek4.dspark.forward`` on the engine's own taps, its Markov inputs teacher-forced with the
kernel's chain (row 0 the anchor): each stage's output streams, the logits (Markov term included), the draft
ids, the chain rule prev_0 = anchor / prev_k+1 = argmax_k (host rule), the confidence logits (on the PRE-norm
collapse) and the cut length, and the cut on every window at the probe thresholds (``dspark_cut``). State after
the loop: the target's caches and every stage's context K = V, the next block's confidence logits
(``state_decls_deepseek4``). No (o) line for the draft: transformers has no DSpark class, and llama.cpp's
``draft-dspark`` needs the target as a deepseek4 GGUF this branch does not write (``bloomery_cli.engines.llamacpp``
PAIRS); ``--oracle`` adds the target's transformers lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bloomery_cli.bands import Op
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_gates.spec import Deepseek4DSparkSpec

from ..kernels.families.deepseek4.dspark import Deepseek4DSparkDraft
from ..kernels.families.ffn import record_routing
from ..reference.families.deepseek4 import dspark as ref_dspark
from .close import close
from .deepseek4_mtp import check_routing
from .draft_checks import draft_ops, kernel_taps
from .dspark_cut import check_cut_windows
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dspark import CONFIDENCE_CUT, check_cut, check_rows
from .routing_flips import state_choices
from .state_decls_deepseek4 import DEEPSEEK4_DSPARK_STATE, collapse_op
from .targets import to_np


def stage_ops(c: DraftCheck, stages: int, logits: bool) -> list[Op]:
    """fc + enc_norm (one layer's worth) and ``stages`` DSV4 stages; logits add the HC collapse, the final norm, the
    head and the Markov term's two ops."""
    d: Deepseek4DSparkSpec = c.draft_spec
    h = d.hidden_size
    ops = draft_ops(c, stages, logits=False)
    if logits:
        ops += [collapse_op(d), Op("final norm", h), Op("lm head", h),
                Op("markov W2 . W1[prev]", max(d.markov_rank, 1)), Op("markov add", 1)]
    return ops


def check_block(report: Report, c: DraftCheck, got, ref, emu, anchor: int) -> None:
    """got: the kernel's DSparkProposal (detail=True); ref / emu the reference teacher-forced with got.prev."""
    out = to_np(got.layer_out)                             # [n_layers, B, S, H] (S+1: the lag row, V4.1)
    _, b, s, h = out.shape
    for i in range(out.shape[0]):
        close(report, f"dspark stage {i} out streams [{b}x{s}x{h}]", out[i], ref.layer_out[i], emu.layer_out[i],
              c.dtype, stage_ops(c, i + 1, False))
    check_rows(report, c, got, ref, emu, anchor, stage_ops(c, out.shape[0], True))
    if got.conf_logits is None:
        return
    z = to_np(got.conf_logits)
    d = c.draft_spec
    close(report, f"dspark confidence logits (pre-norm collapse) [{len(z)}]", z, ref.conf_logits, emu.conf_logits,
          c.dtype, stage_ops(c, out.shape[0], False) + [collapse_op(d),
                                                        Op("confidence proj", d.hidden_size + d.markov_rank)])
    check_cut(report, c, got)


def check_draft(report: Report, c: DraftCheck) -> None:
    check_routing(report, c)
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    with record_routing() as calls:                       # each stage's router (prefix "layers.<i>.")
        got = c.draft.propose(anchor, detail=True)
    prev = np.concatenate([[anchor], to_np(got.prev).astype(np.int64)[1:]])   # row 0 reads the anchor, always
    ref, emu = state_choices(                # each stage's router with the kernel's choices (routing_flips)
        report, "dspark block: ",
        lambda: ref_dspark.forward(c.draft_spec, c.target_spec, kernel_taps(c), anchor, prev=prev),
        {int(p.split(".")[1]): to_np(r.ids) for p, r in calls}, {}, c.dtype,
        lambda i: stage_ops(c, i + 1, False), who="draft", unit="stage")
    check_block(report, c, got, ref, emu, anchor)
    check_cut_windows(report, c, make=lambda t: Deepseek4DSparkDraft(c.draft_spec, c.engine, c.draft.max_len, t))


def load_draft(path: Path, target) -> Deepseek4DSparkSpec:
    from bloomery_cli.families.deepseek4.reader_dspark import deepseek4_dspark_from_gguf

    return deepseek4_dspark_from_gguf(Path(path), target)


def describe(d: Deepseek4DSparkSpec, confidence_cut: float = 0.0) -> dict[str, Any]:
    return {"block": d.block_size, "drafts": d.block_size, "stages": d.num_layers,
            "target_layers": [x + 1 for x in d.target_layer_ids], "features": "hc-stream mean entering each layer",
            "mask_id": d.mask_token_id, "window": d.attn.window, "collapse": d.collapse, "markov_rank": d.markov_rank,
            "confidence_head": d.confidence, "confidence_cut": confidence_cut,
            "own_embed": "embed_tokens.weight" in d.tensors, "own_head": "lm_head.weight" in d.tensors,
            "format": d.source_format}


def make_draft(spec: Deepseek4DSparkSpec, engine, max_len: int, confidence_cut: float = 0.0) -> Deepseek4DSparkDraft:
    return Deepseek4DSparkDraft(spec, engine, max_len, confidence_cut=confidence_cut)


GATE = GateDef(
    name="ds4-dspark", family="deepseek4", draft_kind="dspark",
    target=FIXTURES / "ds4-tiny", draft=FIXTURES / "ds4-tiny-dspark-b7.gguf", prompts=PROMPTS,
    about="deepseek4 (DeepSeek V4) target + llama.cpp's DSV4 DSpark draft (GGUF dflash): 2 window-only mHC / "
          "sqrt-softplus MoE stages over the hc-stream mean of target layers, V4's HC head, Markov + confidence heads",
    load_draft=load_draft, make_draft=make_draft, block=lambda d: d.block_size + 1, describe=describe,
    check_draft=check_draft, options={"confidence_cut": CONFIDENCE_CUT},
    draft_state=DEEPSEEK4_DSPARK_STATE,
)

