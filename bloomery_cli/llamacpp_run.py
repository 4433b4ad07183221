"""Run llama.cpp (llama-cpp-python's ctypes bindings, imported lazily) on a GGUF: logits, h_nextn, MTP rows.

Only the low-level C API is used (``llama_model_load_from_file``, ``llama_decode``, ``llama_process`` with the
extended batch), so what runs is llama.cpp's own graph for the file's arch (qwen3, qwen35 and its MTP head
``graph_mtp``) and nothing of ours. Settings chosen so llama.cpp computes in float32 end to end:

* the weights: an F32 copy of the GGUF when any tensor is stored otherwise (``f32_copy``; the dequantised values
  are exact, so the copy holds the same numbers). Run on BF16 weights, ggml's CPU matmul would round the
  ACTIVATIONS to bf16 (its vec_dot type for bf16 is bf16), which is not an f32 computation. The copy is built
  in host memory (4 bytes a weight) in a temporary directory, removed after the run: sized for fixtures and
  small models, not an 8B checkpoint.
* the KV cache F32 (``type_k = type_v = GGML_TYPE_F32``; llama.cpp's default is F16) and flash attention off;
  CPU only (``n_gpu_layers = 0``), one sequence, ``n_ubatch`` = the whole sequence (one graph per call).

``run(path, ids)`` decodes ``ids`` at positions 0..T-1 with logits for every row (``logits_all``) and, for
a file with ``nextn_predict_layers`` > 0, llama.cpp's ``h_nextn`` rows (the trunk's post-output-norm hidden, the
MTP head's input, ``llama_set_embeddings_nextn``), and then runs the MTP head in a second context
(``LLAMA_CONTEXT_TYPE_MTP``, its own KV for the nextn layer) over two row layouts, each from an empty KV:

* ``ours``: row j = 1..T-1 reads token ids[j] and h_nextn[j-1] at RoPE position j (what our MTP computes);
* ``driver``: row j = 0..T-1 reads token ids[j] and h_nextn[j-1], with a ZERO hidden for row 0, at position j:
  llama.cpp's draft-mtp driver (common/speculative.cpp) pairs each token with the previous row's hidden and
  the first token with ``pending_h``, which starts as zeros, so its MTP KV holds that extra row 0.

A file with several nextn layers (mimo2: 3) also gets ``chain``: the layers chained teacher-forced, layer k
(``llama_set_nextn_layer_offset``) reading layer k-1's own h_nextn rows (``_chain``). Before any MTP context,
``mtp_blocker`` reads the header for what would make llama.cpp's MTP graph abort the process on a GGML_ASSERT
(mimo2: a split attn_q/k/v or a sparse FFN in an MTP block; qwen35/qwen35moe: more than one nextn block); such a
file runs the trunk only and says why (``LlamaOut.mtp_blocked``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LlamaOut:
    """logits [T, V] float32; hidden [T, H] (h_nextn) or None; mtp_ours [T-1, V] / mtp_driver [T, V] or None;
    chain: per nextn layer k (files with more than one, mimo2) its teacher-forced logits [T-1-k, V] and h_nextn
    [T-1-k, H] (``_chain``), or None; mtp_blocked: why llama.cpp's MTP graph was not run on this file, or None."""

    logits: np.ndarray
    hidden: np.ndarray | None
    mtp_ours: np.ndarray | None
    mtp_driver: np.ndarray | None
    version: str
    weights: str                # "F32 as stored" or "F32 copy of <types>"
    chain: list[tuple[np.ndarray, np.ndarray]] | None = None
    mtp_blocked: str | None = None


def unavailable() -> str | None:
    """None when llama_cpp (llama-cpp-python) imports with the extended MTP API, else why not."""
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import llama_cpp_ext  # noqa: F401
    except Exception as e:     # ImportError, or OSError / AttributeError from a library that does not load
        return f"llama_cpp (llama-cpp-python) is not importable: {type(e).__name__}: {e}"
    return None


def _lib() -> tuple[Any, Any]:
    import llama_cpp
    from llama_cpp import _logger, llama_cpp_ext

    _logger.set_verbose(False)
    return llama_cpp, llama_cpp_ext


def tensor_types(path: Path) -> list[str]:
    from gguf import GGUFReader

    return sorted({t.tensor_type.name for t in GGUFReader(str(path)).tensors})


