"""``qwen4exp-tiny.gguf``: the trained qwen4exp trunk in llama.cpp's GGUF layout (arch ``qwen4exp``), from
``qwen4exp-tiny/``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen4exp.fixture_gguf --out fixtures           # bundle + register
    python -m bloomery_cli.families.qwen4exp.fixture_gguf --out fixtures --gguf-out X.gguf [--dtype f32]

No training: the HF fixture's bf16 weights written as llama.cpp's converter (``conversion/qwen4exp.py`` over
``conversion/qwen.py``, llama.cpp 0c1e57098) writes the checkpoint with ``--outtype bf16``: its keys in its order
(the qwen35 keys without ``feed_forward_length``; ``attention.recurrent_layers`` and ``full_attention_interval``;
``hyper_connection.{count, low_rank}``; ``attention.indexer.{head_count, key_length, top_k}`` with top_k = the
token budget; ``attention.compress_ratios`` (the ratio on full layers, 0 on GDN ones); ``ple.{layers (0-based),
ngram_size, heads_per_ngram, conv_kernel, eos_token_id, layer_multipliers, head_offsets, head_vocab_sizes}`` (the
last three UINT64 arrays, the hashing's integers: ``bloomery_gates.ple_hash``) and
``embedding_length_per_layer_input`` = the table's row width), its names and transforms (``gguf_names``), its types
(matrices BF16; 1-D tensors, ``*_norm``, ``ffn_gate_inp*``, ``ssm_conv1d``, ``ssm_a``, ``ssm_dt.bias`` F32) and ggml
shapes. The trunk only: the MTP head is a separate GGUF in the real release (FAMILIES_MOE.md section 6) and the
converter drops ``mtp.*`` (``no_mtp``).

One key the converter takes from the config the fixture lacks: ``rope.dimension_sections``. The converter writes
the Qwen3.5 default [11, 11, 10, 0], whose sum 32 exceeds this fixture's head_dim 16 (ggml asserts sum <=
head_dim and aborts); written here is ``formats.rope_sections.writer_sections`` (every rotary pair on a text
position stream: plain partial RoPE, as the reader checks).

Checked against the converter's own output on this fixture (run once by hand, three local shims: its
``load_hparams`` reads config.json directly (AutoConfig maps qwen4_exp to the multimodal defaults), the pre-tokenizer
falls back to "qwen2", and the converter's inputs the HF fixture does not store were supplied: the PLE table as
``ngram_embedding.shard_0`` and the int64 hashing buffers from ``ple_hash``, with ``mrope_section`` [1, 1, 0]):
the same 112 tensor names, types, shapes and values, the same keys. Every tensor is read back through the
harness's GGUF reader (``check_readback``): matrices and reshapes exactly; the 1 + w norms within float32's rounding
of 1 + w (2^-24); A_log from -exp(A_log) within float32 rounding. The bytes depend only on the HF fixture: a rerun
reproduces the file (tests check the manifest's sha256).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gguf
import torch
from tokenizers import Tokenizer

from bloomery_gates import ple_hash
from bloomery_gates.errors import Refused
from bloomery_gates.spec import HybridShape, Qwen4ExpSpec

from ...fixturegen.export_gguf import put_tensor, write_tokenizer
from ...fixturegen.gguf_main import export_main
from ...fixturegen.gguf_readback import same_fields, same_tensors
from ...fixturegen.gguf_register import export_from_hf
from ...formats.rope_sections import writer_sections
from ..qwen38.fixture import _gguf_array
from ..qwen38.reader import gguf_name
from .gguf_names import QK, own_name, plus_one

TARGET, GGUF = "qwen4exp-tiny", "qwen4exp-tiny.gguf"
ARCH = "qwen4exp"
A = ARCH + "."
V = gguf.GGUFValueType
F32_NAMES = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
Edit = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _HybridOnly:
    """What ``qwen38.fixture._gguf_array`` reads of its shape argument: ``spec(...).hybrid``."""

    hybrid: HybridShape

    def spec(self, _tensors: object) -> _HybridOnly:
        return self


def to_gguf(spec: Qwen4ExpSpec, hf: str, x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The GGUF tensor(s) of one HF-named trunk tensor ``x`` (numpy order; float64 where a transform computes)."""
    name = own_name(hf)
    if name is not None:
        if plus_one(hf):
            x = x.double() + 1.0
        if hf.endswith("ple.conv1d.weight"):
            x = x.reshape(x.shape[0], x.shape[-1])
        return [(name, x)]
    if hf.endswith(QK):
        i, nq = hf.split(".")[2], spec.qsa.num_heads * spec.qsa.head_dim
        return [(f"blk.{i}.indexer.q_proj.weight", x[:nq]), (f"blk.{i}.indexer.k_proj.weight", x[nq:])]
    g = gguf_name(hf, spec.num_layers)                    # the Qwen3.5 tensors: qwen38's converter transforms
    x = _gguf_array(hf, x, _HybridOnly(spec.hybrid))
    if hf.endswith("mlp.experts.gate_up_proj"):
        ff = x.shape[1] // 2
        return [(g.replace("ffn_gate_up_exps", "ffn_gate_exps"), x[:, :ff]),
                (g.replace("ffn_gate_up_exps", "ffn_up_exps"), x[:, ff:])]
    return [(g, x)]


