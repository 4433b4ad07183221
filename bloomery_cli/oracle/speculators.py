"""Tier-3 oracle for block drafts (CONTRACT.md): the speculators package's own model definitions.

speculators (the vLLM project's drafter library, written against 0.9.0) defines ``DFlashDraftModel``,
``DFlash2DraftModel`` and ``DSparkDraftModel`` in torch. This module builds one from our draft spec,
never from a hub name and never through ``from_pretrained``: the config numbers come from the spec, the
state dict is the spec's tensors under their own names (z-lab's / DeepSpec's names are speculators'
names: ``fc``, ``hidden_norm``, ``norm``, ``layers.{i}.*``, ``*.attention_conv.*``, ``candidate_selector.*``,
``markov_head.*``, ``confidence_head.*``) plus the four tensors speculators' loader fills from the verifier
(``embed_tokens`` and ``lm_head``: the target's, unless a DSpark file carries its own copies;
``verifier_lm_head`` / ``verifier_norm``: the target's head and final-norm gain, which feed only
speculators' training targets, discarded here). Any key either side lacks is an ``InputError`` naming it.

Feeding one block. speculators' models are training forwards over a packed sequence with sampled anchors.
One block after context rows 0..s-1 is the packed sequence of T = s + B + 1 rows:

    hidden_states [1, T, n*H]: rows p < s = concat_k hf_hidden[k][p], k over aux_hidden_state_layer_ids;
                               rows >= s zero (their anchor mask lets a block see base rows < anchor only)
    input_ids     [1, T]:      input_ids[s] = the anchor x_s; rows s+1..s+B-1 = the block's later tokens
                               (DSpark's Markov inputs; DFlash and DFlash2 never read them), mask id else
    loss_mask     [1, T]:      1 at s only, so ``select_anchors`` (which never picks the last B rows,
                               hence the + 1) picks exactly s; one document; max_anchors = 1

Block rows sit at positions s..s+B-1, the context at 0..s-1. Layer ids: speculators'
``aux_hidden_state_layer_ids`` index HF ``hidden_states`` directly, where z-lab (and our specs) read
``hidden_states[l + 1]`` for target layer id l; speculators' own ``DFlashConverter`` maps l -> l + 1, and so
does ``aux_layer_ids``. (An id l = L-1 maps to L, HF's post-final-norm rows, which is what our reference reads;
the converter drops that id instead, because speculators' datagen always appends the last layer.)

Meant for tiny configs (tests, the bundled fixtures): it holds a float64 copy of the draft and the target's
embedding and head, and DSpark's serial greedy chain costs one forward per block row.

What is read back: DFlash and DFlash2 through ``_backbone_forward`` (the final-normed block rows and the
head logits; rows 1..B-1 are the B-1 drafts, ``sample_from_anchor`` False); DFlash2's selector through
``candidate_selector.score_candidates`` with predecessors P_1 = anchor, P_j = C_{j-1} and the greedy walk
of DRAFTERS.md section 3 (speculators 0.9.0 has no walk of its own); DSpark through its full ``forward``,
whose head code (Markov bias from ``input_ids``, the confidence features) runs unchanged: the logits and
confidence logits it hands its loss are captured and the loss is not computed.

Float32 islands. In a float64 model HF's ``Qwen3RMSNorm`` normalises in float32, ``Qwen3RotaryEmbedding``
builds cos/sin in float32 and eager attention's softmax runs in float32: stock, the oracle agrees with an
exact float64 computation to about 1e-7 only. With ``promote_f32=True`` (the default) the model is built
and run under ``oracle.Float32AsFloat64`` (a torch function mode, active only inside these calls), so
those islands run in float64 and the oracle is truly float64; nothing global is patched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import DFlash2Spec, DFlashSpec, DSparkSpec, ModelSpec

from .hf import Float32AsFloat64, hf_rope_parameters

WRITTEN_FOR = "0.9.0"
MARKOV_TYPES = {"vanilla": "vanilla"}    # our markov_head_type -> speculators' (logits_k += W2 W1[prev_k])


class NotModelled(Exception):
    """The spec uses a feature speculators' definition does not have; the gate prints a note instead."""


