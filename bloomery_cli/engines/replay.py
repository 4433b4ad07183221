"""The float64 reference replaying an engine's speculative loop, window by window, on the engine's own windows.

For one prompt the engine emitted ``seq`` = prompt + ids. A window that started after e emitted ids has its anchor
(the last committed id) at position s = len(prompt) - 1 + e and proposed p ids for positions s+1 .. s+p. The
reference, given the same context:

    taps      = the family's f64 forward over seq (causal: rows < s are the context's own)
    g_{s+1+i} = argmax taps.logits[s+i]                      the f64 target's greedy id after position s+i
    r         = the f64 drafter's proposal at (taps, s, anchor)   (dflash / dspark / dflash2 blocks, the MTP chain)
    kept_ref  = 1 + #leading i < p with r_i = g_{s+1+i}     the window's kept rows had the reference run it

so engine and reference are compared on the same windows (a paired comparison), not on two loops that drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bloomery_gates.reference.drafts import dflash as ref_dflash
from bloomery_gates.reference.drafts import dflash2 as ref_dflash2
from bloomery_gates.reference.drafts import dspark as ref_dspark
from bloomery_gates.reference.drafts import mtp as ref_mtp
from bloomery_gates.reference.families.deepseek4 import dspark as ref_ds4_dspark
from bloomery_gates.reference.families.mimo2 import mtp as ref_mimo2_mtp
from bloomery_gates.reference.xp import run

from ..speculative import kept_rows
from .record import Window

# draft kind -> (draft spec, target spec, taps, seq, s, width) -> (ids [>= width], decisions): decisions[j] is the
# row of values whose argmax chose draft j (the logits row; DFlash2: the walk's score row S_j[prev_j, :])
Propose = Callable[[Any, Any, Any, Sequence[int], int, int], tuple[np.ndarray, np.ndarray]]


def _block(module) -> Propose:
    def propose(d, t, taps, seq, s, width):
        out = module.forward(d, t, taps, int(seq[s]), s)
        return np.asarray(out.ids), np.asarray(out.logits)
    return propose


def _dflash2(d, t, taps, seq, s, width):
    """DFlash2 chooses by its selector's walk, not the logits' argmax: slot j's decision row is S_j[prev_j, :] over
    the K candidates (prev_0 = 0, prev_j = idx_{j-1}; reference.ops.selector). A draft the reference did not
    keep among its K candidates is outside this row: the near-tie test then has no row and does not excuse it."""
    out = ref_dflash2.forward(d, t, taps, int(seq[s]), s)
    sc, idx = np.asarray(out.scores), np.asarray(out.idx)
    prev = np.concatenate([[0], idx[:-1]]).astype(int)
    return np.asarray(out.ids), np.stack([sc[j, prev[j]] for j in range(len(idx))])


def _mtp(d, t, taps, seq, s, width):
    out = ref_mtp.draft(d, t, list(seq[:s]), np.asarray(taps.final)[:s], int(seq[s]), max(width, 1))
    return np.asarray(out.ids), np.asarray(out.logits)


def mtp_zero_first(d, t, taps, seq, s, width):
    """The MTP chain as llama.cpp's draft-mtp driver stores it (common/speculative.cpp): its MTP store also holds a
    row 0 that pairs token 0 with a ZERO hidden at position 0, which every later MTP query attends to; the
    checkpoint's own math (HF / vLLM, ``_mtp``) has no such row. Used only to name the cause of a difference."""
    from bloomery_gates.reference.families.qwen3.model import embed_rows

    fin = np.asarray(taps.final)
    toks, hid = list(seq[:s + 1]), [np.zeros(fin.shape[1])] + list(fin[:s])
    ids, logits = [], []
    for _ in range(max(width, 1)):
        out = ref_mtp.rows(d, t, embed_rows(t, toks), np.stack(hid), np.arange(len(toks)))
        ids.append(int(np.asarray(out.ids)[-1]))
        logits.append(np.asarray(out.logits)[-1])
        toks.append(ids[-1])
        hid.append(np.asarray(out.g)[-1])
    return np.asarray(ids), np.stack(logits)


