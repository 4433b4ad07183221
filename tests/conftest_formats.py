"""Builders of tiny checkpoints for tests/test_formats.py and tests/test_loading_errors.py.

Not a conftest (pytest does not load it by itself): the two test files import it. The default tiny
Qwen3: H=16, 2 layers, 2 heads, 1 kv head, head_dim 8, I=32, V=64.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

TINY = dict(H=16, L=2, heads=2, kv=1, d=8, I=32, V=64)
_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def layer_tensors(prefix: str, H: int, heads: int, kv: int, d: int, I: int, g: torch.Generator) -> dict:
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {
        f"{prefix}input_layernorm.weight": r(H), f"{prefix}post_attention_layernorm.weight": r(H),
        f"{prefix}self_attn.q_proj.weight": r(heads * d, H), f"{prefix}self_attn.k_proj.weight": r(kv * d, H),
        f"{prefix}self_attn.v_proj.weight": r(kv * d, H), f"{prefix}self_attn.o_proj.weight": r(H, heads * d),
        f"{prefix}self_attn.q_norm.weight": r(d), f"{prefix}self_attn.k_norm.weight": r(d),
        f"{prefix}mlp.gate_proj.weight": r(I, H), f"{prefix}mlp.up_proj.weight": r(I, H),
        f"{prefix}mlp.down_proj.weight": r(H, I),
    }


def qwen3_tensors(seed: int = 0, tied: bool = False, **shape: int) -> dict[str, torch.Tensor]:
    s = {**TINY, **shape}
    g = torch.Generator().manual_seed(seed)
    t = {"model.embed_tokens.weight": torch.randn(s["V"], s["H"], generator=g)}
    for i in range(s["L"]):
        t.update(layer_tensors(f"model.layers.{i}.", s["H"], s["heads"], s["kv"], s["d"], s["I"], g))
    t["model.norm.weight"] = torch.randn(s["H"], generator=g)
    if not tied:
        t["lm_head.weight"] = torch.randn(s["V"], s["H"], generator=g)
    return t


def qwen3_config(tied: bool = False, **shape: Any) -> dict[str, Any]:
    s = {**TINY, **shape}
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": s["H"],
        "num_hidden_layers": s["L"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"],
        "head_dim": s["d"], "intermediate_size": s["I"], "vocab_size": s["V"], "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 128, "tie_word_embeddings": tied,
        "hidden_act": "silu", "attention_bias": False,
    }


def write_hf(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None,
             shards: int = 1) -> Path:
    """config.json (unless None) + model.safetensors, or ``shards`` files with an index."""
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(dict(tensors), str(directory / "model.safetensors"))
        return directory
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(directory / fname))
        weight_map.update({n: fname for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def make_qwen3_hf(directory: Path, tied: bool = False, shards: int = 1, seed: int = 0,
                  dtype: torch.dtype = torch.float32, **shape: Any) -> tuple[Path, dict[str, torch.Tensor]]:
    t = {k: v.to(dtype) for k, v in qwen3_tensors(seed, tied, **shape).items()}
    return write_hf(directory, t, qwen3_config(tied, **shape), shards), t


def gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    if not hf.startswith("model.layers."):
        return hf
    _, _, i, rest = hf.split(".", 3)
    mod, _, leaf = rest.rpartition(".")
    return f"blk.{i}.{_BLOCK[mod]}.{leaf}"


def gguf_meta(arch: str = "qwen3", **shape: Any) -> dict[str, tuple[str, Any]]:
    s = {**TINY, **shape}
    a = arch
    return {
        f"{a}.block_count": ("u32", s["L"]), f"{a}.context_length": ("u32", 128),
        f"{a}.embedding_length": ("u32", s["H"]), f"{a}.feed_forward_length": ("u32", s["I"]),
        f"{a}.attention.head_count": ("u32", s["heads"]), f"{a}.attention.head_count_kv": ("u32", s["kv"]),
        f"{a}.attention.key_length": ("u32", s["d"]), f"{a}.attention.value_length": ("u32", s["d"]),
        f"{a}.rope.freq_base": ("f32", 1000000.0), f"{a}.attention.layer_norm_rms_epsilon": ("f32", 1e-6),
    }


def encode(arr: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """What the writer stores for ``arr`` (logical order) in ``qtype``."""
    Q = gguf.GGMLQuantizationType
    if qtype == Q.F32:
        return arr.astype(np.float32)
    if qtype == Q.F16:
        return arr.astype(np.float16)
    if qtype == Q.I32:
        return arr.astype(np.int32)
    return gguf.quants.quantize(arr.astype(np.float32), qtype)


def write_gguf(path: Path, tensors: dict[str, np.ndarray | torch.Tensor], meta: dict[str, tuple[str, Any]],
               arch: str = "qwen3", qtype: Callable[[str, np.ndarray], gguf.GGMLQuantizationType] | None = None,
               rename: Callable[[str], str] = gguf_name) -> Path:
    """A GGUF with ``meta`` ({key: (kind, value)}) and ``tensors`` (logical order), each in ``qtype(name, a)``."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (kind, value) in meta.items():
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string, "arr": w.add_array}[kind](key, value)
    Q = gguf.GGMLQuantizationType
    for name, t in tensors.items():
        arr = t.numpy() if isinstance(t, torch.Tensor) else t
        q = qtype(name, arr) if qtype else Q.F32
        data = encode(arr, q)
        w.add_tensor(rename(name), data, raw_dtype=None if q in (Q.F32, Q.F16, Q.I32) else q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_qwen3_gguf(path: Path, tied: bool = False, qtype=None, seed: int = 0,
                    **shape: Any) -> tuple[Path, dict[str, torch.Tensor]]:
    t = qwen3_tensors(seed, tied, **shape)
    return write_gguf(path, t, gguf_meta(**shape), qtype=qtype), t


def dflash_config(H: int = 16, depth: int = 1, block: int = 4, mask: int = 63,
                  layer_ids: list[int] | None = (1,), **over: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
        "num_hidden_layers": depth, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "intermediate_size": 32, "vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "block_size": block, "dflash_config": {"mask_token_id": mask},
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    }
    if layer_ids is not None:
        cfg["dflash_config"]["target_layer_ids"] = list(layer_ids)
    cfg.update(over)
    return cfg


def make_dflash(directory: Path, H: int = 16, n: int = 1, depth: int = 1, seed: int = 1,
                **cfg_over: Any) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    t = {"fc.weight": torch.randn(H, n * H, generator=g), "hidden_norm.weight": torch.randn(H, generator=g),
         "norm.weight": torch.randn(H, generator=g)}
    for i in range(depth):
        t.update(layer_tensors(f"layers.{i}.", H, 2, 1, 8, 32, g))
    cfg = dflash_config(H=H, depth=depth, **cfg_over)
    return write_hf(directory, t, cfg), t


def write_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(63)} | {"[UNK]": 63}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path
