"""The 3-layer MTP head of a mimo2 (MiMo-V2-Flash) target, float64 host reference (no cache).

Layer k (0-based) is the k-th step of a chain; its row at position q reads the token at q and a hidden row of
position q-1, and predicts the token at q+1:

    u   = eh_proj( [ rms(E(s_q), enorm) ; rms(x_{k,q-1}, hnorm) ] )              EMBEDDING FIRST
    y   = u + swa_attn(rms(u, input_layernorm));  y = y + swiglu(rms(y, pre_mlp_layernorm))
          (the trunk's SWA attention shape: sinks, window W, SWA rope theta, partial rotary, value scale; causal
           over layer k's own rows)
    g   = rms(y, final_layernorm);   logits = g head^T                          the TARGET's head
    x_{0, .}   = the target's hidden row:  post: its post-final-norm row (HF MtpModel's hidden_states[-1], vLLM)
                                           pre:  its last layer's output before model.norm (llama.cpp's h_nextn)
    x_{k+1, q} = post: g_{k,q} (HF post_norm, vLLM final_layernorm out);  pre: y_{k,q} (llama.cpp recycles the
                 pre-norm output)

Layer k's rows start at position k+1 (the first whose input exists). A window after a context of T tokens with
anchor a at position T: s = ids + [a]; layer 0 runs positions 1..T and drafts d_1 from its row T; then s += [d_1],
layer 1 runs positions 2..T+1 and drafts d_2 from its row T+1; and so on: layer k drafts d_{k+1} from row T+k, its
rows past T reading the drafts (s at T+1.. = d_1..). This is HF ``MtpModel.forward``'s loop (ids and positions
rolled by one per layer, the previous layer's output as the hidden) run over the whole sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import Mimo2MTPSpec, Mimo2Spec

from ...ops.norm import rms_norm
from ...rounding import linear, st
from ...weights import as_f64
from ...xp import here, ns
from ..qwen3.model import embed_rows, head, mlp
from . import model as trunk

P = "model.mtp.layers."
HIDDEN = ("post", "pre")


@dataclass(frozen=True)
class ChainOut:
    """Per layer k: positions [R_k], y (pre-norm out) [R_k, H], g (post-norm) [R_k, H], logits [R_k, V]."""

    positions: list[np.ndarray]
    y: list[np.ndarray]
    g: list[np.ndarray]
    logits: list[np.ndarray]


def mtp_layer(mtp: Mimo2MTPSpec, k: int, emb: np.ndarray, hid: np.ndarray, positions: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Layer k on rows (emb [R, H], hid [R, H]) at ``positions`` (causal + window among them) -> (y, g)."""
    w, eps, p = as_f64(mtp), mtp.rms_eps, f"{P}{k}."
    e = rms_norm(emb, w[p + "enorm.weight"], eps)
    x = ns(e).concatenate([e, rms_norm(hid, w[p + "hnorm.weight"], eps)], -1)
    u = linear(x, w[p + "eh_proj.weight"])
    a = rms_norm(u, w[p + "input_layernorm.weight"], eps)
    y = st(u + trunk.attention(mtp.attn, w, p + "self_attn.", a, positions, mtp.value_scale))
    y = st(y + mlp(w, p + "mlp.", rms_norm(y, w[p + "pre_mlp_layernorm.weight"], eps)))
    return y, rms_norm(y, w[p + "final_layernorm.weight"], eps)