def _mimo2(mode: str) -> Propose:
    """MiMo's 3 chained MTP layers reading the target's ``mode`` hidden (post: the checkpoint's own, HF / vLLM;
    pre: llama.cpp's convention, bloomery gate run mimo2-mtp --mtp-hidden)."""
    def propose(d, t, taps, seq, s, width):
        hid = np.asarray(taps.final if mode == "post" else taps.hidden[-1])[:s]
        out = ref_mimo2_mtp.draft(d, t, list(seq[:s]), hid, int(seq[s]), mode)
        return np.asarray(out.ids), np.asarray(out.logits)
    return propose


def _deepseek4(d, t, taps, seq, s, width):
    """The V4 MTP block chained ``width`` deep from the target's 4 RAW streams (its last layer's output before the
    HC head) of the context rows and the anchor (``reference.families.deepseek4.mtp.draft``)."""
    from bloomery_gates.reference.families.deepseek4 import mtp as ref_ds4_mtp

    out = ref_ds4_mtp.draft(d, t, list(seq[:s]), np.asarray(taps.hidden[-1])[:s], int(seq[s]), max(width, 1))
    return np.asarray(out.ids), np.asarray(out.logits)


# a known engine convention per (family/)kind: what it is, and the f64 drafter that follows it
CONVENTIONS: dict[str, tuple[str, Propose] | None] = {
    "mtp": ("llama.cpp's draft-mtp store row 0: token 0 paired with a zero hidden", mtp_zero_first),
    "mimo2/mtp": ("llama.cpp's MiMo MTP reading the pre-norm hidden", _mimo2("pre")),
    "deepseek4/mtp": None}          # none known: llama.cpp's V4 drafts are our drafter's (not the qwen row-0 rule)

PROPOSE: dict[str, Propose] = {"dflash": _block(ref_dflash), "dspark": _block(ref_dspark), "dflash2": _dflash2,
                               "mtp": _mtp, "mimo2/mtp": _mimo2("post"), "deepseek4/dspark": _block(ref_ds4_dspark),
                               "deepseek4/mtp": _deepseek4}


def lookup(table: dict, family: str, kind: str):
    """A family's own entry (``family/kind``) before the kind's."""
    return table.get(f"{family}/{kind}", table.get(kind))


@dataclass
class WindowRef:
    """One engine window beside the reference's: s (the anchor's position), its p proposals, the engine's proposal
    and kept rows (accepted + the bonus), the reference's proposal (first p ids) and kept rows, and where the two
    proposals first differ (or None)."""

    prompt: int
    s: int
    proposed: int
    engine_ids: list[int]
    engine_kept: int
    ref_ids: list[int]
    ref_kept: int
    first_diff: int | None
    ref_row: np.ndarray | None = None   # where they differ: the reference's decision row there (the near-tie test)


def replay_prompt(propose: Propose, draft_spec: Any, target_spec: Any, taps: Any, prompt: Sequence[int],
                  emitted: Sequence[int], windows: Sequence[Window], index: int) -> list[WindowRef]:
    """windows: the engine's windows of the prompt (record.Window); taps: the target reference's forward over
    prompt + emitted. Returns the paired windows, one per window that proposed inside the run."""
    seq = list(prompt) + list(emitted)
    greedy = np.asarray(taps.logits).argmax(-1)
    out, e = [], 0
    for w in windows:
        s, p, ids = len(prompt) - 1 + e, w.proposed, list(w.draft_ids[:w.proposed])
        if p > 0 and s + p < len(seq):
            r_ids, rows = run(lambda s=s, p=p: propose(draft_spec, target_spec, taps, seq, s, p))
            r = [int(x) for x in r_ids[:p]]
            k = kept_rows(ids, r) - 1                   # leading proposals the engine and the reference share
            diff = None if k >= p else k
            out.append(WindowRef(index, s, p, ids, w.accepted + 1, r, kept_rows(r, [int(x) for x in greedy[s:s + p]]),
                                 diff, None if diff is None else np.asarray(rows)[diff]))
        e += w.emitted
    return out


def ref_logits_row(propose: Propose, draft_spec: Any, target_spec: Any, taps: Any, seq: Sequence[int], s: int,
                   width: int, row: int) -> np.ndarray:
    """The reference drafter's decision row ``row`` of the window at s (for the near-tie test at a difference):
    the logits row, or DFlash2's walk score row."""
    _, logits = run(lambda: propose(draft_spec, target_spec, taps, seq, s, width))
    return np.asarray(logits)[row]