def f32_copy(src: Path, dst: Path) -> Path:
    """``src`` with every float tensor dequantised to F32, integer tensors kept (same names, metadata and order;
    general.file_type ALL_F32)."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = int(gguf.LlamaFileType.ALL_F32) if name == "general.file_type" else f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    ints = {gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16, gguf.GGMLQuantizationType.I32,
            gguf.GGMLQuantizationType.I64}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type in ints:           # integer tables (deepseek4's tid2eid) stay as stored
            w.add_tensor(t.name, np.ascontiguousarray(t.data).reshape(shape))
            continue
        w.add_tensor(t.name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def trunk_blocker(path: Path) -> str | None:
    """Why llama.cpp's trunk graph must not be run on ``path`` (an abort, from the header alone); None when it can.
    deepseek4: the lightning indexer is rotated by a Hadamard block of at least 64 channels (llama-kv-cache.cpp
    ``build_input_k_rot``), so an indexer key_length that is not a multiple of 64 aborts in ggml_reshape_2d."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    f = r.fields.get(f"{arch}.attention.indexer.key_length")
    if arch == "deepseek4" and f is not None and int(f.contents()) % 64:
        return (f"deepseek4 attention.indexer.key_length {int(f.contents())}: llama.cpp rotates the indexer by a "
                "Hadamard block of >= 64 channels and aborts (GGML_ASSERT in ggml_reshape_2d) unless it is a "
                "multiple of 64")
    return None


def mtp_blocker(path: Path) -> str | None:
    """Why llama.cpp's MTP graph must not be run on ``path`` (it would abort the process on a GGML_ASSERT), from
    the header alone; None when it can run (or the file has no nextn layer)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    nf = r.fields.get(f"{arch}.nextn_predict_layers")
    nextn = int(nf.contents()) if nf is not None else 0
    if nextn == 0:
        return None
    blocks = int(r.fields[f"{arch}.block_count"].contents())
    names = {t.name for t in r.tensors}
    if arch == "glm5-next":
        return ("llama.cpp has no glm5-next NextN graph (glm5-next.cpp build_arch_graph throws \"GLM5-Next NextN "
                "graph not implemented yet\" for an MTP context)")
    if arch in ("qwen35", "qwen35moe") and nextn != 1:
        return f"{arch} with nextn_predict_layers {nextn}: its graph_mtp asserts a single MTP block"
    if arch == "mimo2":
        for i in range(blocks - nextn, blocks):
            if f"blk.{i}.attn_qkv.weight" not in names:
                return (f"blk.{i} stores attn_q/attn_k/attn_v split (the MiMo-V2-Flash layout); llama.cpp's mimo2 "
                        "MTP graph asserts a fused attn_qkv (mimo2.cpp GGML_ASSERT, which aborts the process)")
            if f"blk.{i}.ffn_gate.weight" not in names:
                return f"blk.{i} has no dense ffn_gate; llama.cpp's mimo2 MTP graph asserts a dense FFN"
    return None


def _threads() -> int:
    return max(1, int(os.environ.get("OMP_NUM_THREADS", "0")) or (os.cpu_count() or 1))


def _context(lc: Any, model: Any, n: int, mtp: bool) -> Any:
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n + 8, n + 8, n + 8, 1
    cp.n_threads = cp.n_threads_batch = _threads()
    cp.type_k = cp.type_v = lc.GGML_TYPE_F32
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.no_perf = True
    if mtp:
        cp.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp: llama_init_from_model failed" + (" (MTP context)" if mtp else ""))
    return ctx


def _rows_of(get_ith: Any, ctx: Any, rows: int, width: int, what: str) -> np.ndarray:
    """[rows, width] float32 copied out of llama.cpp's per-row output pointers (``get_ith(ctx, i)``)."""
    out = np.empty((rows, width), dtype=np.float32)
    for i in range(rows):
        p = get_ith(ctx, i)
        if not p:
            raise RuntimeError(f"llama.cpp: no {what} for output row {i}")
        out[i] = np.ctypeslib.as_array(p, shape=(width,))
    return out


def _logits(lc: Any, ctx: Any, rows: int, vocab: int) -> np.ndarray:
    return _rows_of(lc.llama_get_logits_ith, ctx, rows, vocab, "logits")


