"""DSpark block drafter, float64 host reference (DRAFTERS.md section 4). No cache: one call = one block.

The backbone is DFlash's (reference.drafts.dflash): context features u [s, H] from the target's taps,
block rows y = [x_s, m, ..., m] (B rows) at positions s..s+B-1, bidirectional attention over
[u ; block]. What differs is the read-out, ANCHOR-FIRST (the opposite of DFlash's infill rows):

    h_k   = rms(layer_out[-1][k], norm)                        k = 0..B-1             [B, H]
    base  = h head^T                                            head: the drafter's lm_head copy if
                                                                it has one, else the target's   [B, V]
    prev_0 = x_s (the anchor);  prev_k = d_{k-1} for k >= 1     serial over the rows
    e_k   = W1[prev_k]                                          markov_w1 [V, r] row            [r]
    logits_k = base_k + W2 e_k                                  markov_w2 [V, r]                [V]
                (stored as the engine stores them: st(base_k + st(W2 e_k)), ``markov_logits``)
    d_k   = argmax logits_k (lowest index on ties)              row k predicts the token at s+k+1
    z_k   = proj . [h_k ; e_k] + bias,  c_k = sigmoid(z_k)      confidence head (when enabled)

B rows give B drafts. The embedding E() of the block rows is the drafter's embed_tokens copy when
it has one, else the target's. With r = 0 (or W2 = 0) the drafts are the per-row argmax of base.

Cut rule (``cut_length``): with a threshold t > 0 the proposal keeps the drafts before the first k
with c_k < t, but always at least one (a 2-row verify costs about what a 1-row step costs); t <= 0
or no confidence head keeps all B.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import DSparkSpec, ModelSpec

from ..families.qwen3.model import RefOut, embed, head, mlp, self_attention
from ..ops.norm import rms_norm
from ..rounding import st
from ..weights import as_f64
from ..xp import active, ns, to_host
from .dflash import context_features


@dataclass(frozen=True)
class DSparkRefOut:
    """One block. logits [B, V] (Markov term included; row k predicts the token at s+k+1); base [B, V]
    the head's logits alone; layer_out [n_layers, B, H] (each draft layer's output, before the final
    norm); ids [B] the drafts; prev [B] the previous id each row's Markov term read; confidence [B]
    (ones without a confidence head) and conf_logits [B] (None without one); u [s, H]; final [B, H]."""

    logits: np.ndarray
    base: np.ndarray
    layer_out: np.ndarray
    ids: np.ndarray
    prev: np.ndarray
    confidence: np.ndarray
    conf_logits: np.ndarray | None
    u: np.ndarray
    final: np.ndarray


def draft_embed(draft: DSparkSpec, target: ModelSpec, ids: Sequence[int]) -> np.ndarray:
    """E(ids) [T, H]: the drafter's embed_tokens copy when present, else the target's embedding."""
    if "embed_tokens.weight" in draft.tensors:
        return as_f64(draft).rows("embed_tokens.weight", ids)
    return embed(target, ids)


def draft_head(draft: DSparkSpec, target: ModelSpec, x: np.ndarray) -> np.ndarray:
    """The LM head on rows x [J, H] -> [J, V]: the drafter's lm_head copy when present, else the target's head."""
    if "lm_head.weight" in draft.tensors:
        return as_f64(draft).project("lm_head.weight", x)
    return head(target, x)


def backbone(draft: DSparkSpec, target: ModelSpec, u: np.ndarray, anchor_id: int) -> np.ndarray:
    """DFlash's block layers over rows [x_s, m x (B-1)] at positions s..s+B-1 (s = len(u)), no mask.

    Returns layer_out [n_layers, B, H]."""
    shape, w, b, s = draft.layer, as_f64(draft), draft.block_size, len(u)
    h = draft_embed(draft, target, [anchor_id] + [draft.mask_token_id] * (b - 1))
    xp = ns(h)
    pos_q, pos_kv, no_mask = xp.arange(s, s + b), xp.arange(s + b), xp.ones((b, s + b), dtype=bool)
    out = []
    for i in range(draft.num_layers):
        p = f"layers.{i}."
        a = rms_norm(h, w[p + "input_layernorm.weight"], shape.rms_eps)
        h = st(h + self_attention(shape, w, p + "self_attn.", a, xp.concatenate([u, a], axis=0), pos_q, pos_kv,
                                  no_mask))
        h = st(h + mlp(w, p + "mlp.", rms_norm(h, w[p + "post_attention_layernorm.weight"], shape.rms_eps)))
        out.append(h)
    return xp.stack(out)


def markov_rows(draft: DSparkSpec, prev: Sequence[int]) -> np.ndarray:
    """e_k = W1[prev_k] for each row: [len(prev), r] (r = 0: an empty [n, 0])."""
    if draft.markov_rank == 0:
        return active().xp.zeros((len(prev), 0))
    return as_f64(draft).rows("markov_head.markov_w1.weight", prev)


def markov_term(draft: DSparkSpec, e: np.ndarray) -> np.ndarray:
    """st(W2 e_k) for rows e [n, r] -> [n, V] (zeros when r = 0): a stored projection, as the engine's F.linear."""
    if draft.markov_rank == 0:
        return ns(e).zeros((len(e), draft.vocab_size))
    return as_f64(draft).project("markov_head.markov_w2.weight", e)


