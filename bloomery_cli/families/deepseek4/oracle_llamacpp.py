"""Tier 3 for deepseek4 GGUF files: llama.cpp's deepseek4 trunk and its V4 MTP graph (``src/models/deepseek4.cpp``,
``graph`` and ``graph_mtp``) on the same files, against our float64 reference.

llama.cpp runs (``bloomery_cli.llamacpp_run``'s settings: llama-cpp-python's C API, CPU, F32 weights by an exact
F32 copy, F32 KV cache, flash attention off), each decode one ubatch from an empty KV:

* the main GGUF over seq = prompt + plain ids, long enough to pass position 128 (the HCA layers' first entry; the
  gate-level (o) lines stop at prompt + 64), logits of every row;
* the main GGUF again, logits of the LAST row only, for its exported ``h_nextn`` rows [T, S*H]
  (``embeddings_nextn`` unmasked: the 4 raw streams before the HC head, the MTP's input);
* the MTP GGUF (a second model, ``mtp-<name>.gguf``, ``LLAMA_CONTEXT_TYPE_MTP``), teacher-forced on those streams:
  row q = 0..T-2 reads token seq[q+1] and h_nextn[q] at position q (our reference's row convention,
  ``reference.families.deepseek4.mtp.rows``; rope and window are relative, so llama.cpp's driver, which numbers
  the same rows from 1, computes the same values).

Why the second decode: llama.cpp 0c1e57098's exported h_nextn for deepseek4 is not always the tensor its head reads.
Measured on ds4-tiny-lc, 20 positions, one decode call (n_ubatch 64): with 1 or 2 output rows every h_nextn row is
within 3.7e-7 of our f64 streams; with 19 or 20 output rows, or with n_ubatch 4 whatever the output rows, every row
is off by 5.5 to 8.9 (values <= 1.6), and those rows through the HC head, final norm and head give logits 1.46
(relative) from llama.cpp's own logits, where our streams give 3.2e-7. The wrong rows are llama.cpp's own logits
values: in the all-rows decode h_nextn row r starts, bit for bit, with the returned logits at float 4480 + 128 r
of the concatenated output rows (the two outputs overlap in memory; with 3 output rows the overlap runs the other
way on rows 16..19, whose h_nextn is right and whose returned logits hold those stream values). A note line
measures the all-rows export on every run (``self_check``). Its draft-mtp driver (``--engine llama.cpp``)
nevertheless drafted our f64 drafter's ids on all 542 windows of the bundled record.

Lines (ref "llama.cpp f32" / "llama.cpp f32 MTP"): the trunk logits [T x V] and greedy ids; the raw streams; the
MTP logits [T-1 x V] (our reference fed llama.cpp's streams) and its greedy ids. Bands: f32 chains
(``bands.chain_band``) over the trunk's L layers (+ the HC head, final norm and head for the logits), and for the MTP
rows the trunk and then the MTP step (enorm / hnorm, eh_proj over 2H, one layer at length T, the MTP's HC head and
norm, the head). A greedy flip is excused only where our reference's top-2 margin is inside the band.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...bands import Band, Op, chain_band, flip_excused, layer_ops, worst_rel
from ...contract import Report

REF, REF_MTP = "llama.cpp f32", "llama.cpp f32 MTP"
HCA_FIRST = 128                     # llama.cpp's HCA ratio: the first entry closes at position 127


@dataclass(frozen=True)
class V4Run:
    """logits [T, V]; streams [T, S*H] (h_nextn, one-output-row decode); streams_all [T, S*H] (h_nextn of the
    all-rows decode, for the note); mtp_logits [T-1, V] (its MTP graph on ``streams``)."""

    logits: np.ndarray
    streams: np.ndarray
    streams_all: np.ndarray
    mtp_logits: np.ndarray
    weights: str


def _f32(src: Path, d: str) -> tuple[Path, str]:
    from ...llamacpp_run import f32_copy, tensor_types

    types = tensor_types(src)
    if types == ["F32"]:
        return src, "F32 as stored"
    return f32_copy(src, Path(d) / (src.stem + "-f32.gguf")), "F32 copies of " + "/".join(types)


def _load(lc: Any, path: Path, mtp: bool) -> Any:
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers, mp.load_mtp = 0, mtp
    model = lc.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def _decode(lc: Any, ext: Any, model: Any, ids: list[int], all_rows: bool, vocab: int, width: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """One ubatch over ids from an empty KV: (logits [R, V] of the requested rows, h_nextn [T, width])."""
    from ...llamacpp_run import _context, _rows_of

    t = len(ids)
    ctx = _context(lc, model, t, mtp=False)
    batch = lc.llama_batch_init(t, 0, 1)
    try:
        ext.llama_set_embeddings_nextn(ctx, True, False)
        for i, tok in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(tok), i, 1
            batch.logits[i] = int(all_rows or i == t - 1)
            batch.seq_id[i][0] = 0
        batch.n_tokens = t
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama.cpp: llama_decode failed")
        rows = list(range(t)) if all_rows else [t - 1]
        logits = np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, r), shape=(vocab,)).copy()
                           for r in rows])
        return logits, _rows_of(ext.llama_get_embeddings_nextn_ith, ctx, t, width, "h_nextn")
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def run_v4(target: Path, mtp: Path, ids: Sequence[int]) -> V4Run:
    """llama.cpp on the main GGUF and its MTP graph on the MTP GGUF (module docstring)."""
    from ...llamacpp_run import _lib, _mtp_rows

    lc, ext = _lib()
    lc.llama_backend_init()
    ids = [int(i) for i in ids]
    with tempfile.TemporaryDirectory(prefix="bloomery-llamacpp-") as d:
        (tp, tw), (mp, _) = _f32(Path(target), d), _f32(Path(mtp), d)
        model = _load(lc, tp, False)
        try:
            vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
            width = lc.llama_model_n_embd_out(model)
            logits, h_all = _decode(lc, ext, model, ids, True, vocab, width)
            _, h = _decode(lc, ext, model, ids, False, vocab, width)
        finally:
            lc.llama_model_free(model)
        head = _load(lc, mp, True)
        try:
            if lc.llama_model_n_layer_nextn(head) != 1:
                raise RuntimeError(f"llama.cpp reads {lc.llama_model_n_layer_nextn(head)} nextn layers in {mtp}")
            m_logits = _mtp_rows(lc, head, ids[1:], h[:-1], list(range(len(ids) - 1)), vocab)
        finally:
            lc.llama_model_free(head)
    return V4Run(logits, h, h_all, m_logits, tw)


def trunk_ops(t: Any, seq_len: int) -> list[Op]:
    return layer_ops(t.layer, seq_len) * t.num_layers


def head_ops(t: Any) -> list[Op]:
    h = t.hidden_size
    return [Op("hc_head", t.hc.count * h), Op("norm", h), Op("lm head", h)]


def _ids_line(report: Report, what: str, got: np.ndarray, want: np.ndarray, band: Band, ref: str) -> None:
    differ = np.nonzero(got.argmax(-1) != want.argmax(-1))[0]
    excused = sum(flip_excused(want[i], band) for i in differ)
    report.integer_match(what, got.shape[0], len(differ), excused, tag="(o)", ref=ref)


def self_check(target: Any, exported: np.ndarray, ours: np.ndarray, logits: np.ndarray) -> tuple[float, float]:
    """(worst rel of llama.cpp's exported h_nextn vs our raw streams, worst rel of ITS h_nextn through our HC head,
    final norm and head vs llama.cpp's own logits)."""
    from bloomery_gates.reference.families.deepseek4.model import final_norm, head_name
    from bloomery_gates.reference.weights import as_f64

    t, s, h = exported.shape[0], target.hc.count, target.hidden_size
    fin = final_norm(target, exported.astype(np.float64).reshape(t, s, h))
    again = as_f64(target).project(head_name(target), fin)
    return worst_rel(ours, exported.astype(np.float64)), worst_rel(logits.astype(np.float64), again)


def check_v4(report: Report, target: Any, mtp: Any, seq: Sequence[int]) -> None:
    """(o) lines: llama.cpp's deepseek4 trunk over ``seq`` and its MTP graph from the MTP file (module docstring);
    a note and no line where llama-cpp-python is missing or the draft is not a GGUF."""
    from bloomery_gates.reference.families.deepseek4 import mtp as ref_mtp
    from bloomery_gates.reference.families.deepseek4.model import forward

    from ...llamacpp_run import trunk_blocker, unavailable

    why = unavailable()
    if why:
        report.note(f"(o) llama.cpp deepseek4: skipped, {why} (pip install llama-cpp-python==0.3.36 for these lines)")
        return
    why = trunk_blocker(Path(target.source))
    if why:
        report.note(f"(o) llama.cpp deepseek4: skipped, {why}")
        return
    if not str(mtp.source).lower().endswith(".gguf"):
        report.note(f"(o) llama.cpp deepseek4 MTP: skipped, the draft {mtp.source} is not a GGUF (pass --draft "
                    "mtp-<name>.gguf)")
        return
    t, seq = len(seq), [int(i) for i in seq]
    ref = forward(target, seq)
    s, h = target.hc.count, target.hidden_size
    ours = np.asarray(ref.hidden[-1], dtype=np.float64).reshape(t, s * h)
    out = run_v4(Path(target.source), Path(mtp.source), seq)
    report.note(f"(o) llama.cpp deepseek4: {Path(target.source).name} + {Path(mtp.source).name} on {out.weights}, "
                f"CPU, F32 KV, {t} positions (HCA entries from position {HCA_FIRST - 1}: "
                f"{'exercised' if t >= HCA_FIRST else 'NOT reached'})")
    band = chain_band("f32", trunk_ops(target, t) + head_ops(target), "deepseek4 trunk logits")
    got = out.logits.astype(np.float64)
    report.reference(f"trunk logits [{t}x{got.shape[1]}]", got.size, worst_rel(ref.logits, got), band.value,
                     tag="(o)", ref=REF)
    _ids_line(report, f"trunk greedy ids [{t}]", got, ref.logits, band, REF)
    sband = chain_band("f32", trunk_ops(target, t), f"deepseek4 raw streams after {target.num_layers} layers")
    report.reference(f"raw streams [{t}x{s * h}] (h_nextn, one-output-row decode)", out.streams.size,
                     worst_rel(ours, out.streams.astype(np.float64)), sband.value, tag="(o)", ref=REF)
    vs_ours, vs_itself = self_check(target, out.streams_all, ours, out.logits)
    verdict = ("NOT the streams its head reads (llama.cpp defect, module docstring)" if vs_itself > band.value
               else "consistent")
    report.note(f"(o) llama.cpp deepseek4: h_nextn exported from the all-rows decode is {vs_ours:.3e} (worst rel) "
                f"from our raw streams and, through the HC head, final norm and head, {vs_itself:.3e} from its own "
                f"logits: {verdict}")
    rows = ref_mtp.rows(mtp, target, seq[1:], out.streams[:-1].astype(np.float64).reshape(t - 1, s, h))
    hh = target.hidden_size
    step = [Op("enorm / hnorm", hh), Op("eh_proj", 2 * hh), *layer_ops(target.layer, t), *head_ops(target)]
    band = chain_band("f32", trunk_ops(target, t) + step, f"deepseek4 MTP logits after {target.num_layers} "
                      "target layers + the MTP block")
    got = out.mtp_logits.astype(np.float64)
    report.reference(f"mtp logits [{t - 1}x{got.shape[1]}] (row q: token q+1, llama.cpp's streams q)", got.size,
                     worst_rel(rows.logits, got), band.value, tag="(o)", ref=REF_MTP)
    _ids_line(report, f"mtp greedy ids [{t - 1}]", got, rows.logits, band, REF_MTP)
