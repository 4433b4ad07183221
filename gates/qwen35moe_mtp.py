"""Gate qwen35moe-mtp: a qwen35moe (Qwen3.5/3.6-MoE) target drafting with its own shipped MTP head.

The qwen38-mtp gate (``gates.qwen38_mtp``: width 3, verify rows 4, the same (r) lines, state and oracle checks) on the
MoE hybrid: the target's FFNs and the MTP layer's FFN are the softmax top-k MoE with the sigmoid-gated shared expert
(``kernels.families.ffn``). Beyond qwen38-mtp the target check prints one tier-1 line per MoE layer, the chosen
experts against the host transcription of the kernel's rule (``gates.moe_checks``), and the record carries the
expert load per layer. Tier 3: transformers' ``Qwen3_5MoeForCausalLM`` (true f64, eager experts) for the target and
its ``MtpModel`` with the 2-key shim (num_mtp_layers, mtp_layer_types) for the head (FAMILIES_MOE.md 3).
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.gatekit import GateDef
from bloomery_cli.loading import load_mtp

from ..kernels.drafts.mtp import MTPDraft
from .fixtures import FIXTURES, PROMPTS
from .qwen38_mtp import WIDTH, check_draft, check_oracle, describe
from .state_decls import MTP_STATE

GATE = GateDef(
    name="qwen35moe-mtp", family="qwen35moe", draft_kind="mtp",
    target=FIXTURES / "qwen35moe-tiny", draft=FIXTURES / "qwen35moe-tiny", prompts=PROMPTS,
    about="qwen35moe (Qwen3.5/3.6-MoE hybrid) target + its shipped MTP head (mtp.*, MoE layer): 3 chained drafts",
    load_draft=lambda path, target: load_mtp(Path(path), target),
    make_draft=lambda spec, engine, max_len: MTPDraft(spec, engine, max_len, WIDTH),
    block=lambda d: WIDTH + 1, describe=describe, check_draft=check_draft,
    check_draft_oracle=check_oracle,
    draft_state=MTP_STATE,
)