def chain(mtp: Mimo2MTPSpec, target: Mimo2Spec, seq: Sequence[int], hidden: np.ndarray, hidden_mode: str,
          steps: int | None = None) -> ChainOut:
    """Every layer over a sequence ``seq`` (tokens at positions 0..n-1) and the target's hidden rows (post or pre
    per ``hidden_mode``) at positions 0..len(hidden)-1. Layer k runs the positions its inputs reach: layer 0
    q = 1..min(n-1, len(hidden)), layer k+1 one position past layer k (capped at n-1), each reading s_q and
    x_{k, q-1}. A whole teacher-forced sequence (len(hidden) = n) gives layer k positions k+1..n-1; a draft
    window (hidden up to T-1, seq = ids + [anchor, d_1, ...]) gives layer k positions k+1..T+k."""
    if hidden_mode not in HIDDEN:
        raise ValueError(f"MTP hidden {hidden_mode!r}: expected one of {HIDDEN}")
    n = len(seq)
    x = here(hidden)
    xp = ns(x)
    out = ChainOut([], [], [], [])
    for k in range(steps or mtp.num_layers):
        r = min(len(x), n - 1 - k)
        if r <= 0:
            break
        pos = xp.arange(k + 1, k + 1 + r)
        y, g = mtp_layer(mtp, k, embed_rows(target, seq[k + 1:k + 1 + r]), x[:r], pos)
        out.positions.append(pos)
        out.y.append(y)
        out.g.append(g)
        out.logits.append(head(target, g))
        x = g if hidden_mode == "post" else y            # x_{k+1, q-1}: layer k's rows
    return out


@dataclass(frozen=True)
class DraftOut:
    """The ``width`` drafted rows: y [W, H] (layer k's row T+k before final_layernorm), logits [W, V], ids [W]."""

    y: np.ndarray
    logits: np.ndarray
    ids: np.ndarray


def draft(mtp: Mimo2MTPSpec, target: Mimo2Spec, ids: Sequence[int], hidden: np.ndarray, anchor: int,
          hidden_mode: str, chain_ids: Sequence[int] | None = None) -> DraftOut:
    """One window after a context ``ids`` of T tokens: hidden [T, H] the target's rows (post or pre) at 0..T-1,
    ``anchor`` the id at position T. Layer k drafts d_{k+1} = argmax of its row T+k, or follows
    ``chain_ids[k]`` when given (so a check can track another engine's drafts)."""
    t = len(ids)
    seq = list(ids) + [int(anchor)]
    ys, logits, out_ids = [], [], []
    for k in range(mtp.num_layers):
        run = chain(mtp, target, seq, hidden, hidden_mode, steps=k + 1)
        ys.append(run.y[k][t - 1])                     # layer k's rows start at k+1: row T+k is index T-1
        logits.append(run.logits[k][t - 1])
        xp = ns(logits[-1])
        d = int(xp.argmax(logits[-1])) if chain_ids is None else int(chain_ids[k])
        out_ids.append(int(xp.argmax(logits[-1])))
        seq.append(d)
    return DraftOut(xp.stack(ys), xp.stack(logits), np.asarray(out_ids))


def store_rows(mtp: Mimo2MTPSpec, target: Mimo2Spec, seq: Sequence[int], hidden: np.ndarray, hidden_mode: str
               ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer k, the K/V its store holds for good after a window's real rows: seq = the committed tokens and
    the anchor (every one real), hidden = the target's rows at positions 0..len(seq)-2; layer k's rows at
    positions k+1..len(seq)-1, (k [R, nkv, d], v [R, nkv, dv])."""
    w, eps, out = as_f64(mtp), mtp.rms_eps, {}
    run = chain(mtp, target, seq, hidden[:len(seq) - 1], hidden_mode)
    x = here(hidden)[:len(seq) - 1]
    for k, pos in enumerate(run.positions):
        p, r = f"{P}{k}.", len(pos)
        emb = embed_rows(target, seq[k + 1:k + 1 + r])
        e = rms_norm(emb, w[p + "enorm.weight"], eps)
        u = linear(ns(e).concatenate([e, rms_norm(x[:r], w[p + "hnorm.weight"], eps)], -1), w[p + "eh_proj.weight"])
        a = rms_norm(u, w[p + "input_layernorm.weight"], eps)
        out[k] = trunk.project_kv(mtp.attn, w, p + "self_attn.", a, pos, mtp.value_scale)
        x = run.g[k] if hidden_mode == "post" else run.y[k]
    return out
