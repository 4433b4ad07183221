"""The target as a llama.cpp GGUF (arch "qwen3"), written with ``gguf.GGUFWriter``.

Tensor names as llama.cpp's converter writes them; Qwen3 uses NEOX RoPE in llama.cpp, so q/k rows are
stored unpermuted. Matrices are stored BF16 (bit-exact copies of the bf16 weights), norms F32 (exact
widening). No ``output.weight``: the head is tied to ``token_embd.weight``. GGUFWriter takes arrays in
logical numpy order ([out, in]) and records the ggml dims reversed ([in, out]); ``read_gguf`` undoes
both and is what the tests compare against the HF tensors.

Both target writers (this one and ``qwen38_target.write_qwen38_gguf``) take an HF-named tensor mapping and write
through ``write_streamed``: every tensor's info first, then each tensor made, written and dropped in turn, so
host memory holds one tensor at a time (the bench writes an 8B model from device memory this way). With
``tok=None`` the file carries no vocabulary (``tokenizer.ggml.model = "no_vocab"`` and ``<arch>.vocab_size``:
llama.cpp loads it without one); ``dtype`` picks the matrices' type (bf16, f16, f32; norms are always F32).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from .tokenizer_train import GGUF_PRE, SPECIALS, merges_list, vocab_list
from .train import TargetShape

ARCH = "qwen3"
Q = gguf.GGMLQuantizationType
# matrix dtype -> (stored type, general.file_type, torch dtype)
MATRIX_TYPES = {"bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16, torch.bfloat16),
                "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16, torch.float16),
                "f32": (Q.F32, gguf.LlamaFileType.ALL_F32, torch.float32)}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    if hf.startswith("model.layers."):
        i, rest = hf[len("model.layers."):].split(".", 1)
        return f"blk.{int(i)}.{_LAYER[rest]}"
    raise KeyError(f"no GGUF name for tensor {hf}")


def hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if name.startswith("blk."):
        i, rest = name[len("blk."):].split(".", 1)
        inv = {v: k for k, v in _LAYER.items()}
        return f"model.layers.{int(i)}.{inv[rest]}"
    raise KeyError(f"no HF name for GGUF tensor {name}")


def _ordered(params: Mapping[str, torch.Tensor], shape: TargetShape) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(shape.num_layers):
        names += [f"model.layers.{i}.{k}" for k in _LAYER]
    names.append("model.norm.weight")
    if "lm_head.weight" in params:
        names.append("lm_head.weight")
    missing = set(params) ^ set(names)
    if missing:
        raise KeyError(f"tensor set differs from the Qwen3 layout: {sorted(missing)}")
    return names


def gguf_header(path: Path, arch: str, name: str, blocks: int, shape) -> gguf.GGUFWriter:
    """A GGUFWriter with the keys every Qwen-style target shares: name, block count, context, widths, heads,
    head dims, RoPE base. ``shape`` has hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim,
    rope_theta, max_position. The caller adds its own keys and the tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(blocks)
    w.add_context_length(shape.max_position)
    w.add_embedding_length(shape.hidden_size)
    w.add_feed_forward_length(shape.intermediate_size)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(float(shape.rope_theta))
    return w


