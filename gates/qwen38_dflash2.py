"""Gate qwen38-dflash2: a qwen38 (Qwen3.5/3.8 dense hybrid) target with a DFlash2 block drafter.

The drafter code is qwen3-dflash2's (``kernels.drafts.dflash2``, ``reference.drafts.dflash2``): its context
features are the hybrid stack's layer outputs, and a feature from the last layer goes through the target's
zero-centred final norm (``draft_checks.kernel_taps`` applies the family's own final norm). The
(r) lines, bands and selector checks are qwen3-dflash2's (``qwen3_dflash2.dflash2_ops`` / ``check_selector``),
on the first block after the first prompt, the f64 reference reading the engine's own taps. Block 8, as the
qwen38-dflash fixture, so the two gates' accept_mean compare; the published figures are printed beside ours,
marked external.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.gatekit import GateDef
from bloomery_cli.loading import load_dflash2

from ..kernels.drafts.dflash2 import DFlash2Draft
from ..kernels.drafts.dflash2_fast import FastDFlash2Draft
from .draft_oracle import check_dflash2
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dflash2 import ANCHORS, check_draft, describe
from .state_decls import DFLASH2_STATE

GATE = GateDef(
    name="qwen38-dflash2", family="qwen38", draft_kind="dflash2",
    target=FIXTURES / "qwen38-tiny", draft=FIXTURES / "qwen38-tiny-dflash2-b8", prompts=PROMPTS,
    about="qwen38 hybrid target + DFlash2 block drafter (dynamic depthwise conv, low-rank top-K path selector, "
          "B-1 drafts)",
    load_draft=lambda path, target: load_dflash2(Path(path), target),
    make_draft=lambda spec, engine, max_len: DFlash2Draft(spec, engine, max_len),
    make_fast_draft=lambda spec, engine, max_len: FastDFlash2Draft(spec, engine, max_len),
    block=lambda d: d.block_size, describe=describe, check_draft=check_draft, anchors=ANCHORS,
    check_draft_oracle=check_dflash2,
    draft_state=DFLASH2_STATE,
)
