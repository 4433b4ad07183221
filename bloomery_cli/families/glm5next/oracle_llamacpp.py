"""Tier-3 oracle for glm5next GGUF trunks: llama.cpp's own ``glm5-next`` graph on the file, in float32, against our
float64 reference on the same file (``oracle.llamacpp.check_target``: logits, prompt greedy ids, plain-run ids; band
``logits_band("f32", ...)``).

The routing both sides run is the file's: ``expert_group_count`` / ``expert_group_used_count`` are written by the
converter (its base class, from n_group / topk_group), read by llama.cpp's loader for every arch
(``llama-model.cpp`` ``load_hparams``: ``LLM_KV_EXPERT_GROUP_COUNT``, ``..._GROUP_USED_COUNT``) and applied in
``build_moe_ffn`` (``llama-graph.cpp``: the best groups by the sum of their top-2 biased scores, the others masked),
which glm5-next's graph calls; our reader puts them in ``MoEShape.n_group`` / ``topk_group``. So the fixture's 2-group
routing is in the file and compared as such (measured on ``glm5next-tiny.gguf``, 40 tokens: llama.cpp vs our grouped
reference 3.0e-7 rel, vs the same reference with groups off 2.6e-1). A line says which routing ran.

llama.cpp has no glm5-next NextN graph (an MTP context throws), so there is no llama.cpp line for the draft
(``llamacpp_run.mtp_blocker``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bloomery_gates.spec import Glm5NextSpec

from ...contract import Report
from ...oracle.llamacpp import check_target


def check_target_glm5next(report: Report, spec: Glm5NextSpec, seq: Sequence[int], ref_logits: np.ndarray,
                          prompt_len: int, plain_ids: Sequence[int], gguf: Path | None = None) -> None:
    """A note naming the routing the file carries, then ``check_target``'s lines."""
    m = spec.moe
    routing = (f"{m.n_group} expert groups, the best {m.topk_group} kept" if m.n_group > 1 else "ungrouped")
    report.note(f"(o) llama.cpp glm5-next routing: the file's ({routing}; expert_group_count / "
                "expert_group_used_count, read by llama.cpp's loader and applied in build_moe_ffn), the same as "
                "our reference on this file")
    check_target(report, spec, seq, ref_logits, prompt_len, plain_ids, gguf)
