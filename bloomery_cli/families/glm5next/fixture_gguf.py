"""``glm5next-tiny.gguf``: the trained glm5next trunk and its NextN block in llama.cpp's GGUF layout (arch
``glm5-next``), from ``glm5next-tiny/``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.glm5next.fixture_gguf --out fixtures           # bundle + register
    python -m bloomery_cli.families.glm5next.fixture_gguf --out fixtures --gguf-out X.gguf [--dtype f32]

No training: the HF fixture's bf16 weights written as llama.cpp's converter (``conversion/glm.py``
``Glm5NextModel``, llama.cpp 0c1e57098) writes the checkpoint with ``--outtype bf16``, with gguf-py directly (the
converter reads the released checkpoint's names, not transformers': ``q/k/v_conv1d``, ``hc_attn_fn``, per-expert
tensors, a nested ``linear_attn_config``). Its keys in its order: block_count = trunk + NextN blocks, per-block
``attention.head_count_kv`` (0 KDA, 1 MLA and NextN), ``layer_norm_epsilon`` 1e-6, the MLA lengths (key_length =
value_length = kv_lora_rank, the latent the cache holds), the KDA keys, the indexer keys (``types`` per trunk block,
true = full), the mHC keys, the MoE keys with ``expert_group_count`` / ``expert_group_used_count`` (the converter's
base class writes ``n_group`` / ``topk_group``; llama.cpp's loader reads them for every arch, llama-model.cpp
``load_hparams``, and ``build_moe_ffn`` limits the choice to the best groups by their top-2 sums, llama-graph.cpp),
the per-block SwiGLU clamps; names and transforms from ``gguf_names``; types: matrices BF16, the converter's F32 set
(1-D tensors, norms, ffn_gate_inp, hc_*_fn, the indexer's proj and compressor, the KDA convolutions).

One deliberate difference: the fixture ties its head to the embedding and the converter then writes no
``output.weight``, which llama.cpp's glm5-next loader requires (``create_tensor(output, ..., 0)``), so the file
carries ``output.weight`` = the embedding (the same numbers; the reader then sees an untied head of equal values).

Checked against the converter's own output on this fixture (run once by hand: the HF fixture renamed to the
checkpoint's names, config.json read directly, the pre-tokenizer "qwen2" and its gpt2 vocab path): the same tensor
names, types, shapes and values (the converter's plus output.weight), the same keys. Every tensor reads back through
the harness's GGUF reader exactly, but A_log (from -exp(A_log), within float32 rounding). The bytes depend only on
the HF fixture: a rerun reproduces the file (tests check the manifest's sha256).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import gguf
import torch
from tokenizers import Tokenizer

from bloomery_gates.spec import Glm5NextSpec

from ...fixturegen.export_gguf import put_tensor, write_tokenizer
from ...fixturegen.gguf_main import export_main
from ...fixturegen.gguf_readback import same_fields, same_tensors
from ...fixturegen.gguf_register import export_from_hf
from .gguf_names import F32_SUFFIXES, to_gguf

TARGET, GGUF = "glm5next-tiny", "glm5next-tiny.gguf"
ARCH = "glm5-next"
A = ARCH + "."
V = gguf.GGUFValueType
SIGMOID = 2
Edit = Callable[[torch.Tensor], torch.Tensor]


def _keys(w: gguf.GGUFWriter, spec: Glm5NextSpec, name: str, dtype: str) -> None:
    """The converter's keys in its order (module docstring)."""
    ls, mla, kda, dsa, moe, hc = spec.layer, spec.mla, spec.kda, spec.dsa, spec.moe, spec.hc
    n, blocks = spec.num_layers, spec.num_layers + spec.nextn_layers
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_uint32(A + "block_count", blocks)
    w.add_uint32(A + "context_length", spec.max_position)
    w.add_uint32(A + "embedding_length", ls.hidden_size)
    w.add_uint32(A + "feed_forward_length", ls.intermediate_size)
    w.add_uint32(A + "attention.head_count", ls.num_heads)
    kv = [0 if t == "linear_attention" else 1 for t in spec.layer_types] + [1] * spec.nextn_layers
    w.add_key_value(A + "attention.head_count_kv", kv, V.ARRAY, V.INT32)
    w.add_float32(A + "attention.layer_norm_rms_epsilon", float(ls.rms_eps))
    w.add_uint32(A + "expert_count", moe.num_experts)
    w.add_uint32(A + "expert_used_count", moe.top_k)
    w.add_uint32(A + "expert_group_count", moe.n_group)
    w.add_uint32(A + "expert_group_used_count", moe.topk_group)
    w.add_uint32(A + "expert_gating_func", SIGMOID)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16" else gguf.LlamaFileType.ALL_F32)
    w.add_uint32(A + "vocab_size", spec.vocab_size)
    w.add_float32(A + "attention.layer_norm_epsilon", 1e-6)
    if spec.nextn_layers:
        w.add_uint32(A + "nextn_predict_layers", spec.nextn_layers)
    w.add_uint32(A + "ssm.conv_kernel", kda.conv_kernel)
    w.add_uint32(A + "kda.head_dim", kda.head_dim)
    w.add_float32(A + "kda.gate_lower_bound", float(kda.lower_bound))
    w.add_uint32(A + "attention.q_lora_rank", mla.q_lora_rank)
    w.add_uint32(A + "attention.kv_lora_rank", mla.kv_lora_rank)
    w.add_uint32(A + "rope.dimension_count", 0)
    w.add_uint32(A + "attention.key_length", mla.kv_lora_rank)
    w.add_uint32(A + "attention.value_length", mla.kv_lora_rank)
    w.add_uint32(A + "attention.key_length_mla", mla.qk_nope_head_dim)
    w.add_uint32(A + "attention.value_length_mla", mla.v_head_dim)
    w.add_uint32(A + "attention.indexer.head_count", dsa.num_heads)
    w.add_uint32(A + "attention.indexer.key_length", dsa.head_dim)
    w.add_uint32(A + "attention.indexer.top_k", dsa.topk)
    w.add_uint32(A + "attention.indexer.kpool", dsa.kpool)
    w.add_bool(A + "attention.indexer.kpool_select_tail", bool(dsa.select_tail))
    full = [t != "shared" for t in dsa.types[:n]]
    w.add_key_value(A + "attention.indexer.types", full, V.ARRAY, V.BOOL)
    w.add_uint32(A + "hyper_connection.count", hc.count)
    w.add_uint32(A + "hyper_connection.sinkhorn_iterations", hc.sinkhorn_iters)
    w.add_float32(A + "hyper_connection.epsilon", float(hc.eps))
    w.add_uint32(A + "leading_dense_block_count", spec.mlp_types.index("sparse") if "sparse" in spec.mlp_types
                 else n)
    w.add_uint32(A + "expert_feed_forward_length", moe.expert_ff)
    w.add_uint32(A + "expert_shared_count", (moe.shared_ff or 0) // moe.expert_ff)
    w.add_float32(A + "expert_weights_scale", float(moe.routed_scale))
    w.add_bool(A + "expert_weights_norm", bool(moe.norm_topk))
    w.add_key_value(A + "swiglu_clamp_exp", [float(spec.swiglu_limit)] * blocks, V.ARRAY, V.FLOAT32)
    w.add_key_value(A + "swiglu_clamp_shexp", [float(spec.swiglu_limit)] * blocks, V.ARRAY, V.FLOAT32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _put(w: gguf.GGUFWriter, name: str, t: torch.Tensor, dtype: str) -> None:
    put_tensor(w, name, t, dtype == "f32" or name.endswith(F32_SUFFIXES) or not name.endswith(".weight"))


def write_glm5next_gguf(path: Path, spec: Glm5NextSpec, tok: Tokenizer, name: str = TARGET, dtype: str = "bf16",
                        edit: Mapping[str, Edit] | None = None) -> Path:
    """``spec`` (an HF-layout glm5next target with its NextN block) as llama.cpp's converter writes it, plus
    output.weight when tied. ``edit``: GGUF tensor name -> a function applied before it is written (tests plant a
    wrong tensor with it)."""
    if dtype not in ("bf16", "f32"):
        raise ValueError(f"dtype {dtype!r}: expected 'bf16' or 'f32'")
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, spec, name, dtype)
    write_tokenizer(w, tok, pad=False)
    edit = dict(edit or {})
    T, m = spec.tensors, spec.mla
    order = [n for n in T if n != "model.norm.weight"] + ["model.norm.weight"]
    if spec.tie_word_embeddings and "lm_head.weight" not in T:
        order.insert(1, "lm_head.weight")
    for hf in order:
        x = T["model.embed_tokens.weight" if hf == "lm_head.weight" and hf not in T else hf]
        for g, y in to_gguf(hf, x, m.num_heads, m.qk_nope_head_dim):
            _put(w, g, edit.pop(g)(y) if g in edit else y, dtype)
    if edit:
        raise KeyError(f"edit names tensors the file does not have: {sorted(edit)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_readback(path: Path, spec: Glm5NextSpec) -> None:
    """Every tensor of ``spec`` read back through the harness's GGUF reader: exactly, A_log within float32's
    rounding of log(-(-exp(A_log))); the same shapes and routing."""
    from ...loading import load_target

    got = load_target(path)
    names = set(spec.tensors) | ({"lm_head.weight"} if spec.tie_word_embeddings else set())
    want = {n: spec.tensors["model.embed_tokens.weight" if n not in spec.tensors else n] for n in names}
    same_tensors(path, got.tensors, want,
                 lambda n, a: 2.0 ** -23 * (1 + a.abs()) if n.endswith("A_log") else torch.zeros_like(a))
    same_fields(path, got, spec, ("layer", "num_layers", "layer_types", "mlp_types", "mla", "dsa", "kda", "moe", "hc",
                                  "swiglu_limit", "nextn_layers"))


def export_gguf(fixtures: Path, out: Path | None = None, dtype: str = "bf16") -> Path:
    """Write ``glm5next-tiny.gguf`` from ``fixtures/glm5next-tiny``: with ``out`` there, unregistered; without, into
    ``fixtures`` and its manifest (``gguf_register``)."""
    return export_from_hf(fixtures, out, GGUF, TARGET, partial(write_glm5next_gguf, dtype=dtype),
                          check_readback, {
        "command": "python -m bloomery_cli.families.glm5next.fixture_gguf --out fixtures",
        "from": f"{TARGET}/model.safetensors (the trained weights unchanged, the NextN block included)",
        "layout": "llama.cpp converter (conversion/glm.py), arch glm5-next, BF16, expert groups 2/1 as written by "
                  "the converter and read by llama.cpp's loader; output.weight = the tied embedding"})


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__, TARGET, export_gguf, "dtype", ("bf16", "f32"),
                       "--dtype f32 only with --gguf-out (the bundled file is BF16)")


if __name__ == "__main__":
    raise SystemExit(main())
