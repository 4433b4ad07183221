"""DFlash block drafter on the device (DRAFTERS.md section 2).

Context feature per committed position p (shared by every draft layer):
    u_p = rms( fc( concat_j taps[l_j + 1][p] ), hidden_norm )          [H]  (fc: [H, n*H])
Block at positions s..s+B-1: rows y = [x_s, m, ..., m], h = E(y)      [B, H]
Each draft layer (Qwen3 layer shape):
    Q from the block rows;  K, V from [u_0..u_{s-1} ; block rows]  (k_norm + RoPE on both)
    no mask: every block row sees all context and all block rows; a sliding layer (``spec.windows[i]`` = W,
    ``formats.sliding``), by ``spec.window_rule``: "query" the row at position p sees the keys p - W < j <= p,
    context and block alike; "anchor" / "anchor-bidir" the context s - W <= j < s and the block causally / whole
drafts = argmax( rms(h, norm) head^T )[1:]  -> B-1 ids, row i predicts the token at s+i

The engine keeps only context K/V (post k_norm, post RoPE) in a static cache; block K/V are
transient. After a verify keeps k rows, the target's taps of those rows become context s..s+k-1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DFlashSpec, ModelSpec

from ..families.qwen3.model import FusedLayer, LayerWeights, Qwen3Target, decoder_layer, project_kv
from ..graphs import GraphSet, Staged
from ..ops.attention import anchored_mask, attend, sliding_mask
from ..ops.norm import rms_norm
from ..ops.rope import rope_tables
from .proposal import Proposal


def context_features(taps: torch.Tensor | list[torch.Tensor], layer_ids, fc, hidden_norm, eps: float,
                     final_norm: torch.Tensor, target_eps: float, ops=None, rp: int | None = None) -> torch.Tensor:
    """taps: L+1 tensors [..., H], taps[l+1] = output of layer l before the final norm -> u [..., H].

    Feature j is HF's hidden_states[l_j + 1], which for the last layer (l_j = L-1) is post-final-norm.
    With ``ops`` (``kernels.dispatch.decode_ops``; taps rows [R, H], the gains float32) the norms are ``ops.rms`` and
    the fc is ``ops.proj`` (rows padded to ``rp``): the fast drafts' layout, the same math.
    """
    last = len(taps) - 1
    norm = rms_norm if ops is None else ops.rms
    feats = [taps[l + 1] if l + 1 < last else norm(taps[last], final_norm, target_eps) for l in layer_ids]
    x = torch.cat(feats, dim=-1)
    return norm(F.linear(x, fc) if ops is None else ops.proj(x, fc, None, eps, rp=rp), hidden_norm, eps)


def block_ids(anchor: torch.Tensor, mask_id: int, b: int) -> torch.Tensor:
    """anchor [...] -> [..., B] = [anchor, m, ..., m]."""
    rest = torch.full((*anchor.shape, b - 1), mask_id, dtype=anchor.dtype, device=anchor.device)
    return torch.cat([anchor[..., None], rest], dim=-1)


class DFlashDraft:
    """Device DFlash draft bound to a target engine (shares its embedding and head)."""

    def __init__(self, spec: DFlashSpec, target: Qwen3Target, max_len: int):
        self.spec, self.shape, self.b = spec, spec.layer, spec.block_size
        self.device, self.dtype = target.device, target.dtype
        cast = lambda x: x.to(device=self.device, dtype=self.dtype)  # noqa: E731
        self.layers = [LayerWeights.gather(spec.tensors, f"layers.{i}.", cast) for i in range(spec.num_layers)]
        self.fc, self.hidden_norm = cast(spec.tensors["fc.weight"]), cast(spec.tensors["hidden_norm.weight"])
        self.norm = cast(spec.tensors["norm.weight"])
        self.embed, self.head, self.target_norm = target.embed, target.head, target.final_norm
        self.target_eps = target.shape.rms_eps
        self.cap = max_len + self.b
        s = self.shape
        self.cos, self.sin = rope_tables(s.head_dim, s.rope_theta, self.cap + self.b, self.device, s.rope_scaling)
        kv = (spec.num_layers, 1, s.num_kv_heads, self.cap, s.head_dim)
        self.k_ctx = torch.zeros(kv, device=self.device, dtype=self.dtype)
        self.v_ctx = torch.zeros(kv, device=self.device, dtype=self.dtype)
        self.key_pos = torch.arange(self.cap, device=self.device)
        self.ctx_len = 0

    def extend(self, taps: torch.Tensor, p0: int) -> None:
        """Write context K/V for positions p0..p0+R-1 from target taps [L+1, R, H]."""
        r = taps.shape[1]
        u = context_features(taps, self.spec.target_layer_ids, self.fc, self.hidden_norm, self.shape.rms_eps,
                             self.target_norm, self.target_eps)
        cos, sin = self.cos[p0:p0 + r], self.sin[p0:p0 + r]
        for i, w in enumerate(self.layers):
            k, v = project_kv(u[None], w, self.shape, cos, sin)
            self.k_ctx[i, :, :, p0:p0 + r] = k
            self.v_ctx[i, :, :, p0:p0 + r] = v
        self.ctx_len = p0 + r

    def prompt(self, taps: torch.Tensor) -> None:
        self.extend(taps, 0)

    def accept(self, kept: int, taps: torch.Tensor) -> None:
        """The verify kept ``kept`` rows starting at the last anchor's position."""
        self.extend(taps[:, :kept], self.ctx_len)

    def context_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only views (never write through them) of draft layer ``layer``'s context store, positions
        0..ctx_len-1, as written by prompt / accept: (k after k_norm and RoPE, v), each [nkv, ctx_len, d]."""
        return self.k_ctx[layer, 0, :, :self.ctx_len], self.v_ctx[layer, 0, :, :self.ctx_len]

    def block_allowed(self, s: int, window: int | None = None) -> torch.Tensor:
        """[B, cap + B] over [context store ; block rows]: every block row sees context positions < s and all
        B block rows (no mask); with a ``window`` W, the row at position p = s + r also needs p - W < j <= p."""
        ctx = (self.key_pos < s)[None, :].expand(self.b, -1)
        allowed = torch.cat([ctx, torch.ones(self.b, self.b, dtype=torch.bool, device=self.device)], dim=1)
        if window is None:
            return allowed
        pos_q = s + torch.arange(self.b, device=self.device)
        pos_kv = torch.cat([self.key_pos, pos_q])
        rule = self.spec.window_rule
        if rule == "query":
            return allowed & sliding_mask(pos_q, pos_kv, window)
        return allowed & anchored_mask(pos_q, pos_kv, s, window, causal=rule == "anchor")

    def layer_masks(self, s: int) -> list[torch.Tensor]:
        """One mask per draft layer, each distinct window's built once for this step."""
        windows = self.spec.windows or (None,) * self.spec.num_layers
        built = {w: self.block_allowed(s) if w is None else self.block_allowed(s, w) for w in set(windows)}
        return [built[w] for w in windows]

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        """-> Proposal: ids B-1 drafts; with ``detail`` the logits [B-1, V] and layer_out [n_layers, B, H]."""
        s, b = self.ctx_len, self.b
        ids = block_ids(torch.tensor([anchor], device=self.device), self.spec.mask_token_id, b)
        h = F.embedding(ids, self.embed)                                                # [1, B, H]
        cos, sin = self.cos[s:s + b], self.sin[s:s + b]
        masks = self.layer_masks(s)
        outs = []
        for i, w in enumerate(self.layers):
            def with_context(q, k, v, i=i):
                keys = torch.cat([self.k_ctx[i], k], dim=2)
                vals = torch.cat([self.v_ctx[i], v], dim=2)
                return attend(q, keys, vals, masks[i])
            h = decoder_layer(h, w, self.shape, cos, sin, with_context)
            outs.append(h[0])
        logits = F.linear(rms_norm(h[0, 1:], self.norm, self.shape.rms_eps), self.head)  # [B-1, V]
        drafts = logits.argmax(-1).tolist()
        if not detail:
            return Proposal(drafts)
        return Proposal(drafts, logits, torch.stack(outs))


