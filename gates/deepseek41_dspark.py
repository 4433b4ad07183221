"""Gate ds41-dspark: a deepseek41 (DeepSeek V4.1) target with the seed engine's V4.1 DSpark block draft
(docs/FAMILIES_MOE.md 5.2, ``spec.rs`` ``draft_of``): 1 V4.1 stage (window-only attention without the per-head q
norm, lagged HC mixes, sqrt-softplus MoE + shared expert) behind fc over the hc-stream mean of the S streams
ENTERING target layers 2 and 4 (the taps' lag row dropped), the LastMix collapse (no trained HC head), a Markov head
of rank 4 and a confidence head; the target's embedding and head. Verify rows per pass: B + 1.

The contract lines are ds4-dspark's (``gates.deepseek4_dspark.check_draft``, the same kernel and reference modules
with the V4.1 variants named by the spec: ``hc_mix`` "lagged", ``collapse`` "last_mix", ``q_head_norm`` False): the
target's chosen experts, each stage's output state (streams and the carried lag row), the logits with the Markov
term, the draft ids, the chain rule, the confidence logits on the PRE-norm collapse and the cut, the cut windows;
state after the loop: the target's caches (``state_decls_deepseek41``) and every stage's context K = V, the next
block's confidence logits (``state_decls_deepseek4``). No (o) line: no outside code runs V4.1 or its DSpark
(FAMILIES_MOE.md 5.2: llama.cpp's loader requires ``output_hc_fn``).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.gatekit import GateDef
from bloomery_gates.spec import Deepseek41DSparkSpec

from .deepseek4_dspark import check_draft, describe, make_draft
from .fixtures import FIXTURES, PROMPTS
from .qwen3_dspark import CONFIDENCE_CUT
from .state_decls_deepseek4 import DEEPSEEK4_DSPARK_STATE


def load_draft(path: Path, target) -> Deepseek41DSparkSpec:
    from bloomery_cli.families.deepseek41.reader_dspark import deepseek41_dspark_from_gguf

    return deepseek41_dspark_from_gguf(Path(path), target)


GATE = GateDef(
    name="ds41-dspark", family="deepseek41", draft_kind="dspark",
    target=FIXTURES / "ds41-tiny" / "ds41-tiny.gguf", draft=FIXTURES / "ds41-tiny-dspark-b7.gguf", prompts=PROMPTS,
    about="deepseek41 (DeepSeek V4.1) target + the seed engine's V4.1 DSpark draft (FAMILIES_MOE.md 5.2): a "
          "window-only lagged-HC / sqrt-softplus MoE stage over the hc-stream mean of target layers, LastMix, "
          "Markov + confidence heads",
    load_draft=load_draft, make_draft=make_draft, block=lambda d: d.block_size + 1, describe=describe,
    check_draft=check_draft, options={"confidence_cut": CONFIDENCE_CUT},
    draft_state=DEEPSEEK4_DSPARK_STATE,
)
