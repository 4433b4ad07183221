"""Tier-3 oracle for the mimo2 MTP head on a GGUF: llama.cpp's ``graph_mtp`` (mimo2.cpp), its 3 nextn layers chained.

llama.cpp's convention is pre-norm (FAMILIES_MOE.md 4.2): the trunk emits h_nextn before output_norm, and each
layer's h_nextn (its output before the head norm) is what the next layer reads. ``llamacpp_run._chain`` runs the
layers teacher-forced on llama.cpp's own rows, HF MtpModel's loop (layer k at positions k+1..T-1 reads token q and
layer k-1's row q-1); the reference is ``reference.families.mimo2.mtp.chain(..., "pre")`` on our f64 trunk's last-layer
rows. Lines (ref "llama.cpp f32 MTP"), per layer k: its logits, every row, and its greedy ids. These check our
reference's math for the pre convention (``--mtp-hidden pre``) whichever convention the gate ran; the post one is
checked against transformers' MtpModel.

The band: f32 (llama.cpp computes every op in float32), ``bands.chain_band`` over the trunk's L layers and final
norm, then per chained layer j <= k its enorm / hnorm (n = H), eh_proj (n = 2H), one SWA layer at length T and its
head norm, then the head. A greedy flip is excused only where the reference's top-2 margin is inside that band.

llama.cpp's own chain-heads driver (common/speculative.cpp, ``chain_heads``) differs from this chain in which rows
each head's KV holds: over the committed context every head is fed the TARGET's h_nextn (not the previous head's
output, as HF / vLLM / this harness do); only its draft rows read the previous heads' outputs. A note line says so:
its acceptance with these heads may differ from ours; the lines check the graph, per layer, on one chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...bands import Band, Op, chain_band, flip_excused, layer_ops, worst_rel
from ...contract import Report
from ...oracle.llamacpp import mtp_run

REF = "llama.cpp f32 MTP"


def chain_band_f32(target: Any, seq_len: int, k: int) -> Band:
    t, h = target, target.hidden_size
    ops = layer_ops(t.layer, seq_len) * t.num_layers + [Op("target final norm", h)]
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), *layer_ops(t.layer, seq_len), Op("head norm", h)]
    return chain_band("f32", ops + step * (k + 1) + [Op("lm head", h)],
                      f"mimo2 MTP layer {k} logits after {t.num_layers} target layers + {k + 1} MTP layers")


def check_mtp_chain(report: Report, target: Any, mtp: Any, seq: Sequence[int], gguf: Path | None = None) -> None:
    """(o) lines: llama.cpp's mimo2 MTP layers chained (pre-norm) against our f64 reference's pre-norm chain."""
    from bloomery_gates.reference.families.mimo2 import mtp as ref_mtp
    from bloomery_gates.reference.families.mimo2.model import forward

    out = mtp_run(report, target, mtp, seq, gguf)
    if out is None:
        return
    if not out.chain:
        report.note("(o) llama.cpp MTP: skipped, llama.cpp reports no nextn layers in the file")
        return
    ours = ref_mtp.chain(mtp, target, list(seq), forward(target, list(seq)).hidden[-1], "pre")
    t = len(seq)
    report.note(f"(o) llama.cpp MTP: {len(out.chain)} nextn layers chained teacher-forced on llama.cpp's own rows "
                "(pre-norm in and recycled, its convention) against our f64 reference chain, --mtp-hidden pre")
    for k, (logits, _) in enumerate(out.chain):
        band = chain_band_f32(target, t, k)
        got, want = logits.astype(np.float64), ours.logits[k]
        r, v = got.shape
        report.reference(f"mtp layer {k} logits [{r}x{v}] (positions {k + 1}..{t - 1})", got.size,
                         worst_rel(want, got), band.value, tag="(o)", ref=REF)
        differ = np.nonzero(got.argmax(-1) != want.argmax(-1))[0]
        excused = sum(flip_excused(want[i], band) for i in differ)
        report.integer_match(f"mtp layer {k} greedy ids", r, len(differ), excused, tag="(o)", ref=REF)
    report.note("(o) llama.cpp MTP: its chain-heads draft-mtp driver fills every head's KV over the committed "
                "context from the target's h_nextn (not the previous head's output, as HF MtpModel, vLLM and this "
                "harness do), so its acceptance with heads 1..2 may differ from our accept_mean; the lines above "
                "check each layer's graph on one chain")