def forward_train(dparams: Mapping[str, torch.Tensor], dspec: DFlashSpec, target_params: Mapping[str, torch.Tensor],
                  target_spec: ModelSpec, hidden: list[torch.Tensor], ids: torch.Tensor,
                  anchors: torch.Tensor) -> torch.Tensor:
    """Differentiable: ids [N, T], anchors [N, A] (1 <= s, s+B-1 <= T-1) -> logits [N, A, B-1, V].

    Block a reads context positions < s_a and its own B rows, as at inference.
    """
    shape, b = dspec.layer, dspec.block_size
    n, t = ids.shape
    a = anchors.shape[1]
    cos_t, sin_t = rope_tables(shape.head_dim, shape.rope_theta, t + b, ids.device, shape.rope_scaling)
    u = context_features(hidden, dspec.target_layer_ids, dparams["fc.weight"], dparams["hidden_norm.weight"],
                         shape.rms_eps, target_params["model.norm.weight"], target_spec.layer.rms_eps)  # [N, T, H]
    block = block_ids(torch.gather(ids, 1, anchors), dspec.mask_token_id, b)             # [N, A, B]
    pos = (anchors[..., None] + torch.arange(b, device=ids.device)).reshape(n, a * b)   # [N, A*B]
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]                                  # [N, 1, A*B, d]
    ctx_ok = torch.arange(t, device=ids.device)[None, None, :] < anchors[..., None]     # [N, A, T]
    ctx_ok = ctx_ok.repeat_interleave(b, dim=1)                                          # [N, A*B, T]
    blk = torch.arange(a * b, device=ids.device) // b
    allowed = torch.cat([ctx_ok, (blk[:, None] == blk[None, :]).expand(n, -1, -1)], dim=-1)[:, None, None]
    h = F.embedding(block.reshape(n, a * b), target_params["model.embed_tokens.weight"])
    for i in range(dspec.num_layers):
        w = LayerWeights.gather(dparams, f"layers.{i}.")
        kc, vc = project_kv(u, w, shape, cos_t[:t], sin_t[:t])
        def with_context(q, k, v, kc=kc, vc=vc):
            return attend(q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), allowed)
        h = decoder_layer(h, w, shape, cos, sin, with_context)
    head = target_params["model.embed_tokens.weight" if target_spec.tie_word_embeddings else "lm_head.weight"]
    h = rms_norm(h, dparams["norm.weight"], shape.rms_eps).view(n, a, b, -1)[:, :, 1:]
    return F.linear(h, head)


