"""Tier-3 oracle for GGUF targets (CONTRACT.md): llama.cpp's own graphs on the same file, in float32.

llama.cpp (``bloomery_cli.llamacpp_run``: llama-cpp-python's C API, CPU, F32 weights, F32 KV cache, flash
attention off) decodes seq = prompt + the plain run's first ids at positions 0..T-1 with logits for every row.
Lines (ref "llama.cpp f32"):

* ``(o) host f64 logits [TxV]``: our float64 reference's logits on seq against llama.cpp's, every row;
* ``(o) prompt greedy ids``: the argmax of the P prompt rows, equal;
* ``(o) plain run greedy ids``: teacher-forced, llama.cpp's argmax after row P-1+j equals plain id j.

The band. llama.cpp computes every op in float32 (its stored outputs rounded to f32, its reductions
accumulated in f32), the model ``bloomery_cli.bands`` states: kappa * sum over the chained ops of
(u_store + gamma(n, u_acc)) with u_store = u_acc = 2^-24. On the logits that is
``logits_band("f32", layer, L, T)`` (L layers of the Qwen3-shaped op chain at attention length T, then the
final norm and the head); the reference's own float64 error is ~1e-16 and adds nothing visible. A greedy
flip is excused only where our f64 reference's top-2 margin is inside that band (``flip_excused``): the
reference is the arbiter between two f32 engines (llama.cpp and our kernel's plain run).

MTP (qwen35 files with a nextn layer, ``check_mtp``): llama.cpp's ``graph_mtp`` fed with its own h_nextn rows,
against ``reference.drafts.mtp`` on our f64 reference's post-final-norm rows, in two layouts (see
``llamacpp_run``): ours (rows 1..T-1) and llama.cpp's draft-mtp driver's (an extra row 0 = token 0 with a zero
hidden, which every later row attends to). The band chains the target (L layers, final norm), the MTP step
(pre-fc norms, fc over 2H, one gated layer, mtp.norm) and the head, in f32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..bands import Band, Op, chain_band, flip_excused, layer_ops, logits_band, worst_rel
from ..contract import Report

REF = "llama.cpp f32"
REF_MTP = "llama.cpp f32 MTP"


def is_gguf_target(spec: Any) -> bool:
    return str(spec.source).lower().endswith(".gguf")


def _flips(got: np.ndarray, ref: np.ndarray, band: Band) -> tuple[int, int]:
    differ = np.nonzero(got.argmax(-1) != ref.argmax(-1))[0]
    return len(differ), sum(flip_excused(ref[r], band) for r in differ)


def _llama(report: Report, path: Path, seq: Sequence[int], what: str = "llama.cpp"):
    """llama.cpp's run, or None after a note line saying why there is none."""
    from ..llamacpp_run import run, trunk_blocker, unavailable

    why = unavailable()
    if why:
        report.note(f"(o) {what}: skipped, {why} (pip install llama-cpp-python==0.3.36 for these lines)")
        return None
    why = trunk_blocker(path)
    if why:
        report.note(f"(o) {what}: skipped, {why}")
        return None
    return run(path, list(seq))


def mtp_run(report: Report, target: Any, mtp: Any, seq: Sequence[int], gguf: Path | None = None):
    """llama.cpp's run of the target GGUF with its MTP graph, or None with a note saying why not: the draft is not
    the GGUF's own nextn blocks, llama-cpp-python is missing, or the file's MTP graph would abort llama.cpp."""
    if Path(mtp.source).resolve() != Path(target.source).resolve():
        report.note(f"(o) llama.cpp MTP: skipped, the draft ({mtp.source}) is not the target GGUF's own nextn "
                    "blocks (pass --draft <the .gguf>)")
        return None
    out = _llama(report, Path(gguf or target.source), seq, "llama.cpp MTP")
    if out is not None and out.mtp_blocked:
        report.note(f"(o) llama.cpp MTP: skipped, {out.mtp_blocked}")
        return None
    return out


