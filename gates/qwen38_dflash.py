"""Gate qwen38-dflash: a qwen38 (Qwen3.5/3.8 dense hybrid) target with a DFlash block drafter (z-lab layout).

The drafter code is qwen3-dflash's, unchanged (``kernels.drafts.dflash``, ``reference.drafts.dflash``): its
context features are the hybrid stack's layer outputs (Gated DeltaNet or gated-attention layers alike), and
a feature from the last layer goes through the target's zero-centred final norm (the engine's
``final_norm`` is the gain 1 + w). The (r) lines check the first block after the prompt against the f64
reference run on the engine's own taps.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.contract import Report
from bloomery_cli.gate import DraftCheck, GateDef
from bloomery_cli.loading import load_dflash

from ..kernels.drafts.dflash import DFlashDraft
from ..reference.drafts import dflash as ref_dflash
from ..reference.families.qwen3 import RefOut
from ..reference.families.qwen38 import norm1p
from ..reference.weights import as_f64
from .draft_checks import check_block
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dflash import describe
from .targets import to_np


def kernel_taps(c: DraftCheck) -> RefOut:
    """The engine's own taps over the prompt in float64, with ``final`` through the zero-centred final norm."""
    hidden = to_np(c.prefill.taps)
    final = norm1p(hidden[-1], as_f64(c.target_spec)["model.norm.weight"], c.target_spec.layer.rms_eps)
    return RefOut(logits=to_np(c.prefill.logits), hidden=hidden, final=final)


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    ref = ref_dflash.forward(c.draft_spec, c.target_spec, kernel_taps(c), anchor)
    check_block(report, c, "dflash", got, ref)


GATE = GateDef(
    name="qwen38-dflash", family="qwen38", draft_kind="dflash",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny-dflash-b8", prompts=PROMPTS,
    about="qwen38 hybrid target + DFlash block drafter (features from the hybrid stack, B-1 drafts per block)",
    load_draft=lambda path, target: load_dflash(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlashDraft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft,
    anchors=("anchor (external, DFlash2 blog, Qwen3.8-27B B=8, T=1): DFlash2 4.80, MTP 4.28 (no DFlash figure "
             "published for this target)",),
)