class GraphedPropose:
    """``propose`` of a graphed block draft: the anchor and the context length staged (``inp``), one replay of
    ``propose_graph``, the block's ids read back once; its logits copied out only when asked (``detail``)."""

    ctx_len: int
    b: int
    cap: int
    proposal: type = Proposal                   # the draft kind's proposal record (DFlash2's carries more fields)

    def propose(self, anchor: int, detail: bool = False):
        """With ``detail`` the same pass runs eagerly (never replayed) and records what the gate's draft checks
        read: each layer's output [n_layers, B, H] and the rest ``detail_pass`` returns."""
        if self.ctx_len + self.b > self.cap:
            raise ValueError(f"draft context of {self.cap} positions is full")
        self.inp.put([self.ctx_len, anchor])
        if detail:
            return self.detail_pass()
        self.propose_graph.run(0)
        ids = self.ids_buf.tolist()
        return self.proposal(ids)

    def detail_pass(self):
        raise NotImplementedError

    def _graph_passes(self, graphs: bool) -> None:
        """``propose_graph`` (one key) and ``extend_graphs`` (one per kept row count) over the draft's own passes,
        ``_propose_key`` and ``_extend_rows``: bound methods, which a GraphSet holds weakly (``graphs.held``)."""
        self.propose_graph = GraphSet(self._propose_key, self.device, enabled=graphs)
        self.extend_graphs = GraphSet(self._extend_rows, self.device, enabled=graphs)


