"""Model shapes for ``bloomery bench --shape``, random weights made on the device, and HF transformers'
Qwen3ForCausalLM carrying the very same tensors (for the in-process comparison).

Weights are generated where they will run (``torch.randn`` on the device in the target dtype, one call per
fused matrix, no per-parameter init): q/k/v of a layer are row blocks of one buffer, gate/up likewise, so the
fast engine's fused matrices are views and HF's separate projections are views too (no copy anywhere).

Values: layer matrices N(0, 0.002^2), embeddings N(0, 1), the LM head a row permutation of the embedding.
Greedy decoding is then a fixed walk (token t -> the token whose head row is t's embedding) whose top-1
logit stands far above the rest, so no engine's rounding can flip an id: the replay draft's synthetic
acceptance stays exact and HF's ids can be compared with ours. No cost depends on the values.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.spec import DFlashSpec, LayerShape, ModelSpec

from ..formats.dflash import default_target_layer_ids


@dataclass(frozen=True)
class BenchShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_layers: int          # the DFlash drafter's depth at this shape (z-lab's drafters)
    block: int                 # its block size B
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    about: str = ""

    def layer_shape(self) -> LayerShape:
        return LayerShape(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.rms_eps,
                          self.rope_theta)

    def facts(self) -> dict[str, Any]:
        return asdict(self)


SHAPES = {
    "qwen3-8b": BenchShape("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 5, 16,
                           about="Qwen3-8B (untied head) + z-lab's DFlash drafter for it (5 layers, B=16)"),
    "qwen3-4b": BenchShape("qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, 5, 16,
                           about="Qwen3-4B shape (head untied here) + a 5-layer DFlash drafter, B=16"),
    "tiny": BenchShape("tiny", 64, 2, 4, 2, 16, 128, 512, 1, 4, rope_theta=10000.0,
                       about="a CPU-sized shape for tests"),
}


def _layer(t: dict, prefix: str, s: BenchShape, rnd, ones) -> None:
    h, d, i = s.hidden, s.head_dim, s.intermediate
    nq, nkv = s.heads * d, s.kv_heads * d
    qkv = rnd(nq + 2 * nkv, h, 0.002)
    gu = rnd(2 * i, h, 0.002)
    a, m = prefix + "self_attn.", prefix + "mlp."
    t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"] = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
    t[a + "o_proj.weight"] = rnd(h, nq, 0.002)
    t[a + "q_norm.weight"], t[a + "k_norm.weight"] = ones(d), ones(d)
    t[m + "gate_proj.weight"], t[m + "up_proj.weight"] = gu[:i], gu[i:]
    t[m + "down_proj.weight"] = rnd(h, i, 0.002)
    t[prefix + "input_layernorm.weight"], t[prefix + "post_attention_layernorm.weight"] = ones(h), ones(h)


def random_pair(s: BenchShape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> tuple[ModelSpec, DFlashSpec]:
    """A target ModelSpec and a DFlashSpec of shape ``s`` whose tensors live on ``device`` in ``dtype``."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, device=device, dtype=dtype).mul_(std)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(s.vocab, s.hidden, 1.0),
                                  "model.norm.weight": ones(s.hidden)}
    perm = torch.randperm(s.vocab, generator=gen, device=device)
    t["lm_head.weight"] = t["model.embed_tokens.weight"][perm]
    for i in range(s.layers):
        _layer(t, f"model.layers.{i}.", s, rnd, ones)
    target = ModelSpec("qwen3", Path(f"random:{s.name}"), "random", s.layer_shape(), s.layers, s.vocab, False,
                       1 << 20, t)
    return target, random_dflash(s, default_target_layer_ids(s.draft_layers, s.layers), rnd, ones)


