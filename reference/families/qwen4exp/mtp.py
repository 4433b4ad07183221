"""The MTP head of a qwen4exp (Qwen3.8-Flash-Next) target, float64 host reference (docs/FAMILIES_MOE.md section 6
"Math"; no cache: every call runs all of its rows). The device draft is ``kernels.families.qwen4exp.mtp``.

A row j reads the token at position j and the target's 4 RAW hyper-connection streams of position j-1 (the last
layer's output x_{j-1} [S*H], before the hyper-connection mixer collapses them: neither their mean nor the mixer's
normed streams), and predicts the token at j+1. S = hc.count streams, n(x, w) = zero-centred RMSNorm
(``reference.ops.gated_hc.grouped_norm``: per group of H columns, gain 1 + w):

    e       = n(E(tok_j), pre_fc_norm_embedding)                                            [H]     (enorm)
    hn      = n_grouped(x_{j-1}, pre_fc_norm_hidden)         per stream s its own H gains   [S*H]   (hnorm [S*H])
    u_s     = [e ; hn_s] [fc_embedding | fc_hidden]^T        eh_proj [H, 2H] on each stream  [H] x S, EMBEDDING FIRST
    u       = [u_0 | ... | u_{S-1}]                                                           [S*H]
    (b, g)  = gated_residual(u, mtp.layers.0.attn_hyper_connection)                           b [H], g [S]
    u       = u + g (x) attn(b)     the trunk's dense gated GQA attention (q/gate interleaved per head, zero-centred
                                    q/k norms, partial rope at position j), causal over the head's own rows; no QSA
    (b, g)  = gated_residual(u, mtp.layers.0.mlp_hyper_connection)
    y       = u + g (x) moe(b)      the trunk's R1 MoE (softmax top-k renormalised, sigmoid-gated shared expert)
    f       = gated_residual(y, mtp.hyper_connection_mixer, no inject).block_in               [H]     (nextn.hc_head)
    logits  = f head^T              the target's head (the HF layout borrows embed_tokens / lm_head)

(g (x) v)[s*H + c] = g[s] v[c]. Chained drafts: the row after the last real one reads (d_i, y of the row before):
the head's own output streams, raw, in the target's place. HF layout (``mtp.*`` in the target's safetensors;
GGUF names in brackets): pre_fc_norm_embedding [enorm] [H], pre_fc_norm_hidden [hnorm] [S*H], fc_embedding |
fc_hidden [eh_proj] [H, H] each, layers.0.{attn,mlp}_hyper_connection.{hc_norm, input_mix_weight_down,
input_mix_weight_up, block_inject_weight} [hc_{attn,ffn}_*], layers.0.self_attn.{q,k,v,o}_proj, q_norm, k_norm,
layers.0.mlp.* (the trunk's MoE names), hyper_connection_mixer.{hc_norm, input_mix_weight_down, input_mix_weight_up}
[hc_head_{norm, down, up}].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bloomery_gates.spec import Qwen4ExpMTPSpec, Qwen4ExpSpec

from ...ops import gated_hc as hc
from ...ops.attention import causal_mask
from ...ops.moe import at_layer
from ...rounding import linear
from ...weights import as_f64
from ...xp import here, ns
from ..ffn import ffn_for
from ..qwen3.model import embed_rows, head
from ..qwen38.model import gated_attention, project_kv
from .model import residual

P, L0 = "mtp.", "mtp.layers.0."
MIXER = P + "hyper_connection_mixer."


@dataclass(frozen=True)
class MTPRefOut:
    """Per row: layer_out [R, S*H] (the head's output streams, before the mixer: what a chained row reads),
    f [R, H] (the mixer's collapse, the head's input), logits [R, V], ids [R] = argmax (lowest index on ties)."""

    layer_out: np.ndarray
    f: np.ndarray
    logits: np.ndarray
    ids: np.ndarray


def mtp_input(mtp: Qwen4ExpMTPSpec, emb: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """u = per stream s eh_proj([n(emb, enorm) ; n(streams_s, hnorm_s)]): emb [R, H], streams [R, S*H] -> [R, S*H]."""
    w, eps, h, s = as_f64(mtp), mtp.layer.rms_eps, mtp.layer.hidden_size, mtp.hc.count
    e = hc.grouped_norm(emb, w[P + "pre_fc_norm_embedding.weight"], h, eps)
    hn = hc.grouped_norm(here(streams), w[P + "pre_fc_norm_hidden.weight"], h, eps)
    xp, r = ns(e), len(e)
    x = xp.concatenate([xp.broadcast_to(e[:, None, :], (r, s, h)), hn.reshape(r, s, h)], axis=-1)
    eh = xp.concatenate([w[P + "fc_embedding.weight"], w[P + "fc_hidden.weight"]], axis=1)      # [H, 2H]
    return linear(x.reshape(r * s, 2 * h), eh).reshape(r, s * h)


def block(mtp: Qwen4ExpMTPSpec, target: Qwen4ExpSpec, u: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The head's block over rows u [R, S*H] at ``positions``, causal among the rows -> output streams [R, S*H]."""
    w, eps, s = as_f64(mtp), mtp.layer.rms_eps, mtp.hc.count
    a = residual(w, L0 + "attn_hyper_connection.", u, s, eps)
    y = gated_attention(target, w, L0 + "self_attn.", a.block_in, positions, causal_mask(len(u), ns(u)))
    u = hc.hc_inject(u, y, a.inject)
    m = residual(w, L0 + "mlp_hyper_connection.", u, s, eps)
    return hc.hc_inject(u, ffn_for(target)(target, w, L0, m.block_in), m.inject)


def collapse(mtp: Qwen4ExpMTPSpec, y: np.ndarray) -> np.ndarray:
    """nextn.hc_head: the head's mixer collapse of streams y [R, S*H] -> [R, H] (no inject, no final norm)."""
    return residual(as_f64(mtp), MIXER, y, mtp.hc.count, mtp.layer.rms_eps, inject=False).block_in


def rows(mtp: Qwen4ExpMTPSpec, target: Qwen4ExpSpec, emb: np.ndarray, streams: np.ndarray,
         positions: np.ndarray) -> MTPRefOut:
    """Head rows (emb_j = E(tok_j), streams_j = x_{j-1}) at ``positions``, causal among themselves."""
    y = block(mtp, target, mtp_input(mtp, emb, streams), positions)
    f = collapse(mtp, y)
    logits = head(target, f)
    return MTPRefOut(layer_out=y, f=f, logits=logits, ids=ns(logits).argmax(logits, axis=-1))


def teacher_forced(mtp: Qwen4ExpMTPSpec, target: Qwen4ExpSpec, ids: Sequence[int], streams: np.ndarray) -> MTPRefOut:
    """Every row j = 1..T-1 of a sequence: reads (ids[j], streams[j-1]); row j-1 of the result predicts ids[j+1].
    streams [T, S*H]: the target's last-layer streams over ``ids``."""
    emb = embed_rows(target, ids[1:])
    return rows(mtp, target, emb, here(streams)[:-1], ns(emb).arange(1, len(ids)))


def draft(mtp: Qwen4ExpMTPSpec, target: Qwen4ExpSpec, ids: Sequence[int], streams: np.ndarray, anchor: int,
          width: int, chain_ids: Sequence[int] | None = None) -> MTPRefOut:
    """``width`` chained drafts after a context of T = len(ids) positions: streams [T, S*H] the target's last-layer
    streams over ``ids``, anchor the id at position T. Row T reads (anchor, streams[T-1]); chained row T+i reads
    (d_i, layer_out of row T+i-1); d_i is the previous row's argmax or ``chain_ids[i-1]`` (to follow another
    engine's drafts). Returns the ``width`` drafted rows only."""
    t = len(ids)
    toks = list(ids[1:]) + [int(anchor)]
    streams = here(streams)
    xp, hid = ns(streams), list(streams[:t])
    for i in range(width):
        with at_layer(i):                  # chained row i's router is choice (ROUTER, i) in a layered pin
            out = rows(mtp, target, embed_rows(target, toks), xp.stack(hid), xp.arange(1, t + 1 + i))
        if i + 1 < width:
            toks.append(int(out.ids[-1]) if chain_ids is None else int(chain_ids[i]))
            hid.append(out.layer_out[-1])
    k = slice(t - 1, t - 1 + width)
    return MTPRefOut(layer_out=out.layer_out[k], f=out.f[k], logits=out.logits[k], ids=out.ids[k])


def store_rows(mtp: Qwen4ExpMTPSpec, target: Qwen4ExpSpec, ids: Sequence[int],
               streams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The head's K/V of the real rows j = 1..T-1 (row j reads ids[j] and streams[j-1]; RoPE position j), as the
    draft's store keeps them at slots 1..T-1: (k, v), each [T-1, nkv, d]. streams [T, S*H] (row T-1 not read)."""
    w = as_f64(mtp)
    u = mtp_input(mtp, embed_rows(target, ids[1:]), here(streams)[:-1])
    a = residual(w, L0 + "attn_hyper_connection.", u, mtp.hc.count, mtp.layer.rms_eps)
    return project_kv(target, w, L0 + "self_attn.", a.block_in, ns(u).arange(1, len(ids)))