class FastDFlashDraft(GraphedPropose):
    """DFlashDraft's interface bound to a ``FastQwen3Target`` (whose ``tap_ids`` must hold the draft's feature
    taps, l_j + 1: exactly those in the bench, every layer under the gate): fused weights and ops, and on CUDA one
    graph for ``propose`` and one per width for the context extension. The block's K/V are written into the
    context cache at s..s+B-1 (transient: the next extension overwrites them) and every block row attends keys
    < s + B, which is DFlash's rule (context < s, the whole block). ``accept`` extends every row of the last
    verify and advances by ``kept``: rows past it sit beyond the context and are overwritten before any block can
    read them."""

    def __init__(self, spec: DFlashSpec, target, max_len: int, graphs: bool = True):
        if any(w is not None for w in spec.windows):
            raise ValueError("FastDFlashDraft: sliding-window draft layers run on DFlashDraft only")
        want = tuple(l + 1 for l in spec.target_layer_ids)
        if not set(want) <= set(target.tap_ids):
            raise ValueError(f"the target keeps taps {target.tap_ids}; this draft reads {want}")
        self.tap_index = tuple(tuple(target.tap_ids).index(t) for t in want)   # where each feature sits in taps
        self.spec, self.shape, self.b, self.target = spec, spec.layer, spec.block_size, target
        self.device, self.dtype, self.ops = target.device, target.dtype, target.ops
        cast = lambda x: x.to(device=self.device, dtype=self.dtype)  # noqa: E731
        self.layers = [FusedLayer.of(LayerWeights.gather(spec.tensors, f"layers.{i}.", cast))
                       for i in range(spec.num_layers)]
        self.fc = cast(spec.tensors["fc.weight"])
        self.hidden32 = spec.tensors["hidden_norm.weight"].to(self.device).float()
        self.norm32 = spec.tensors["norm.weight"].to(self.device).float()
        self.embed, self.head = target.embed, target.head
        s = self.shape
        self.cap = -(-(max_len + 2 * max(self.b, target.max_width)) // 64) * 64
        self.cos, self.sin = rope_tables(s.head_dim, s.rope_theta, self.cap, self.device, s.rope_scaling)
        kv = (spec.num_layers, s.num_kv_heads, self.cap, s.head_dim)
        self.k_ctx = torch.zeros(kv, device=self.device, dtype=self.dtype)
        self.v_ctx = torch.zeros(kv, device=self.device, dtype=self.dtype)
        self.inp = Staged(2, self.device)                         # [s, anchor]
        self.ext = Staged(1, self.device)                         # [p0]
        self.block = torch.full((self.b,), spec.mask_token_id, dtype=torch.long, device=self.device)
        self.logits_buf = torch.zeros(self.b - 1, spec.vocab_size, device=self.device, dtype=self.dtype)
        self.ids_buf = torch.zeros(self.b - 1, dtype=torch.long, device=self.device)
        self._graph_passes(graphs)
        self.ctx_len = 0

    def _propose_key(self, _key) -> None:
        self._propose_pass()

    def _extend_rows(self, r: int) -> None:
        """The extension graph's pass: the target's r kept taps at the staged p0."""
        self._extend(self.target.taps_buf[:, :r], self.ext.dev)

    def _extend(self, taps: torch.Tensor, p0: torch.Tensor) -> None:
        """Context K/V at p0.. from the target's kept taps [n, R, H] (graph-safe)."""
        s, ops = self.shape, self.ops
        n, r, h = taps.shape
        last = self.target.spec.num_layers
        feats = [ops.rms(taps[j], self.target.final32, self.target.shape.rms_eps)
                 if l + 1 == last else taps[j] for j, l in zip(self.tap_index, self.spec.target_layer_ids, strict=True)]
        u = ops.rms(torch.mm(torch.cat(feats, dim=-1), self.fc.t()), self.hidden32, s.rms_eps)
        nq, nkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        for i, w in enumerate(self.layers):
            kv = torch.mm(u, w.wqkv[nq * d:].t())
            ops.qk_rope_store(kv, 0, nkv, d, None, w.k_norm, self.cos, self.sin, p0, self.k_ctx[i], self.v_ctx[i],
                              s.rms_eps)

    def context_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only views of draft layer ``layer``'s context store, positions 0..ctx_len-1: (k, v), each
        [nkv, ctx_len, d] (k after k_norm and RoPE)."""
        return self.k_ctx[layer, :, :self.ctx_len], self.v_ctx[layer, :, :self.ctx_len]

    def detail_pass(self) -> Proposal:
        outs: list[torch.Tensor] = []
        self._propose_pass(outs)
        return Proposal(self.ids_buf.tolist(), self.logits_buf.clone(), torch.stack(outs))

    def _propose_pass(self, rec: list | None = None) -> None:
        """The propose step (graph-safe); ``rec`` (eager runs only) collects each layer's output [B, H]."""
        s, ops = self.shape, self.ops
        nh, nkv, d, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_eps
        self.block[:1].copy_(self.inp.dev[1:2])
        p0 = self.inp.dev[:1]
        h = F.embedding(self.block, self.embed)
        for i, w in enumerate(self.layers):
            a = ops.rms(h, w.ln_in, eps)
            qkv = torch.mm(a, w.wqkv.t())
            ops.qk_rope_store(qkv, nh, nkv, d, w.q_norm, w.k_norm, self.cos, self.sin, p0, self.k_ctx[i],
                              self.v_ctx[i], eps)
            o = ops.attention(qkv, nh, nkv, d, self.k_ctx[i], self.v_ctx[i], p0, causal=False)
            h = torch.addmm(h, o, w.wo.t())
            h = torch.addmm(h, ops.silu_mul(torch.mm(ops.rms(h, w.ln_post, eps), w.wgu.t())), w.wd.t())
            if rec is not None:
                rec.append(h.clone())
        torch.mm(ops.rms(h[1:], self.norm32, eps), self.head.t(), out=self.logits_buf)
        torch.argmax(self.logits_buf, dim=-1, out=self.ids_buf)

    def capture(self, anchor: int = 0) -> None:
        """Capture the propose pass and the extension of every width now (idempotent passes at ctx_len)."""
        self.inp.put([self.ctx_len, anchor])
        self.propose_graph.capture(0)
        self.ext.put([self.ctx_len])
        for r in range(1, self.target.max_width + 1):
            self.extend_graphs.capture(r)

    def prompt(self, taps: torch.Tensor) -> None:
        self._extend(taps, torch.zeros(1, dtype=torch.long, device=self.device))
        self.ctx_len = taps.shape[1]

    def accept(self, kept: int, taps: torch.Tensor) -> None:
        r = taps.shape[1]
        if taps.data_ptr() != self.target.taps_buf.data_ptr():
            raise ValueError("FastDFlashDraft.accept expects the taps of its target's last verify")
        self.ext.put([self.ctx_len])
        self.extend_graphs.run(r)
        self.ctx_len += kept
