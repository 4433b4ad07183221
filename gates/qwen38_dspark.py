"""Gate qwen38-dspark: a qwen38 (Qwen3.5/3.8 dense hybrid) target with a DSpark drafter in the speculators layout.

The drafter code and checks are qwen3-dspark's, unchanged (``kernels.drafts.dspark``, ``reference.drafts.dspark``,
``qwen3_dspark.check_draft``): anchor-first B drafts, the serial vanilla Markov head, the confidence head and its
cut (``--confidence-cut``). Its context features are the hybrid stack's taps: the fixture reads
aux_hidden_state_layer_ids [0, 2, 3], i.e. target layer ids (-1, 1, 2): the embedding output and two Gated
DeltaNet layer outputs. The (r) lines check the first block after the prompt against the f64 reference run on
the engine's own taps, teacher-forced with the kernel's Markov chain; the draft's state after the loop and the
tier-3 speculators oracle are qwen3-dspark's too.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.gatekit import GateDef
from bloomery_cli.loading import load_dspark

from .draft_oracle import check_dspark
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dspark import CONFIDENCE_CUT, check_draft, describe, make_draft
from .state_decls import DSPARK_STATE

GATE = GateDef(
    name="qwen38-dspark", family="qwen38", draft_kind="dspark",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny-dspark-b7-speculators", prompts=PROMPTS,
    about="qwen38 hybrid target + DSpark drafter, speculators layout (anchor-first B drafts, serial Markov head, "
          "confidence cut; features from the embedding and the hybrid stack)",
    load_draft=lambda path, target: load_dspark(Path(path), target),
    make_draft=make_draft, block=lambda d: d.block_size + 1, describe=describe, check_draft=check_draft,
    anchors=("anchor (external, DSpark paper, T=1 B=7): Qwen3-8B GSM8K DSpark 6.17 vs DFlash 5.33 (no DSpark "
             "figure published for a Qwen3.5/3.8 target)",),
    options={"confidence_cut": CONFIDENCE_CUT}, check_draft_oracle=check_dspark,
    draft_state=DSPARK_STATE,
)
