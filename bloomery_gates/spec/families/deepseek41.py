"""The deepseek41 family's spec (docs/ARCHITECTURE.md, "Adding a family", place 2; docs/V41.md): a relative of
deepseek4 with its V4.1 slots named."""

from __future__ import annotations

from dataclasses import dataclass

from ...engram_hash import EngramHash
from .deepseek4 import Deepseek4DSparkSpec, Deepseek4Spec


@dataclass(frozen=True)
class V41Stream:
    """A compressed layer's stream (docs/V41.md 6, the seed's ``walk_streams``): ``ratio`` m tokens per entry, and
    the layers it reads: ``kv_source`` (the compressor that pools the entries), ``key_source`` (the index keys),
    ``topk_source`` (the indexer query whose choice it attends); each the last layer at or before it carrying that
    part, itself when it carries it."""

    ratio: int
    kv_source: int
    key_source: int
    topk_source: int


@dataclass(frozen=True)
class CandidateMask:
    """V4.1's two-level candidate mask (docs/V41.md 8; the GGUF's ``attention.candidate_{source_layer_id,
    block_size, topk_blocks}``): index source ``source_layer`` keeps, per query row, its ``topk_blocks`` best blocks
    of ``block_size`` entries by its index scores (the newest visible entry's block always), and every later index
    source at the same ratio takes its top-k only inside them (``kernels.ops.v41_stream.candidate_blocks``)."""

    source_layer: int
    block_size: int
    topk_blocks: int

    def fewest_rows(self) -> int:
        """The fewest entries a full-length mask keeps: (topk_blocks - 1) block_size + 1 (the newest block may
        hold one)."""
        return (self.topk_blocks - 1) * self.block_size + 1


@dataclass(frozen=True)
class Deepseek41Spec(Deepseek4Spec):
    """A deepseek41 target (DeepSeek V4.1; the seed engine's ``deepseek41`` GGUF, docs/V41.md): V4's layers with
    the V4.1 deltas as named slots. ``hc_mix`` "lagged" (a sublayer folds its input with the previous sublayer's
    ``pre``, the first with a one-hot; the seed's ``HcMix::Lagged``), ``collapse`` "last_mix" (the streams collapse
    before the output norm with the last FFN's ``pre``; no trained HC head, ``Collapse::LastMix``), ``q_head_norm``
    False (no unweighted per-head RMS of q before its rope). ``layer_types`` "sliding" (window only) | "stream" (the
    window and a compressed stream, ``streams[l]``, None on a sliding layer). The layer state is (streams, lag):
    taps [T, S+1, H] (``reference.ops.mhc_lagged.pack_lag``). Tensors keep deepseek4's HF names (no
    ``model.hc_head.*``); a stream layer's own parts under ``self_attn.compressor.{kv_proj, gate_proj, kv_norm}``,
    ``self_attn.indexer.{k_proj, k_norm, q_b_proj, weights_proj}``. ``candidates``: the candidate mask (None: none;
``masked(l)`` says whether layer l's choice is taken inside it). ``engram``: the engram sites' dimensions and
    hash constants (None: no site); a site's tensors under ``engram.{embed, wkv, k_norm, q_norm}.weight``."""

    hc_mix: str = "lagged"
    collapse: str = "last_mix"
    q_head_norm: bool = False
    streams: tuple[V41Stream | None, ...] = ()
    engram: EngramHash | None = None
    candidates: CandidateMask | None = None

    def stream(self, layer: int) -> V41Stream | None:
        return self.streams[layer] if self.streams else None

    def masked(self, layer: int) -> bool:
        """Layer ``layer`` is an index source after the candidate source, at its ratio: its scores outside the
        source's mask are -inf before its top-k (an index source at another ratio has other entries: left as is)."""
        c, s = self.candidates, self.stream(layer)
        if c is None or s is None or s.topk_source != layer or layer <= c.source_layer:
            return False
        src = self.stream(c.source_layer)
        return src is not None and src.ratio == s.ratio


@dataclass(frozen=True)
class Deepseek41DSparkSpec(Deepseek4DSparkSpec):
    """The seed engine's V4.1 DSpark draft (docs/FAMILIES_MOE.md 5.2; ``spec.rs`` ``draft_of``), read by
    ``bloomery_cli.families.deepseek41.reader_dspark``: the DSV4 DSpark's stages and heads with the V4.1 deltas,
    ``hc_mix`` "lagged" (each stage's sublayers fold by the previous sublayer's ``pre``, the first by a one-hot;
    the stage state travels packed [R, S+1, H] as the trunk's taps), ``collapse`` "last_mix" (no ``hc_head.*``),
    ``q_head_norm`` False. The file has no ``token_embd`` / ``output``: the target's are used. The features are
    the hc-stream mean of the first S rows of the target's taps (the lag row dropped)."""

    hc_mix: str = "lagged"
    q_head_norm: bool = False
