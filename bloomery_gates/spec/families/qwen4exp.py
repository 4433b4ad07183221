"""The qwen4exp family's specs (docs/ARCHITECTURE.md, "Adding a family", place 2)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import MTPSpec
from ..shapes import HCShape, MoEShape
from .qwen35moe import Qwen35MoeSpec


@dataclass(frozen=True)
class PLEShape:
    """qwen4exp's hashed n-gram embeddings (PLE) on ``layers`` (0-based, linear layers only): for n in 2..ngram_size
    ``heads_per_ngram`` hashed heads, each a table of ``embed_dim / heads`` columns, a dilated depthwise conv of
    ``conv_kernel`` taps and a per-stream sigmoid gate. HF gives the hashing's inputs (``vocab_base``,
    ``divisible_by``, ``seed``, ``split_parts``); a GGUF gives its outputs (``multipliers`` [ngram_size],
    ``head_vocab_sizes`` and ``head_offsets`` [(ngram_size - 1) heads_per_ngram], llama.cpp's ``ple.*`` keys); the
    other side's fields are 0 / ()."""

    layers: tuple[int, ...]
    embed_dim: int
    conv_kernel: int
    ngram_size: int
    heads_per_ngram: int
    vocab_base: int = 0
    divisible_by: int = 0
    seed: int = 0
    split_parts: int = 0
    head_vocab_sizes: tuple[int, ...] = ()
    eos_token_id: int = -1         # the id that ends an n-gram segment and fills a sequence's start (-1: unknown)
    multipliers: tuple[int, ...] = ()
    head_offsets: tuple[int, ...] = ()

    @property
    def hashing_known(self) -> bool:
        """Whether the hashing tables follow: stored (a GGUF) or derivable (HF's base), and the eos id known."""
        return self.eos_token_id >= 0 and (self.vocab_base > 0 or bool(self.multipliers and self.head_vocab_sizes
                                                                         and self.head_offsets))


@dataclass(frozen=True)
class QSAShape:
    """qwen4exp's QSA block mask on its indexed-attention layers: ``num_heads`` indexer heads of ``head_dim`` over
    one kv head; each query keeps ``budget / compress_ratio`` blocks of ``compress_ratio`` mean-pooled keys, plus the
    incomplete tail."""

    num_heads: int
    kv_heads: int
    head_dim: int
    budget: int
    compress_ratio: int


@dataclass(frozen=True)
class Qwen4ExpSpec(Qwen35MoeSpec):
    """A qwen4exp target (Qwen3.8-Flash-Next): the qwen35moe hybrid (GDN + gated attention, R1 softmax MoE) with no
    block norms, every sublayer wrapped in gated low-rank hyper-connections ``hc``, QSA on the indexed layers
    (``hybrid.layer_types`` says "full_attention" for them) and PLE on one linear layer."""

    hc: HCShape
    qsa: QSAShape
    ple: PLEShape | None
    output_gate: str = ""          # the GDN output gate's activation, "sigmoid" | "silu" ("": the file does not say)


@dataclass(frozen=True)
class Qwen4ExpMTPSpec(MTPSpec):
    """qwen4exp's MTP head from its separate GGUF (FAMILIES_MOE.md 6): one nextn block ``block`` (= the target's layer
    count) fed the 4 raw streams: per stream s ``[rms(e) enorm | rms(h_s) hnorm_s]`` (hnorm [count*H]), eh_proj
    [H, 2H], an HC dense gated-GQA attention and an HC MoE, then ``nextn.hc_head``. ``borrows``: the file carries
    neither token_embd nor output and takes the target's (``nextn_shared_target_tensors``). Tensors keep GGUF names."""

    block: int
    hc: HCShape
    moe: MoEShape
    borrows: bool
