"""(o) lines for a sliding-window DFlash draft: the window rule against transformers' own mask function.

speculators' DFlash defines a different window (W context rows before the block start, ``NotModelled``), and
z-lab's model code is not run here (no checkpoint code is ever run), so the tier-3 check of the rule is
transformers' ``masking_utils.sliding_window_causal_mask_function(W)`` (``kv > q - W`` and ``kv <= q``: the rule
vLLM runs z-lab's sliding layers with, ``formats.sliding``) evaluated on the first block's absolute positions:
queries s..s+B-1, keys 0..s+B-1. Each sliding layer's mask, the kernel's (``DFlashDraft.layer_masks``, its
context store cut to the s written rows) and the reference's (``sliding_mask`` as ``reference/drafts/dflash``
calls it), must equal it entry for entry. Then the draft's logits go to speculators where its definition covers the spec
(``draft_oracle.check_dflash``, a note line otherwise).
"""

from __future__ import annotations

import numpy as np
import torch

from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck

from ..reference.drafts import dflash as ref_dflash
from .draft_oracle import check_dflash

TAG, REF = "(o)", "transformers sliding_window_causal_mask_function"


def transformers_mask(pos_q: np.ndarray, pos_kv: np.ndarray, window: int) -> np.ndarray | None:
    """transformers' causal sliding-window mask [Q, S] on absolute positions, or None if it does not import."""
    try:
        from transformers.masking_utils import sliding_window_causal_mask_function
    except ImportError:
        return None
    fn = sliding_window_causal_mask_function(window)
    q, k = torch.as_tensor(pos_q)[:, None], torch.as_tensor(pos_kv)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    return fn(zero, zero, q, k).expand(len(pos_q), len(pos_kv)).numpy()


def check_windows(report: Report, c: DraftCheck) -> None:
    d = c.draft_spec
    c.draft.prompt(c.prefill.taps)
    s, b = c.draft.ctx_len, d.block_size
    pos_q, pos_kv = np.arange(s, s + b), np.arange(s + b)
    cap = c.draft.k_ctx.shape[3]
    masks = c.draft.layer_masks(s)
    for i, w in enumerate(d.windows):
        if w is None:
            continue
        want = transformers_mask(pos_q, pos_kv, w)
        if want is None:
            report.note("(o) sliding-window mask vs transformers: not checked, transformers.masking_utils does not "
                        "import")
            return
        k = masks[i].cpu().numpy()
        kernel = np.concatenate([k[:, :s], k[:, cap:]], axis=1)
        report.integer_match(f"kernel dflash layer {i} window {w} mask [{b}x{s + b}]", want.size,
                             int((kernel != want).sum()), 0, tag=TAG, ref=REF)
        report.integer_match(f"host f64 dflash layer {i} window {w} mask [{b}x{s + b}]", want.size,
                             int((ref_dflash.sliding_mask(pos_q, pos_kv, w) != want).sum()), 0, tag=TAG, ref=REF)


def check_swa(report: Report, c: DraftCheck, plain_ids: list[int] | None = None) -> None:
    check_windows(report, c)
    check_dflash(report, c, plain_ids)