def _decode_target(lc: Any, ext: Any, ctx: Any, ids: list[int], nextn: bool, vocab: int, hidden: int
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    t = len(ids)
    if nextn:
        ext.llama_set_embeddings_nextn(ctx, True, False)
    batch = lc.llama_batch_init(t, 0, 1)
    try:
        for i, tok in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(tok), i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = t
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama.cpp: llama_decode returned {rc}")
        logits = _logits(lc, ctx, t, vocab)
        h = _rows_of(ext.llama_get_embeddings_nextn_ith, ctx, t, hidden, "h_nextn") if nextn else None
        return logits, h
    finally:
        lc.llama_batch_free(batch)


def _mtp_rows(lc: Any, model: Any, toks: list[int], hid: np.ndarray, pos: list[int], vocab: int, layer: int = 0,
              ext: Any = None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """One MTP pass of nextn layer ``layer`` over rows (token, hidden state, position) from an empty KV: logits
    [R, V]; with ``ext`` also the layer's h_nextn rows [R, H] (its output before the head norm)."""
    ctx = _context(lc, model, max(pos) + 1, mtp=True)
    if layer:
        from llama_cpp import llama_cpp_ext

        llama_cpp_ext.llama_set_nextn_layer_offset(ctx, layer)
    if ext is not None:
        ext.llama_set_embeddings_nextn(ctx, True, True)
    hid = np.ascontiguousarray(hid, dtype=np.float32)
    batch = lc.llama_batch_ext_init(ctx)
    try:
        fp = ctypes.POINTER(ctypes.c_float)
        for r, (tok, p) in enumerate(zip(toks, pos, strict=True)):
            idx = lc.llama_batch_ext_add_token(batch, 0, int(tok))
            row = hid[r].ctypes.data_as(fp)
            ok = (idx == r and lc.llama_batch_ext_set_pos(batch, idx, ctypes.byref(ctypes.c_int32(p)))
                  and lc.llama_batch_ext_set_embd_token(batch, idx, lc.llama_embd(row, 1, hid.shape[1]))
                  and lc.llama_batch_ext_set_output_logits(batch, idx, True))
            if not ok:
                raise RuntimeError(f"llama.cpp: could not add MTP row {r} to the batch")
        rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            raise RuntimeError(f"llama.cpp: llama_process (MTP) returned {rc}")
        logits = _logits(lc, ctx, len(toks), vocab)
        if ext is None:
            return logits
        return logits, _rows_of(ext.llama_get_embeddings_nextn_ith, ctx, len(toks), hid.shape[1], "MTP h_nextn")
    finally:
        lc.llama_batch_ext_free(batch)
        lc.llama_free(ctx)


def _chain(lc: Any, ext: Any, model: Any, ids: list[int], h: np.ndarray, layers: int, vocab: int
           ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The nextn layers chained teacher-forced on llama.cpp's own rows (HF MtpModel's loop): layer 0 at positions
    q = 1..T-1 reads token ids[q] and the trunk's h_nextn[q-1]; layer k at q = k+1..T-1 reads ids[q] and layer
    k-1's h_nextn at q-1. Per layer (logits [T-1-k, V], h_nextn [T-1-k, H]), each pass from an empty KV."""
    t, out, x = len(ids), [], h[:-1]
    for k in range(layers):
        if t - 1 - k <= 0:
            break
        logits, y = _mtp_rows(lc, model, ids[k + 1:], x[:t - 1 - k], list(range(k + 1, t)), vocab, k, ext)
        out.append((logits, y))
        x = y
    return out


def _run_file(path: Path, ids: list[int], mtp: bool = True) -> tuple[np.ndarray, np.ndarray | None,
                                                                     np.ndarray | None, np.ndarray | None, list | None]:
    lc, ext = _lib()
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mtp = True
    model = lc.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    try:
        vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        hidden, nextn = lc.llama_model_n_embd(model), lc.llama_model_n_layer_nextn(model)
        ctx = _context(lc, model, len(ids), mtp=False)
        try:
            logits, h = _decode_target(lc, ext, ctx, ids, nextn > 0, vocab, hidden)
        finally:
            lc.llama_free(ctx)
        ours = driver = chain = None
        if h is not None and mtp:
            t = len(ids)
            ours = _mtp_rows(lc, model, ids[1:], h[:-1], list(range(1, t)), vocab)
            driver = _mtp_rows(lc, model, ids, np.vstack([np.zeros((1, hidden), np.float32), h[:-1]]),
                               list(range(t)), vocab)
            if nextn > 1:
                chain = _chain(lc, ext, model, ids, h, nextn, vocab)
        return logits, h, ours, driver, chain
    finally:
        lc.llama_model_free(model)


@functools.lru_cache(maxsize=2)
def _cached(path: str, ids: tuple[int, ...]) -> LlamaOut:
    import llama_cpp

    src = Path(path)
    types = tensor_types(src)
    version = f"llama-cpp-python {llama_cpp.__version__}"
    blocked = mtp_blocker(src)
    if types == ["F32"]:
        res = _run_file(src, list(ids), blocked is None)
        weights = "F32 as stored"
    else:
        with tempfile.TemporaryDirectory(prefix="bloomery-llamacpp-") as d:
            res = _run_file(f32_copy(src, Path(d) / (src.stem + "-f32.gguf")), list(ids), blocked is None)
        weights = f"an F32 copy of the file's {'/'.join(types)} tensors"
    return LlamaOut(*res[:4], version=version, weights=weights, chain=res[4], mtp_blocked=blocked)


def run(path: Path, ids: list[int]) -> LlamaOut:
    """llama.cpp on ``path`` over ``ids`` (cached per (file, ids): a gate's target and MTP checks share one run)."""
    return _cached(str(Path(path).resolve()), tuple(int(i) for i in ids))