def check_target(report: Report, spec: Any, seq: Sequence[int], ref_logits: np.ndarray, prompt_len: int,
                 plain_ids: Sequence[int], gguf: Path | None = None, rows: Sequence[int] | None = None,
                 ref: str = REF) -> np.ndarray | None:
    """(o) lines for a GGUF target: logits of every row of seq, the prompt rows' greedy ids, the plain run's ids
    teacher-forced. ``gguf`` is the file llama.cpp runs (default: the spec's own source; tests plant defects).
    ``rows``: only these rows of seq are checked (a family's known llama.cpp defect leaves the others out, and says
    so on its own line); ``ref`` names the comparison. Returns llama.cpp's logits [T, V] (None: not run)."""
    out = _llama(report, Path(gguf or spec.source), seq)
    if out is None:
        return None
    t, v = ref_logits.shape
    keep = sorted(set(range(t) if rows is None else rows))
    report.note(f"(o) llama.cpp: {out.version} on {out.weights} of {Path(spec.source).name}, CPU, F32 KV cache, "
                f"flash attention off, logits of all {t} rows (prompt {prompt_len} + {t - prompt_len} plain ids)")
    band = logits_band("f32", spec.layer, spec.num_layers, t)
    got = out.logits.astype(np.float64)
    if not keep:                    # fails closed: nothing left to compare is no pass
        report.check(f"(o) host f64 logits vs {ref}: 0 of {t} rows left to check", False)
        return got
    part = "" if len(keep) == t else f" (rows {len(keep)} of {t})"
    report.reference(f"host f64 logits [{len(keep)}x{v}]{part}", len(keep) * v,
                     worst_rel(ref_logits[keep], got[keep]), band.value, tag="(o)", ref=ref)
    pr = [r for r in keep if r < prompt_len]
    if pr:
        differ, excused = _flips(got[pr], ref_logits[pr], band)
        report.integer_match("prompt greedy ids", len(pr), differ, excused, tag="(o)", ref=ref)
    m = t - prompt_len
    plain = [(j, prompt_len - 1 + j) for j in range(m) if prompt_len - 1 + j in keep]
    bad = [(j, r) for j, r in plain if int(got[r].argmax()) != int(plain_ids[j])]
    excused = sum(flip_excused(ref_logits[r], band) for _, r in bad)
    if plain:
        report.integer_match("plain run greedy ids", len(plain), len(bad), excused, tag="(o)", ref=ref)
    return got


def mtp_band(spec: Any, seq_len: int) -> Band:
    """f32 band of an MTP row's logits fed with llama.cpp's own h_nextn: the target's L layers and final norm,
    then the MTP step (pre-fc norms n = H, fc n = 2H, one gated full-attention layer at length T, the output
    gate), mtp.norm and the head."""
    s, h = spec.layer, spec.hidden_size
    ops = layer_ops(s, seq_len) * spec.num_layers + [Op("target final norm", h)]
    ops += [Op("pre_fc norms", h), Op("fc", 2 * h), *layer_ops(s, seq_len), Op("output gate", 1)]
    ops += [Op("mtp.norm", h), Op("lm head", h)]
    return chain_band("f32", ops, f"MTP logits after {spec.num_layers} target layers + 1 MTP layer, seq_len {seq_len}")


def check_mtp(report: Report, target: Any, mtp: Any, seq: Sequence[int], gguf: Path | None = None) -> None:
    """(o) lines for the qwen35 MTP head: llama.cpp's graph_mtp against ``reference.drafts.mtp``, teacher-forced
    over seq, in our row layout and in llama.cpp's driver layout, and a note on how the two layouts differ."""
    from bloomery_gates.reference.drafts import mtp as ref_mtp
    from bloomery_gates.reference.families.qwen38.model import forward
    from bloomery_gates.reference.weights import as_f64

    out = mtp_run(report, target, mtp, seq, gguf)
    if out is None:
        return
    if out.mtp_ours is None:
        report.note("(o) llama.cpp MTP: skipped, llama.cpp reports no nextn layer in the file")
        return
    final = forward(target, list(seq)).final
    ours = ref_mtp.teacher_forced(mtp, target, list(seq), final)
    t = len(seq)
    emb = as_f64(target).rows("model.embed_tokens.weight", seq)
    drv = ref_mtp.rows(mtp, target, emb, np.vstack([np.zeros((1, final.shape[1])), final[:-1]]), np.arange(t))
    band = mtp_band(target, t)
    got, v = out.mtp_ours.astype(np.float64), out.mtp_ours.shape[1]
    report.reference(f"mtp logits [{t - 1}x{v}] (rows 1..{t - 1}: token j, h_nextn j-1)", got.size,
                     worst_rel(ours.logits, got), band.value, tag="(o)", ref=REF_MTP)
    differ, excused = _flips(got, ours.logits, band)
    report.integer_match("mtp greedy ids", t - 1, differ, excused, tag="(o)", ref=REF_MTP)
    got_d = out.mtp_driver.astype(np.float64)
    report.reference(f"mtp logits [{t}x{v}] in llama.cpp's driver layout (+ row 0: token 0, zero hidden)",
                     got_d.size, worst_rel(drv.logits, got_d), band.value, tag="(o)", ref=REF_MTP)
    differ, excused = _flips(got_d, drv.logits, band)
    report.integer_match("mtp greedy ids, driver layout", t, differ, excused, tag="(o)", ref=REF_MTP)
    moved = int(np.sum(drv.ids[1:] != ours.ids))
    report.note(f"(o) llama.cpp MTP: its draft-mtp driver keeps a row 0 (token 0, zero hidden) in the MTP KV that "
                f"our MTP does not have; over these {t - 1} teacher-forced rows that row changes our reference's "
                f"draft id at {moved} (worst rel {worst_rel(drv.logits[1:], ours.logits):.3e}), so its acceptance "
                "on this head may differ from our accept_mean by what those drafts win or lose; the lines above "
                "check each layout against the same math")