def random_dflash(s: BenchShape, ids: tuple[int, ...], rnd, ones, source: str | None = None) -> DFlashSpec:
    """A DFlash drafter at ``s``: s.draft_layers layers of s's layer shape, block s.block, fc over the target
    layers ``ids``; ``rnd(rows, cols, std)`` / ``ones(n)`` make its tensors (the caller's generator, so the draws
    continue its own)."""
    d: dict[str, torch.Tensor] = {"fc.weight": rnd(s.hidden, len(ids) * s.hidden, 0.002),
                                  "hidden_norm.weight": ones(s.hidden), "norm.weight": ones(s.hidden)}
    for i in range(s.draft_layers):
        _layer(d, f"layers.{i}.", s, rnd, ones)
    return DFlashSpec("dflash", Path(source or f"random:{s.name}-dflash"), s.layer_shape(), s.draft_layers, s.block,
                      s.vocab - 1, tuple(ids), s.vocab, d)


def read_per_step(spec) -> int:
    """Bytes a dense plain step reads: every weight but the embedding table (one row of it), which a tied head
    reads whole."""
    emb = spec.tensors["model.embed_tokens.weight"]
    return weight_bytes(spec.tensors) - (0 if spec.tie_word_embeddings else emb.numel() * emb.element_size())


def weight_bytes(tensors) -> int:
    """Bytes of distinct storage (views of one buffer counted once)."""
    seen, total = set(), 0
    for t in tensors.values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def hf_model(spec: ModelSpec, device: torch.device, attn: str = "eager") -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM holding ``spec``'s own tensors (built on the meta device, then the tensors
    assigned: no second copy of the weights)."""
    import transformers as tf

    ls = spec.layer
    config = tf.Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=ls.hidden_size, intermediate_size=ls.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=ls.num_heads, num_key_value_heads=ls.num_kv_heads,
        head_dim=ls.head_dim, rms_norm_eps=ls.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": ls.rope_theta},
        max_position_embeddings=32768, tie_word_embeddings=spec.tie_word_embeddings, attention_bias=False,
        use_sliding_window=False, hidden_act="silu")
    config._attn_implementation = attn
    return assigned_hf(tf.Qwen3ForCausalLM, config, dict(spec.tensors), spec.tie_word_embeddings, device)


def assigned_hf(cls, config, state: dict[str, torch.Tensor], tied: bool, device: torch.device) -> torch.nn.Module:
    """transformers' ``cls(config)`` built on the meta device with ``state`` assigned strictly (the tensors
    themselves: no second copy of the weights), its rotary table rebuilt on ``device``, greedy generation
    without an end token. Raises if a buffer is left on the meta device."""
    with torch.device("meta"):
        model = cls(config)
    if tied:
        state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    model.load_state_dict(state, strict=True, assign=True)
    rotary = type(model.model.rotary_emb)
    with torch.device(device):
        model.model.rotary_emb = rotary(config=config)
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"HF model buffer {name} left on the meta device")
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model.eval()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def hf_decode(spec, dev, prompt: list[int], tokens: int, ours: torch.Tensor | None = None,
              build=None) -> dict[str, Any]:
    """HF eager ``generate``: decode rate from the difference of a 1-token and a (1+tokens)-token call; with
    ``ours`` (our prefill logits [P, V]) also the worst relative difference from HF's prefill logits.
    ``build(spec, dev)`` makes the model (default: Qwen3ForCausalLM, eager)."""
    model = build(spec, dev) if build is not None else hf_model(spec, dev, "eager")
    ids = torch.tensor([prompt], device=dev)
    rel = None
    if ours is not None:
        with torch.no_grad():
            theirs = model(ids).logits[0].float()
        rel = float((ours.float() - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30))

    def gen(k):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False)
        _sync(dev)
        return out[0, len(prompt):].tolist(), time.perf_counter() - t0

    gen(2)
    _, t1 = gen(1)
    out, tk = gen(1 + tokens)
    import transformers

    return {"tok_s": tokens / max(tk - t1, 1e-9), "tokens": tokens, "ids": out, "attn": "eager",
            "transformers": transformers.__version__, "prefill_logits_rel": rel}
