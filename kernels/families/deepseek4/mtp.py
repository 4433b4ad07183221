"""The in-file MTP block of a deepseek4 (DeepSeek V4) target on the device (torch, CPU or CUDA); the math is in
``reference.families.deepseek4.mtp`` (name for name): row q reads the target's 4 RAW streams h_q [S, H] (its last
layer's output before the trained HC head: the engine's ``taps[-1]``) and the token s_{q+1}, runs
u = eh_proj [rms(E, enorm) x S ; rms(h, hnorm)] (embedding first), the trunk's mHC block (``model.hc_block``:
sliding attention, sqrt-softplus MoE) and predicts s_{q+2} from rms(hyper_head(y; mtp.0.hc_head), mtp.0.norm)
through the target's head. Chained drafts read the block's own output streams y (recycled) and the drafted id.

State: its own window KV (``kernels.ops.v4_attention.V4Cache`` of a sliding layer: the roped K = V head [cap, d],
slot = position), written as ``kernels.drafts.chain_store.ChainStore`` says: the real rows (target streams, the
committed tokens and the anchor) for good; the chained rows at the positions after them, transient (a causal
window never reads past its query, and the next ``propose`` rewrites those positions from the target's rows: the
rollback of a rejected draft). ChainStore's slot j holds the row of token j, here at position j-1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek4MTPSpec, Deepseek4Spec

from ...drafts.chain_store import ChainStore
from ...drafts.proposal import Proposal
from ...ops import mhc as kmhc
from ...ops import v4_attention as kv4
from ...ops.norm import rms_norm
from .model import F32_SUFFIXES, Deepseek4Target, attn_weights_at, ffn_at, hc_block, route_at

T = torch.Tensor
P = "mtp.0."
DEFAULT_WIDTH = 3


def eh_input(t: Mapping[str, T], e: T, h: T, eps: float) -> T:
    """u [R, S, H] = eh_proj [rms(e, enorm) repeated S ; rms(h_s, hnorm)] of rows e [R, H], h [R, S, H]."""
    en = rms_norm(e, t["enorm.weight"], eps)[:, None, :].expand(-1, h.shape[1], -1)
    hn = rms_norm(h, t["hnorm.weight"], eps)
    return F.linear(torch.cat([en, hn], -1), torch.cat([t["e_proj.weight"], t["h_proj.weight"]], 1))


def block(spec: Deepseek4Spec, t: Mapping[str, T], u: T, p0: int, cache: kv4.V4Cache | None) -> T:
    """The MTP's mHC block on rows u [R, S, H] at positions p0.. (their K = V written to ``cache``; without one
    the rows attend among themselves from position 0) -> y [R, S, H]."""
    a, eps = spec.attn, spec.layer.rms_eps
    aw, rope = attn_weights_at(t, "self_attn.", "sliding"), kv4.Rope(a.rope_theta, a.rope_dim)
    none = torch.zeros(u.shape[0], dtype=torch.long, device=u.device)

    def attend(x: T) -> T:
        return kv4.v4_attention(x, aw, "sliding", a.num_heads, a.window, rope, eps, groups=a.o_groups, p0=p0,
                                cache=cache)[0]

    def moe(b: T) -> T:
        return ffn_at(spec, t, "mlp.", route_at(spec, t, "mlp.", "moe", b, none), b)

    return hc_block(spec, t, "", u, attend, moe)


def head_in(spec: Deepseek4Spec, t: Mapping[str, T], y: T) -> T:
    """g [R, H] = rms(hyper_head(y; hc_head), norm) of output streams y [R, S, H]."""
    eps = spec.layer.rms_eps
    x = kmhc.hyper_head(y, t["hc_head.hc_fn"], t["hc_head.hc_base"], t["hc_head.hc_scale"], spec.hc.eps, eps)
    return rms_norm(x, t["norm.weight"], eps)


def own_tensors(spec: Deepseek4MTPSpec, device: torch.device, dtype: torch.dtype) -> dict[str, T]:
    """The mtp.0.* tensors without the prefix, on the device: HF's float32 ones (norms, sinks, mHC / HC-head
    mixes, the router bias) in float32, the rest in the run dtype."""
    return {n[len(P):]: x.to(device=device, dtype=torch.float32 if n.endswith(F32_SUFFIXES) else dtype)
            for n, x in spec.tensors.items() if n.startswith(P)}


class Deepseek4MTPDraft(ChainStore):
    """Device MTP draft bound to a deepseek4 target engine (its embedding and head; its raw streams)."""

    def __init__(self, spec: Deepseek4MTPSpec, target: Deepseek4Target, max_len: int, width: int = DEFAULT_WIDTH):
        if width < 1:
            raise ValueError(f"MTP width {width}: expected >= 1 drafts per window")
        self.spec, self.width, self.tspec = spec, width, target.spec
        self.device, self.dtype = target.device, target.dtype
        self.t = own_tensors(spec, self.device, self.dtype)
        self.embed, self.head, self.eps = target.embed, target.head, target.spec.layer.rms_eps
        a = self.tspec.attn
        self.cap, self.store_what = max_len + width + 2, "MTP"
        self.cache = kv4.V4Cache.empty(self.cap, "sliding", a.head_dim, a.index_head_dim, self.device, self.dtype)
        self.next_slot, self.anchor_written = 1, False
        self.pend_e = self.pend_h = self.last_h = None

    def _rows(self, e: T, h: T, slot0: int) -> tuple[T, T]:
        """Rows (e [R, H], h [R, S, H]) at slots slot0.. (positions slot0-1..), written to the window KV ->
        (y [R, S, H], g [R, H])."""
        if slot0 - 1 + e.shape[0] > self.cap:
            raise ValueError(f"MTP window KV of {self.cap} positions is full (pass ends at {slot0 - 1 + e.shape[0]})")
        y = block(self.tspec, self.t, eh_input(self.t, e, h, self.eps), slot0 - 1, self.cache)
        return y, head_in(self.tspec, self.t, y)

    def prompt(self, taps: T) -> None:
        """Prompt taps [L+1, P, S, H]: rows 0..P-2 (streams q, token q+1) are real; streams P-1 wait for the
        anchor."""
        self.start(taps[0][1:, 0], taps[-1])

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows: their tokens and raw streams join the queue."""
        self.queue(kept, taps[0][:, 0], taps[-1][:kept])

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids ``width`` drafts; with ``detail`` the logits [width, V] and layer_out [1, width, S, H],
        the block's output streams per drafted row."""
        e, h = self.real_rows(self.embed[anchor])
        y, g = self._rows(e, h, self.next_slot)                  # every row real: written for good
        self.written(e.shape[0])
        ys, logits = [y[-1:]], [F.linear(g[-1:], self.head)]
        ids = [int(logits[-1].argmax(-1))]
        for i in range(1, self.width):                           # chained rows: transient positions
            y, g = self._rows(self.embed[ids[-1]][None], ys[-1], self.next_slot + i - 1)
            ys.append(y)
            logits.append(F.linear(g, self.head))
            ids.append(int(logits[-1].argmax(-1)))
        if not detail:
            return Proposal(ids)
        return Proposal(ids, torch.cat(logits), torch.cat(ys)[None])

    def store_rows(self) -> T:
        """A read-only view of the window KV's real rows, positions 0..next_slot-2 [n, d]."""
        return self.cache.kv[:self.next_slot - 1]


def forward_train(t: Mapping[str, T], spec: Deepseek4Spec, embed: T, head: T, streams: T, ids: T) -> T:
    """Differentiable teacher-forced MTP rows of one sequence: ``t`` the mtp.0.* tensors without the prefix,
    streams [n, S, H] the target's raw streams over ids [n]; logits [n-1, V], row q predicting ids[q+2]."""
    u = eh_input(t, F.embedding(ids[1:], embed), streams[:-1], spec.layer.rms_eps)
    return F.linear(head_in(spec, t, block(spec, t, u, 0, None)), head)