def _keys(w: gguf.GGUFWriter, spec: Qwen4ExpSpec, name: str, dtype: str) -> None:
    """The converter's keys in its order (module docstring)."""
    ls, hy, moe, hc, q, p = spec.layer, spec.hybrid, spec.moe, spec.hc, spec.qsa, spec.ple
    L = spec.num_layers
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_uint32(A + "block_count", L)
    w.add_uint32(A + "context_length", spec.max_position)
    w.add_uint32(A + "embedding_length", ls.hidden_size)
    w.add_uint32(A + "attention.head_count", ls.num_heads)
    w.add_uint32(A + "attention.head_count_kv", ls.num_kv_heads)
    w.add_key_value(A + "rope.dimension_sections", writer_sections(hy.rotary_dim, ls.head_dim), V.ARRAY, V.INT32)
    w.add_float32(A + "rope.freq_base", float(ls.rope_theta))
    w.add_float32(A + "attention.layer_norm_rms_epsilon", float(ls.rms_eps))
    w.add_uint32(A + "expert_count", moe.num_experts)
    w.add_uint32(A + "expert_used_count", moe.top_k)
    w.add_uint32(A + "attention.key_length", ls.head_dim)
    w.add_uint32(A + "attention.value_length", ls.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16" else gguf.LlamaFileType.ALL_F32)
    w.add_uint32(A + "expert_feed_forward_length", moe.expert_ff)
    if moe.shared_ff:
        w.add_uint32(A + "expert_shared_feed_forward_length", moe.shared_ff)
    w.add_uint32(A + "ssm.conv_kernel", hy.linear_conv_kernel_dim)
    w.add_uint32(A + "ssm.state_size", hy.linear_key_head_dim)
    w.add_uint32(A + "ssm.group_count", hy.linear_num_key_heads)
    w.add_uint32(A + "ssm.time_step_rank", hy.linear_num_value_heads)
    w.add_uint32(A + "ssm.inner_size", hy.linear_value_head_dim * hy.linear_num_value_heads)
    full = [t != "linear_attention" for t in hy.layer_types]
    every = full.index(True) + 1 if any(full) else L + 1
    if any(f != ((i + 1) % every == 0) for i, f in enumerate(full)):
        raise ValueError(f"layer_types {list(hy.layer_types)} is not a full_attention_interval schedule")
    w.add_key_value(A + "attention.recurrent_layers", [not f for f in full], V.ARRAY, V.BOOL)
    w.add_uint32(A + "full_attention_interval", every)
    w.add_uint32(A + "rope.dimension_count", hy.rotary_dim)
    w.add_uint32(A + "hyper_connection.count", hc.count)
    w.add_uint32(A + "hyper_connection.low_rank", hc.low_rank)
    w.add_uint32(A + "attention.indexer.head_count", q.num_heads)
    w.add_uint32(A + "attention.indexer.key_length", q.head_dim)
    w.add_uint32(A + "attention.indexer.top_k", q.budget)
    w.add_key_value(A + "attention.compress_ratios", [q.compress_ratio if f else 0 for f in full], V.ARRAY, V.INT32)
    if p is not None:
        mult, sizes, offsets = ple_hash.spec_tables(p, spec.vocab_size)
        w.add_key_value(A + "ple.layers", list(p.layers), V.ARRAY, V.INT32)
        w.add_uint32(A + "ple.ngram_size", p.ngram_size)
        w.add_uint32(A + "ple.heads_per_ngram", p.heads_per_ngram)
        w.add_uint32(A + "ple.conv_kernel", p.conv_kernel)
        w.add_uint32(A + "ple.eos_token_id", p.eos_token_id)
        w.add_uint32(A + "embedding_length_per_layer_input", p.embed_dim // len(sizes))
        w.add_key_value(A + "ple.layer_multipliers", mult, V.ARRAY, V.UINT64)
        w.add_key_value(A + "ple.head_offsets", offsets, V.ARRAY, V.UINT64)
        w.add_key_value(A + "ple.head_vocab_sizes", sizes, V.ARRAY, V.UINT64)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _put(w: gguf.GGUFWriter, name: str, t: torch.Tensor, dtype: str) -> None:
    put_tensor(w, name, t, dtype == "f32" or name.endswith(F32_NAMES) or not name.endswith(".weight"))


def refuse_inexpressible(spec: Qwen4ExpSpec) -> None:
    """A spec the format cannot carry is refused by name, never written as a different model: llama.cpp's qwen4exp
    graph gates the GDN output norm with sigmoid (``build_norm_gated``) and renormalises the top-k (``build_moe_ffn``
    with norm true); no key says otherwise."""
    if spec.output_gate != "sigmoid":
        raise Refused(spec.source, f"GDN output gate {spec.output_gate!r}: a qwen4exp GGUF has no key for it and "
                                   "llama.cpp gates with sigmoid (qwen4exp.cpp build_norm_gated)")
    if not spec.moe.norm_topk:
        raise Refused(spec.source, "norm_topk_prob false: llama.cpp's qwen4exp graph always renormalises the top-k")


def write_qwen4exp_gguf(path: Path, spec: Qwen4ExpSpec, tok: Tokenizer, name: str = TARGET, dtype: str = "bf16",
                        edit: Mapping[str, Edit] | None = None) -> Path:
    """``spec`` (an HF-layout qwen4exp target) as llama.cpp's converter writes its trunk. ``edit``: GGUF tensor name
    -> a function applied to that tensor before it is written (tests plant a wrong tensor with it)."""
    if dtype not in ("bf16", "f32"):
        raise ValueError(f"dtype {dtype!r}: expected 'bf16' or 'f32'")
    refuse_inexpressible(spec)
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, spec, name, dtype)
    write_tokenizer(w, tok, pad=False)
    edit = dict(edit or {})
    for hf in spec.tensors:
        if hf.startswith("mtp.") or hf == "lm_head.weight" and spec.tie_word_embeddings:
            continue
        for g, x in to_gguf(spec, hf, spec.tensors[hf]):
            _put(w, g, edit.pop(g)(x) if g in edit else x, dtype)
    if edit:
        raise KeyError(f"edit names tensors the file does not have: {sorted(edit)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bound(n: str, a: torch.Tensor) -> torch.Tensor:
    """The read-back bound of HF tensor ``n`` (values ``a``): A_log within float32's rounding of -exp(A_log), a
    stored 1 + w norm within half a float32 ulp of it, anything else exact."""
    if n.endswith("linear_attn.A_log"):
        return 2.0 ** -23 * (1 + a.abs())
    if plus_one(n) or n.endswith("norm.weight") and not n.endswith("linear_attn.norm.weight"):
        return 2.0 ** -24 * (1 + a).abs().clamp(min=1.0)            # half a float32 ulp of the stored 1 + w
    return torch.zeros_like(a)


def check_readback(path: Path, spec: Qwen4ExpSpec) -> None:
    """Every trunk tensor of ``spec`` read back through the harness's GGUF reader (module docstring's bounds),
    and the same shapes."""
    from ...loading import load_target

    got = load_target(path)
    same_tensors(path, got.tensors, {n: x for n, x in spec.tensors.items() if not n.startswith("mtp.")}, _bound)
    same_fields(path, got, spec, ("layer", "num_layers", "vocab_size", "hybrid", "moe", "hc", "qsa", "output_gate"))
    p, q = spec.ple, got.ple
    if (p is None) != (q is None) or p is not None and (
            (q.layers, q.embed_dim, q.conv_kernel, q.ngram_size, q.heads_per_ngram, q.eos_token_id)
            != (p.layers, p.embed_dim, p.conv_kernel, p.ngram_size, p.heads_per_ngram, p.eos_token_id)
            or ple_hash.spec_tables(q, got.vocab_size) != ple_hash.spec_tables(p, spec.vocab_size)):
        raise RuntimeError(f"{path}: PLE read back {q}; expected {p}'s tables")


def export_gguf(fixtures: Path, out: Path | None = None, dtype: str = "bf16") -> Path:
    """Write ``qwen4exp-tiny.gguf`` from ``fixtures/qwen4exp-tiny``: with ``out`` there, unregistered; without, into
    ``fixtures`` and its manifest (``gguf_register``)."""
    return export_from_hf(fixtures, out, GGUF, TARGET, partial(write_qwen4exp_gguf, dtype=dtype),
                          check_readback, {
        "command": "python -m bloomery_cli.families.qwen4exp.fixture_gguf --out fixtures",
        "from": f"{TARGET}/model.safetensors (the trained weights unchanged; mtp.* left out, as the converter)",
        "layout": "llama.cpp converter (conversion/qwen4exp.py), arch qwen4exp, BF16, trunk only; "
                  "rope.dimension_sections from formats.rope_sections.writer_sections"})


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__, TARGET, export_gguf, "dtype", ("bf16", "f32"),
                       "--dtype f32 only with --gguf-out (the bundled file is BF16)")


if __name__ == "__main__":
    raise SystemExit(main())