@dataclass(frozen=True)
class Block:
    """One block. logits [J, V] the draft rows (DFlash / DFlash2: rows 1..B-1; DSpark: all B rows, Markov
    bias included); hidden [J, H] their final-normed rows; ids [J] the drafts (argmax; DFlash2: the walked
    path; DSpark: the serial greedy chain); prev [J] DSpark's Markov inputs; conf_logits [J] or None."""

    logits: np.ndarray
    hidden: np.ndarray
    ids: np.ndarray
    prev: np.ndarray | None = None
    conf_logits: np.ndarray | None = None


@dataclass(frozen=True)
class Selection:
    """DFlash2's selector on speculators' numbers: cand [J, K] (torch topk of the unary logits),
    scores [J, K, K] S_j[p, c], idx [J] the walked c, ids [J] = cand[j, idx_j]."""

    cand: np.ndarray
    scores: np.ndarray
    idx: np.ndarray
    ids: np.ndarray


def missing() -> str | None:
    """Why speculators cannot be used here (None when it imports)."""
    try:
        import speculators  # noqa: F401
    except Exception as e:          # any import failure means: no oracle here, and the note says why
        return f"speculators is not importable ({type(e).__name__}: {e})"
    return None


def version() -> str:
    from importlib.metadata import version as v
    return v("speculators")


def kind(draft: DFlashSpec) -> str:
    return "dspark" if isinstance(draft, DSparkSpec) else "dflash2" if isinstance(draft, DFlash2Spec) else "dflash"


def aux_layer_ids(draft: DFlashSpec) -> list[int]:
    """speculators' aux_hidden_state_layer_ids for our target_layer_ids (HF hidden_states[l + 1])."""
    return [l + 1 for l in draft.target_layer_ids]


def layer_config(draft: DFlashSpec, target: ModelSpec) -> Any:
    """transformers' Qwen3Config of the draft stack (speculators' transformer_layer_config), eager attention."""
    import transformers

    ls = draft.layer
    cfg = transformers.Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=ls.hidden_size, intermediate_size=ls.intermediate_size,
        num_hidden_layers=draft.num_layers, num_attention_heads=ls.num_heads, num_key_value_heads=ls.num_kv_heads,
        head_dim=ls.head_dim, rms_norm_eps=ls.rms_eps, max_position_embeddings=target.max_position,
        rope_parameters=hf_rope_parameters(ls), attention_bias=False,
        hidden_act="silu", use_sliding_window=False, tie_word_embeddings=False)
    if any(w is not None for w in draft.windows):        # speculators reads these two attributes as they are
        cfg.layer_types = ["full_attention" if w is None else "sliding_attention" for w in draft.windows]
        cfg.sliding_window = next(w for w in draft.windows if w is not None)
    cfg._attn_implementation = "eager"
    return cfg


def speculator_config(draft: DFlashSpec, target: ModelSpec) -> tuple[type, Any]:
    """(model class, its config) from the spec's numbers; speculators' defaults for everything else
    (sample_from_anchor: False for DFlash / DFlash2, True for DSpark)."""
    from speculators.models import (
        DFlash2DraftModel,
        DFlash2SpeculatorConfig,
        DFlashDraftModel,
        DFlashSpeculatorConfig,
        DSparkDraftModel,
        DSparkSpeculatorConfig,
    )

    if draft.window_rule == "query" and any(w is not None for w in draft.windows):
        raise NotModelled("speculators' sliding window counts W context rows before the block start (anchor - W "
                          "<= j < anchor, block causal), not vLLM's p - W < j <= p that z-lab-layout drafts run with")
    if len({w for w in draft.windows if w is not None}) > 1:
        raise NotModelled("speculators' DFlash has one sliding_window for every sliding layer")
    common = {"transformer_layer_config": layer_config(draft, target), "draft_vocab_size": target.vocab_size,
              "block_size": draft.block_size, "aux_hidden_state_layer_ids": aux_layer_ids(draft),
              "mask_token_id": draft.mask_token_id}
    if isinstance(draft, DSparkSpec):
        if draft.markov_rank and draft.markov_head_type not in MARKOV_TYPES:
            raise NotModelled(f"markov_head_type {draft.markov_head_type!r} has no speculators counterpart")
        r = draft.markov_rank
        return DSparkDraftModel, DSparkSpeculatorConfig(
            **common, markov_rank=r, markov_head_type=MARKOV_TYPES.get(draft.markov_head_type, "vanilla"),
            enable_confidence_head=draft.confidence, confidence_head_with_markov=r > 0)
    if isinstance(draft, DFlash2Spec):
        extras = {"output_multiplier": (draft.output_multiplier, 1.0),
                  "final_logit_softcapping": (draft.final_logit_softcapping, None),
                  "input_embedding_scale": (draft.input_embedding_scale, 1.0)}
        off = [f"{k}={v!r}" for k, (v, plain) in extras.items() if v != plain]
        if off:
            raise NotModelled(f"speculators' DFlash2 has no {', '.join(off)}")
        return DFlash2DraftModel, DFlash2SpeculatorConfig(
            **common, conv_kernel_size=draft.conv_kernel_size, conv_group_size=draft.conv_group_size,
            selector_rank=draft.selector_rank, selector_top_k=draft.selector_top_k)
    return DFlashDraftModel, DFlashSpeculatorConfig(**common,
                                                    sliding_window_non_causal=draft.window_rule == "anchor-bidir")


