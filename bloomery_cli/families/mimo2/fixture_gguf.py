"""``mimo2-tiny.gguf``: the trained mimo2 fixture in llama.cpp's GGUF layout (arch ``mimo2``), from ``mimo2-tiny/``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.mimo2.fixture_gguf --out fixtures            # bundle + register
    python -m bloomery_cli.families.mimo2.fixture_gguf --out fixtures --gguf-out X.gguf [--qkv split]

No training: the HF fixture's bf16 weights are written as llama.cpp's converter (``conversion/mimo.py``
``MimoV2Model``, llama.cpp 0c1e57098) writes a MiMo-V2 checkpoint with ``--outtype bf16``: the same keys in the same
order (``formats.mimo2_gguf`` lists them; block_count = trunk + 3 MTP blocks, the hybrid pattern extended with 1 per
MTP block, per-block kv heads, value_length = v_head_dim, rope.dimension_count = int(head_dim * 0.334), the group
keys, value_scale, layer_norm_rms_epsilon from MiMo's ``layernorm_epsilon``), the same tensor names, types (matrices
and experts BF16; norms, sinks, the router ``ffn_gate_inp`` and ``exp_probs_b.bias`` F32) and ggml shapes, experts
stacked [E, ff, H] / [E, H, ff]. Checked against the converter's own output on this fixture (run once by hand, two
local shims: the converter reads ``partial_rotary_factor`` only from a top-level rope dict and knows no pre-tokenizer
name for ours; docs/INTERFACES.md, mimo2).

One deliberate choice, ``qkv``: "fused" (default, the bundled file) writes each block's q/k/v as one ``attn_qkv``
[Q | K | V] rows, as the converter writes MiMo-V2.5 (whose checkpoint ships ``qkv_proj``); llama.cpp's MTP graph
runs only that (mimo2.cpp: ``GGML_ASSERT(layer.wqkv && "MIMO2 MTP requires fused attn_qkv")``, an abort). "split"
writes ``attn_q/k/v`` as the converter writes this V2-Flash-layout checkpoint (llama.cpp's trunk runs it, its MTP
cannot). Every tensor is read back through the harness's GGUF reader and must equal the HF tensor exactly (bf16 ->
bf16, bf16 -> f32 are exact). The bytes depend only on the HF fixture (no clock, no randomness): a rerun reproduces
the file (tests check the manifest's sha256).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import gguf
import torch
from tokenizers import Tokenizer

from bloomery_gates.spec import Mimo2Spec

from ...fixturegen.export_gguf import put_tensor, write_tokenizer
from ...fixturegen.gguf_main import export_main
from ...fixturegen.gguf_readback import same_tensors
from ...fixturegen.gguf_register import export_from_hf

TARGET, GGUF = "mimo2-tiny", "mimo2-tiny.gguf"
ARCH = "mimo2"
F32_ALWAYS = ("mlp.gate.weight",)                 # the converter keeps the router F32 (1-D tensors too)
ATTN = {"self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
        "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
        "self_attn.attention_sink_bias": "attn_sinks"}


def _block_order(mtp: bool, sparse: bool, sinks: bool) -> list[tuple[str, str]]:
    """(GGUF suffix, HF suffix) of one block, in the converter's order (safetensors order, experts merged)."""
    head = ([("nextn.eh_proj.weight", "eh_proj.weight"), ("nextn.enorm.weight", "enorm.weight"),
             ("layer_output_norm.weight", "final_layernorm.weight"), ("nextn.hnorm.weight", "hnorm.weight")]
            if mtp else [])
    body = [("attn_norm.weight", "input_layernorm.weight")]
    if sparse:
        body += [("ffn_gate_exps.weight", "gate_proj"), ("ffn_up_exps.weight", "up_proj"),
                 ("ffn_down_exps.weight", "down_proj"), ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
                 ("ffn_gate_inp.weight", "mlp.gate.weight")]
    else:
        body += [("ffn_down.weight", "mlp.down_proj.weight"), ("ffn_gate.weight", "mlp.gate_proj.weight"),
                 ("ffn_up.weight", "mlp.up_proj.weight")]
    body.append(("ffn_norm.weight", "pre_mlp_layernorm.weight" if mtp else "post_attention_layernorm.weight"))
    if sinks:
        body.append(("attn_sinks.weight", "self_attn.attention_sink_bias"))
    body += [("attn_k.weight", "self_attn.k_proj.weight"), ("attn_output.weight", "self_attn.o_proj.weight"),
             ("attn_q.weight", "self_attn.q_proj.weight"), ("attn_v.weight", "self_attn.v_proj.weight")]
    return head + body


