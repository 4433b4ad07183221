"""Tier 3 for deepseek4 GGUF files: llama.cpp's deepseek4 trunk and its V4 MTP graph (``src/models/deepseek4.cpp``,
``graph`` and ``graph_mtp``) on the same files, against our float64 reference.

llama.cpp runs (``bloomery_cli.llamacpp_run``'s settings: llama-cpp-python's C API, CPU, F32 weights by an exact
F32 copy, F32 KV cache, flash attention off):

* the main GGUF over seq = prompt + plain ids, long enough to pass position 128 (the HCA layers' first entry; the
  gate-level (o) lines stop at prompt + 64): its logits, and its exported ``h_nextn`` rows [T, S*H]
  (``embeddings_nextn``: by deepseek4.cpp the 4 raw streams before the HC head, the MTP's input);
* the MTP GGUF (a second model, ``mtp-<name>.gguf``, ``LLAMA_CONTEXT_TYPE_MTP``), teacher-forced from an empty KV:
  row q = 0..T-2 reads token seq[q+1] and the raw streams of position q at position q (our reference's row
  convention, ``reference.families.deepseek4.mtp.rows``; rope and window are relative, so llama.cpp's driver, which
  numbers the same rows from 1, computes the same values).

Which streams feed the MTP: OURS (the f64 reference's, rounded to f32). llama.cpp 0c1e57098's exported h_nextn
for deepseek4 is not the tensor its own head reads: on ds4-tiny-lc, 40 positions, its h_nextn through the HC head,
final norm and head gives logits 1.46 (relative) from llama.cpp's own logits, while our f64 streams through the
same head give them within 3.2e-7; and it matches none of our per-layer streams (|diff| ~9 on values <= 1.6).
A note line measures both numbers on every run (``self_check``); the MTP lines then check llama.cpp's MTP graph on
a correct input, and ``--engine llama.cpp`` (its draft-mtp driver reads that export) inherits the defect.

Lines (ref "llama.cpp f32" / "llama.cpp f32 MTP"): the trunk logits [T x V] and greedy ids; the MTP logits
[T-1 x V] (both fed our streams) and its greedy ids. Bands: f32 chains (``bands.chain_band``) over the trunk's L
layers, the HC head, final norm and head for the trunk logits; for the MTP rows (exact f32 inputs) the MTP step:
enorm / hnorm, eh_proj over 2H, one layer at length T, the MTP's HC head and norm, the head. A greedy flip is
excused only where our reference's top-2 margin is inside the band.
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
    """logits [T, V], streams [T, S*H] (llama.cpp's exported h_nextn), mtp_logits [T-1, V] and mtp_streams
    [T-1, S*H] (its MTP graph on the streams given to ``run_v4``)."""

    logits: np.ndarray
    streams: np.ndarray
    mtp_logits: np.ndarray
    mtp_streams: np.ndarray
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


def run_v4(target: Path, mtp: Path, ids: Sequence[int], streams: np.ndarray) -> V4Run:
    """llama.cpp on the main GGUF (logits, its exported h_nextn) and its MTP graph on the MTP GGUF over ``streams``
    [T, S*H] (module docstring)."""
    from ...llamacpp_run import _context, _decode_target, _lib, _mtp_rows

    lc, ext = _lib()
    lc.llama_backend_init()
    ids = [int(i) for i in ids]
    with tempfile.TemporaryDirectory(prefix="bloomery-llamacpp-") as d:
        (tp, tw), (mp, _) = _f32(Path(target), d), _f32(Path(mtp), d)
        model = _load(lc, tp, False)
        try:
            vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
            width = lc.llama_model_n_embd_out(model)
            ctx = _context(lc, model, len(ids), mtp=False)
            try:
                logits, h = _decode_target(lc, ext, ctx, ids, True, vocab, width)
            finally:
                lc.llama_free(ctx)
        finally:
            lc.llama_model_free(model)
        head = _load(lc, mp, True)
        try:
            if lc.llama_model_n_layer_nextn(head) != 1:
                raise RuntimeError(f"llama.cpp reads {lc.llama_model_n_layer_nextn(head)} nextn layers in {mtp}")
            feed = np.ascontiguousarray(streams[:-1], dtype=np.float32)
            m_logits, m_h = _mtp_rows(lc, head, ids[1:], feed, list(range(len(ids) - 1)), vocab, 0, ext)
        finally:
            lc.llama_model_free(head)
    return V4Run(logits, h, m_logits, m_h, tw)


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

    from ...llamacpp_run import unavailable

    why = unavailable()
    if why:
        report.note(f"(o) llama.cpp deepseek4: skipped, {why} (pip install llama-cpp-python==0.3.36 for these lines)")
        return
    if not str(mtp.source).lower().endswith(".gguf"):
        report.note(f"(o) llama.cpp deepseek4 MTP: skipped, the draft {mtp.source} is not a GGUF (pass --draft "
                    "mtp-<name>.gguf)")
        return
    t, seq = len(seq), [int(i) for i in seq]
    ref = forward(target, seq)
    s, h = target.hc.count, target.hidden_size
    ours = np.asarray(ref.hidden[-1], dtype=np.float64).reshape(t, s * h)
    out = run_v4(Path(target.source), Path(mtp.source), seq, ours)
    report.note(f"(o) llama.cpp deepseek4: {Path(target.source).name} + {Path(mtp.source).name} on {out.weights}, "
                f"CPU, F32 KV, {t} positions (HCA entries from position {HCA_FIRST - 1}: "
                f"{'exercised' if t >= HCA_FIRST else 'NOT reached'})")
    band = chain_band("f32", trunk_ops(target, t) + head_ops(target), "deepseek4 trunk logits")
    got = out.logits.astype(np.float64)
    report.reference(f"trunk logits [{t}x{got.shape[1]}]", got.size, worst_rel(ref.logits, got), band.value,
                     tag="(o)", ref=REF)
    _ids_line(report, f"trunk greedy ids [{t}]", got, ref.logits, band, REF)
    vs_ours, vs_itself = self_check(target, out.streams, ours, out.logits)
    report.note(f"(o) llama.cpp deepseek4: its exported h_nextn [{t}x{s * h}] is {vs_ours:.3e} (worst rel) from our "
                f"raw streams, and through the HC head, final norm and head gives logits {vs_itself:.3e} from its "
                f"own (a consistent export would give ~1e-7): "
                f"{'llama.cpp exports NOT the streams its head reads (its defect)' if vs_itself > band.value else 'consistent'}"
                "; the MTP lines feed its MTP graph OUR streams")
    rows = ref_mtp.rows(mtp, target, seq[1:], ours[:-1].astype(np.float32).astype(np.float64).reshape(t - 1, s, h))
    hh = target.hidden_size
    step = [Op("enorm / hnorm", hh), Op("eh_proj", 2 * hh), *layer_ops(target.layer, t), *head_ops(target)]
    band = chain_band("f32", step, "deepseek4 MTP logits from given streams: one MTP block, its HC head, the head")
    got = out.mtp_logits.astype(np.float64)
    report.reference(f"mtp logits [{t - 1}x{got.shape[1]}] (row q: token q+1, streams q)", got.size,
                     worst_rel(rows.logits, got), band.value, tag="(o)", ref=REF_MTP)
    _ids_line(report, f"mtp greedy ids [{t - 1}]", got, rows.logits, band, REF_MTP)