def write_tokenizer(w: gguf.GGUFWriter, tok: Tokenizer, pad: bool = True) -> None:
    """The byte-level BPE tokenizer as convert_hf_to_gguf writes a Qwen2/3 vocab: model gpt2, the pre-tokenizer, the
    token list with the specials as CONTROL, the merges, and <|endoftext|> as bos, eos and (``pad``) pad."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(GGUF_PRE)
    tokens = vocab_list(tok)
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.CONTROL) if t in SPECIALS else int(gguf.TokenType.NORMAL)
                       for t in tokens])
    w.add_token_merges(merges_list(tok))
    eot = tok.token_to_id(SPECIALS[0])
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    if pad:
        w.add_pad_token_id(eot)


def write_vocab(w: gguf.GGUFWriter, tok: Tokenizer | None, vocab_size: int) -> None:
    """The tokenizer (``write_tokenizer``, no bos added), or with ``tok=None`` none: ``tokenizer.ggml.model =
    "no_vocab"`` and ``<arch>.vocab_size`` (llama.cpp then makes that many placeholder tokens)."""
    if tok is None:
        w.add_tokenizer_model("no_vocab")
        w.add_vocab_size(vocab_size)
        return
    write_tokenizer(w, tok)
    w.add_add_bos_token(False)


def file_type(w: gguf.GGUFWriter, dtype: str) -> None:
    """general.file_type and the quantization version for matrices stored as ``dtype`` (bf16, f16, f32)."""
    if dtype not in MATRIX_TYPES:
        raise ValueError(f"GGUF matrix dtype {dtype!r}: expected one of {', '.join(MATRIX_TYPES)}")
    w.add_file_type(MATRIX_TYPES[dtype][1])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def put_tensor(w: gguf.GGUFWriter, name: str, t: torch.Tensor, f32: bool) -> None:
    """``t`` (any float dtype, any device) as F32 when ``f32`` or 1-D, else as BF16 (rounded to nearest even from
    its dtype), the converter's two float types."""
    t = t.detach().to("cpu")
    if f32 or t.ndim < 2:
        w.add_tensor(name, t.double().numpy().astype(np.float32))
    else:
        raw = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint8)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)


@dataclass(frozen=True)
class Planned:
    """One GGUF tensor: its name, logical numpy shape ([out, in]), whether it is a matrix (stored in the file's
    matrix dtype; otherwise F32), and ``make()``, which returns its values (a torch tensor on any device, any
    float dtype) when it is written."""

    name: str
    shape: tuple[int, ...]
    matrix: bool
    make: Callable[[], torch.Tensor]


def write_streamed(w: gguf.GGUFWriter, planned: Sequence[Planned], dtype: str = "bf16") -> None:
    """Write the header, the keys, every tensor's info, then each tensor in turn (made, converted on the host,
    written, dropped) and close ``w``. Byte for byte what ``add_tensor`` + ``write_tensors_to_file`` write."""
    mq, _, mt = MATRIX_TYPES[dtype]
    for p in planned:
        q, t = (mq, mt) if p.matrix else (Q.F32, torch.float32)
        nbytes = int(np.prod(p.shape, dtype=np.int64)) * t.itemsize
        w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), nbytes, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for p in planned:
        x = p.make().detach()
        if tuple(x.shape) != p.shape:
            raise ValueError(f"GGUF tensor {p.name}: made {tuple(x.shape)}, planned {p.shape}")
        x = x.to("cpu", mt if p.matrix else torch.float32).contiguous()
        w.write_tensor_data(x.reshape(-1).view(torch.uint8).numpy())
        del x
    w.close()


def write_target_gguf(path: Path, shape: TargetShape, params: Mapping[str, torch.Tensor], tok: Tokenizer | None,
                      name: str = "qwen3-tiny", dtype: str = "bf16") -> Path:
    """``params`` (HF names, the Qwen3 layout; ``lm_head.weight`` present when untied) as an arch "qwen3" GGUF;
    ``tok=None``: no vocabulary (``write_vocab``); matrices stored as ``dtype``."""
    w = gguf_header(path, ARCH, name, shape.num_layers, shape)
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    file_type(w, dtype)
    write_vocab(w, tok, shape.vocab_size)
    write_streamed(w, [Planned(gguf_name(hf), tuple(params[hf].shape), params[hf].ndim >= 2,
                               lambda hf=hf: params[hf]) for hf in _ordered(params, shape)], dtype)
    return path


def read_gguf(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """(HF-named float32 arrays in logical [out, in] order, metadata dict) straight from GGUFReader."""
    r = gguf.GGUFReader(str(path))
    tensors: dict[str, np.ndarray] = {}
    for t in r.tensors:
        logical = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape(logical)
        tensors[hf_name(t.name)] = np.asarray(arr, dtype=np.float32)
    meta: dict[str, object] = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        meta[k] = f.contents()
    return tensors, meta