def state_dict(draft: DFlashSpec, target: ModelSpec) -> dict[str, torch.Tensor]:
    """The spec's tensors under their names, plus what speculators' loader fills from the verifier."""
    sd = {n: t for n, t in draft.tensors.items()}
    head = target.head_weight()
    sd.setdefault("embed_tokens.weight", target.tensors["model.embed_tokens.weight"])
    sd.setdefault("lm_head.weight", head)
    sd["verifier_lm_head.weight"] = head
    sd["verifier_norm.weight"] = target.tensors.get("model.norm.weight", torch.ones(target.hidden_size))
    return {n: t.detach().to(torch.float64) for n, t in sd.items()}


class Oracle:
    """A speculators draft model (float64, CPU, eval) on a spec's weights, and the block runs."""

    def __init__(self, draft: DFlashSpec, target: ModelSpec, promote_f32: bool = True):
        self.draft, self.target, self.promote_f32 = draft, target, promote_f32
        cls, config = speculator_config(draft, target)
        with self.mode():
            model = cls(config).to(torch.float64).eval()
        bad_missing, unexpected = model.load_state_dict(state_dict(draft, target), strict=False)
        if bad_missing or unexpected:
            raise InputError(draft.source, f"speculators {cls.__name__} state dict mismatch: missing "
                                           f"{sorted(bad_missing)}, unexpected {sorted(unexpected)}")
        self.model = model

    def mode(self):
        return Float32AsFloat64() if self.promote_f32 else contextlib.nullcontext()

    def packed(self, hf_hidden: np.ndarray, s: int, anchor: int, tail: Sequence[int]) -> dict[str, torch.Tensor]:
        """The packed training inputs for one block after context rows 0..s-1 (module docstring)."""
        b, h = self.draft.block_size, self.target.hidden_size
        aux = self.model.target_layer_ids
        if not all(0 <= k < hf_hidden.shape[0] for k in aux):
            raise ValueError(f"aux layer ids {aux} outside 0..{hf_hidden.shape[0] - 1}")
        t = s + b + 1
        feats = np.concatenate([hf_hidden[k, :s] for k in aux], axis=-1)
        hidden = torch.zeros(1, t, feats.shape[1], dtype=torch.float64)
        hidden[0, :s] = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float64))
        ids = torch.full((1, t), self.draft.mask_token_id, dtype=torch.long)
        ids[0, s] = anchor
        ids[0, s + 1:s + 1 + len(tail)] = torch.tensor(list(tail), dtype=torch.long)
        loss_mask = torch.zeros(1, t)
        loss_mask[0, s] = 1
        return {"hidden_states": hidden, "input_ids": ids, "loss_mask": loss_mask,
                "verifier_last_hidden_states": torch.zeros(1, t, h, dtype=torch.float64),
                "document_ids": torch.zeros(1, t, dtype=torch.long)}

    def backbone(self, hf_hidden: np.ndarray, s: int, anchor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-normed block rows [B, H], head logits [B, V]) from ``_backbone_forward``."""
        with torch.no_grad(), self.mode():
            hidden, logits, *_ = self.model._backbone_forward(**self.packed(hf_hidden, s, anchor, ()), max_anchors=1)
        return hidden[0], logits[0]

    def dflash(self, hf_hidden: np.ndarray, s: int, anchor: int) -> Block:
        hidden, logits = self.backbone(hf_hidden, s, anchor)
        lg = logits[1:].numpy()
        return Block(logits=lg, hidden=hidden[1:].numpy(), ids=lg.argmax(-1))

    def dspark_forward(self, hf_hidden: np.ndarray, s: int, anchor: int, tail: Sequence[int]) -> Block:
        """DSpark's own forward with block tokens [anchor, *tail]: the logits and confidence logits its loss gets."""
        import speculators.models.dspark.core as core

        seen: dict[str, Any] = {}

        def capture(logits, targets, confidence_logits, *args, **kwargs):
            seen["logits"], seen["conf"] = logits, confidence_logits
            return torch.zeros(()), {}

        with torch.no_grad(), self.mode(), mock.patch.object(core, "compute_metrics", capture):
            self.model(**self.packed(hf_hidden, s, anchor, tail), max_anchors=1)
        lg = seen["logits"][0].numpy()
        conf = None if seen["conf"] is None else seen["conf"][0].numpy()
        return Block(logits=lg, hidden=np.zeros((len(lg), 0)), ids=lg.argmax(-1),
                     prev=np.asarray([anchor, *tail], dtype=np.int64), conf_logits=conf)

    def dspark(self, hf_hidden: np.ndarray, s: int, anchor: int, prev: Sequence[int] | None = None) -> Block:
        """prev None: the serial greedy chain (block token k+1 = argmax of row k, one forward per row);
        else prev = [anchor, ...] (B ids) teacher-forces the Markov inputs."""
        b = self.draft.block_size
        if prev is not None:
            if len(prev) != b or int(prev[0]) != anchor:
                raise ValueError(f"prev must list B={b} ids starting with the anchor {anchor}")
            return self.dspark_forward(hf_hidden, s, anchor, [int(x) for x in prev[1:]])
        chain: list[int] = []
        for k in range(b):
            out = self.dspark_forward(hf_hidden, s, anchor, chain)
            chain.append(int(out.logits[k].argmax()))
        return Block(logits=out.logits, hidden=out.hidden, ids=np.asarray(chain, dtype=np.int64),
                     prev=out.prev, conf_logits=out.conf_logits)

    def selector_scores(self, block: Block, anchor: int, cand: np.ndarray) -> np.ndarray:
        """S_j[p, c] [J, K, K] from ``candidate_selector.score_candidates`` on candidates cand [J, K]
        (P_1 = anchor, P_j = C_{j-1}), with speculators' unary logits and hidden rows."""
        j, k = cand.shape
        c = torch.from_numpy(np.asarray(cand, dtype=np.int64))
        pred = torch.cat([torch.full((1, k), anchor, dtype=torch.long), c[:-1]], dim=0)        # [J, K]
        unary = torch.from_numpy(block.logits)[:, None, :].expand(j, k, -1)                   # [J, K, V]
        hidden = torch.from_numpy(block.hidden)[:, None, :].expand(j, k, -1)                  # [J, K, H]
        with torch.no_grad(), self.mode():
            s = self.model.candidate_selector.score_candidates(unary, hidden, pred, c[:, None, :].expand(j, k, k))
        return s.numpy()

    def dflash2(self, hf_hidden: np.ndarray, s: int, anchor: int) -> tuple[Block, Selection]:
        """The unary block and the walk: prev = 0; idx_j = argmax_c S_j[prev, c] (first max); prev = idx_j."""
        block = self.dflash(hf_hidden, s, anchor)
        k = self.model.candidate_selector.top_k
        cand = torch.from_numpy(block.logits).topk(k, dim=-1).indices.numpy()
        scores = self.selector_scores(block, anchor, cand)
        prev, idx = 0, []
        for sj in torch.from_numpy(scores):
            prev = int(torch.argmax(sj[prev]))
            idx.append(prev)
        idx_a = np.asarray(idx, dtype=np.int64)
        ids = cand[np.arange(len(idx_a)), idx_a]
        return Block(block.logits, block.hidden, ids), Selection(cand, scores, idx_a, ids)