def markov_logits(base: np.ndarray, term: np.ndarray) -> np.ndarray:
    """logits = st(base + st(W2 e)): the engine stores the Markov term and then the sum, each in its dtype."""
    return st(base + term)


def markov_decode(draft: DSparkSpec, base: np.ndarray, anchor_id: int, prev: Sequence[int] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Markov correction over the B rows of base [B, V] (``kernels.drafts.dspark.markov_decode``'s):
    prev None runs the serial greedy chain prev_0 = anchor, prev_{k+1} = argmax logits_k; a list of B ids
    teacher-forces it. Returns (logits [B, V] = st(base + st(W2 W1[prev])), prev [B] int64, e = W1[prev] [B, r])."""
    if prev is None:
        xp, chain = ns(base), [anchor_id]
        for k in range(len(base) - 1):
            row = markov_logits(base[k], markov_term(draft, markov_rows(draft, chain[k:k + 1]))[0])
            chain.append(int(xp.argmax(row)))
        prev = chain
    prev = np.asarray(to_host(prev), dtype=np.int64)
    e = markov_rows(draft, prev)
    return markov_logits(base, markov_term(draft, e)), prev, e


def cut_length(confidence: np.ndarray, threshold: float) -> int:
    """Drafts kept: before the first k with c_k < t, at least 1; all of them when t <= 0."""
    b = len(confidence)
    if threshold <= 0:
        return b
    low = np.nonzero(np.asarray(to_host(confidence)) < threshold)[0]
    return b if len(low) == 0 else max(1, int(low[0]))


def block_context(draft: DSparkSpec, taps, anchor_id: int, s: int | None, prev: Sequence[int] | None) -> int:
    """The context length s of a block (default: all T rows of ``taps.hidden`` [.., T, ..]), 1 <= s <= T, and
    ``prev`` (when given) B ids starting with the anchor; a ValueError naming the bad one otherwise."""
    t = taps.hidden.shape[1]
    s = t if s is None else s
    if not 1 <= s <= t:
        raise ValueError(f"context length s={s} must be in 1..{t} (rows in taps)")
    b = draft.block_size
    if prev is not None and (len(prev) != b or int(prev[0]) != anchor_id):
        raise ValueError(f"prev must list B={b} ids starting with the anchor {anchor_id}")
    return s


def forward(draft: DSparkSpec, target: ModelSpec, taps: RefOut, anchor_id: int, s: int | None = None,
            prev: Sequence[int] | None = None) -> DSparkRefOut:
    """Draft one block after context positions 0..s-1 (s defaults to all rows of ``taps``).

    taps: the target reference's ``forward`` over at least s ids; anchor_id: x_s (at position s).
    prev: None runs the serial greedy chain (prev_0 = anchor, prev_k = d_{k-1}); a list of B ids
    teacher-forces the Markov inputs instead (the gate passes [anchor, kernel drafts[:-1]] so that a
    kernel's logits compare row by row even past an excused greedy flip).
    """
    s = block_context(draft, taps, anchor_id, s, prev)
    b, w = draft.block_size, as_f64(draft)
    u = context_features(draft, taps, s)
    xp = ns(u)
    layer_out = backbone(draft, target, u, anchor_id)
    final = rms_norm(layer_out[-1], w["norm.weight"], draft.layer.rms_eps)
    base = draft_head(draft, target, final)
    logits, prev, e = markov_decode(draft, base, anchor_id, prev)
    conf_logits, confidence = None, xp.ones(b)
    if draft.confidence:
        z = xp.concatenate([final, e], axis=-1) @ w["confidence_head.proj.weight"][0]
        conf_logits = st(z + w["confidence_head.proj.bias"][0])       # one stored linear with its bias
        confidence = 1.0 / (1.0 + xp.exp(-conf_logits))
    return DSparkRefOut(logits=logits, base=base, layer_out=layer_out, ids=xp.argmax(logits, axis=-1), prev=prev,
                        confidence=confidence, conf_logits=conf_logits, u=u, final=final)