def _keys(w: gguf.GGUFWriter, spec: Mimo2Spec, name: str, mtp: int) -> None:
    """The converter's keys, in its order (base TextModel keys, then MimoV2Model's, then the tokenizer)."""
    a, m, ls = f"{ARCH}.", spec.mimo, spec.layer
    pattern = [int(t == "sliding_attention") for t in m.layer_types] + [1] * mtp
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_uint32(a + "block_count", spec.num_layers + mtp)
    w.add_uint32(a + "context_length", spec.max_position)
    w.add_uint32(a + "embedding_length", ls.hidden_size)
    w.add_uint32(a + "feed_forward_length", ls.intermediate_size)
    w.add_uint32(a + "attention.head_count", ls.num_heads)
    w.add_array(a + "attention.head_count_kv", [m.swa.num_kv_heads if s else m.full.num_kv_heads for s in pattern])
    w.add_float32(a + "rope.freq_base", float(m.full.rope_theta))
    if "sliding_attention" in m.layer_types or mtp:
        w.add_float32(a + "rope.freq_base_swa", float(m.swa.rope_theta))
    w.add_float32(a + "attention.layer_norm_rms_epsilon", float(ls.rms_eps))
    if m.moe is not None:
        w.add_uint32(a + "expert_count", m.moe.num_experts)
        w.add_uint32(a + "expert_used_count", m.moe.top_k)
        w.add_uint32(a + "expert_group_count", m.moe.n_group)
        w.add_uint32(a + "expert_group_used_count", m.moe.topk_group)
        w.add_uint32(a + "expert_gating_func", 2)                       # sigmoid
    w.add_uint32(a + "attention.key_length", ls.head_dim)
    w.add_uint32(a + "attention.value_length", m.full.v_head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_uint32(a + "attention.sliding_window", m.swa.window or 0)
    w.add_array(a + "attention.sliding_window_pattern", pattern)
    if m.moe is not None:
        w.add_uint32(a + "expert_feed_forward_length", m.moe.expert_ff)
    w.add_uint32(a + "rope.dimension_count", m.full.rotary_dim)
    if m.value_scale != 1.0:
        w.add_float32(a + "attention.value_scale", float(m.value_scale))
    if mtp:
        w.add_uint32(a + "nextn_predict_layers", mtp)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_mimo2_gguf(path: Path, spec: Mimo2Spec, tok: Tokenizer, name: str = TARGET, qkv: str = "fused",
                     drop: tuple[str, ...] = ()) -> Path:
    """``spec`` (an HF-layout mimo2 target with its MTP layers) as llama.cpp's converter writes it. ``drop``: GGUF
    tensor-name suffixes left out (tests plant a file without its sinks with it)."""
    if qkv not in ("fused", "split"):
        raise ValueError(f"qkv {qkv!r}: expected 'fused' or 'split'")
    m, L, mtp = spec.mimo, spec.num_layers, spec.mimo.mtp_layers
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, spec, name, mtp)
    write_tokenizer(w, tok, pad=False)
    T = spec.tensors
    put_tensor(w, "output.weight", T["lm_head.weight" if "lm_head.weight" in T else "model.embed_tokens.weight"], False)
    put_tensor(w, "token_embd.weight", T["model.embed_tokens.weight"], False)
    for i in range(L + mtp):
        is_mtp = i >= L
        head = f"model.mtp.layers.{i - L}." if is_mtp else f"model.layers.{i}."
        a = m.swa if is_mtp else m.attn(i)
        sparse = not is_mtp and m.mlp_types[i] == "sparse"
        order = _block_order(is_mtp, sparse, a.sinks)
        if qkv == "fused":
            qkv_rows = torch.cat([T[head + f"self_attn.{p}_proj.weight"] for p in "qkv"], 0)
            order = [o for o in order if o[0] not in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
            order.insert(len(order) - 1, ("attn_qkv.weight", None))
        for gsuf, hsuf in order:
            g = f"blk.{i}.{gsuf}"
            if any(g.endswith(d) for d in drop):
                continue
            if gsuf == "attn_qkv.weight":
                put_tensor(w, g, qkv_rows, False)
            elif gsuf.endswith("_exps.weight"):
                put_tensor(w, g, torch.stack([T[f"{head}mlp.experts.{e}.{hsuf}.weight"]
                                             for e in range(m.moe.num_experts)]), False)
            else:
                put_tensor(w, g, T[head + hsuf], hsuf in F32_ALWAYS)
    put_tensor(w, "output_norm.weight", T["model.norm.weight"], True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_readback(path: Path, spec: Mimo2Spec) -> None:
    """Every tensor of ``spec`` (trunk and MTP) read back through the harness's GGUF reader, exactly equal."""
    from ...loading import load_target

    got = load_target(path)
    same_tensors(path, got.tensors, spec.tensors)
    # the GGUF stores the rotary channel count, not the factor (0.334 -> int(32 * 0.334) = 10 -> 10 / 32)
    want = replace(spec.mimo, partial_rotary_factor=got.mimo.partial_rotary_factor)
    if (got.layer, got.mimo) != (spec.layer, want) or int(spec.layer.head_dim * got.mimo.partial_rotary_factor) != \
            spec.mimo.full.rotary_dim:
        raise RuntimeError(f"{path}: shapes read back {got.layer}, {got.mimo}; expected {spec.layer}, {spec.mimo}")


def export_gguf(fixtures: Path, out: Path | None = None, qkv: str = "fused") -> Path:
    """Write ``mimo2-tiny.gguf`` from ``fixtures/mimo2-tiny``. With ``out``: there, unregistered; without: into
    ``fixtures`` and its manifest (entry ``mimo2-tiny`` gains the file), refused with nothing moved when the
    fixtures would store more than ``MAX_FIXTURE_BYTES`` distinct bytes."""
    return export_from_hf(fixtures, out, GGUF, TARGET, partial(write_mimo2_gguf, qkv=qkv),
                          check_readback, {
        "command": "python -m bloomery_cli.families.mimo2.fixture_gguf --out fixtures",
        "from": f"{TARGET}/model.safetensors (the trained weights unchanged)",
        "layout": "llama.cpp converter (conversion/mimo.py), arch mimo2, BF16, fused attn_qkv "
                  "(the MiMo-V2.5 layout llama.cpp's MTP graph requires), 3 MTP blocks"}, label="mimo2 GGUF export")


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__, TARGET, export_gguf, "qkv", ("fused", "split"),
                       "--qkv split only with --gguf-out (the bundled file is the fused layout)")


if __name__ == "__main__":
    raise SystemExit(main())
