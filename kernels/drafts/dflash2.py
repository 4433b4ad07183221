"""DFlash2 block drafter on the device (DRAFTERS.md section 3).

The DFlash draft (``kernels.drafts.dflash``: context features and context K/V cache, block rows
[x_s, m, ..., m], the target's embedding and head) with two additions:

1. Grouped dynamic depthwise conv on both sides of each sublayer, over the B rows of the block only
   (causal inside the block, never across blocks, never over context rows):
       a = rms(h, in) ; da = a W_kp^T ;  h = h + Conv^1( Attn( Conv^0(a ; da) ) ; da )
       m = rms(h, post) ; dm = m W_kp'^T ;  h = h + Conv^1'( MLP( Conv^0'(m ; dm) ) ; dm )
   Q, K and V of the block rows come from Conv^0(a); context K/V are DFlash's, unchanged.
2. The low-rank top-K path selector over slots j = 1..B-1 (``kernels.ops.selector``):
       l = head(rms(h, norm)[1:]) * output_multiplier (softcapped);  g = W_hp rms(h, norm)[1:]
       (U, C) = topk(l, K);  S_j[p, c] = U_j[c] + sum_r A[P_j[p], r] g_j[r] Bs[C_j[c], r];  greedy walk
   The proposal is the walked path d_1..d_{B-1}.

``impl``: "torch" (plain torch ops), "triton" (the fused kernels: one launch per conv sublayer side,
two for the top-K of all B-1 slots, two for their scores and walk) or "auto" (triton on CUDA when it imports).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DFlash2Spec, ModelSpec

from ..families.qwen3.model import LayerWeights, Qwen3Target, project_kv, project_q
from ..families.qwen38.model import Qwen38Target, norm_gain
from ..ops.attention import attend
from ..ops.dynamic_conv import conv_delta, dynamic_conv
from ..ops.mlp import swiglu
from ..ops.norm import rms_norm
from ..ops.rope import rope_tables
from ..ops.selector import first_argmax, head_logits, scores, select, topk_candidates
from ..triton import conv_impl, resolve_impl, select_impl, topk_impl
from .dflash import DFlashDraft, block_ids, context_features

SELECTOR = "candidate_selector."


@dataclass(frozen=True)
class ConvWeights:
    """One draft layer's two conv blocks: kernel_projection [2*T*G, H] and base_kernel [2, T, H]."""

    attn_kp: torch.Tensor
    attn_base: torch.Tensor
    mlp_kp: torch.Tensor
    mlp_base: torch.Tensor

    @classmethod
    def gather(cls, t: Mapping[str, torch.Tensor], prefix: str, cast=lambda x: x) -> ConvWeights:
        a, m = prefix + "attention_conv.", prefix + "mlp_conv."
        return cls(cast(t[a + "kernel_projection.weight"]), cast(t[a + "base_kernel"]),
                   cast(t[m + "kernel_projection.weight"]), cast(t[m + "base_kernel"]))


def conv_layer(h: torch.Tensor, w: LayerWeights, cw: ConvWeights, spec: DFlash2Spec, cos: torch.Tensor,
               sin: torch.Tensor, attend_kv, block: int, conv=None) -> torch.Tensor:
    """One DFlash2 layer over block rows h [N, R, H] (R = blocks * block); ``attend_kv(q, k, v)`` adds
    the context keys. ``conv`` defaults to this module's ``dynamic_conv`` (read at call time)."""
    conv = conv or dynamic_conv
    eps = spec.layer.rms_eps
    a = rms_norm(h, w.ln_in, eps)
    da = conv_delta(a, cw.attn_kp)
    a0 = conv(a, da, cw.attn_base, 0, block)
    q, (k, v) = project_q(a0, w, spec.layer, cos, sin), project_kv(a0, w, spec.layer, cos, sin)
    h = conv(F.linear(attend_kv(q, k, v), w.wo), da, cw.attn_base, 1, block, res=h)
    m = rms_norm(h, w.ln_post, eps)
    dm = conv_delta(m, cw.mlp_kp)
    y = swiglu(conv(m, dm, cw.mlp_base, 0, block), w.wg, w.wu, w.wd)
    return conv(y, dm, cw.mlp_base, 1, block, res=h)


def draft_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows 1..B-1 of a block [..., B, H]: row i predicts the token at s+i (the anchor row predicts nothing)."""
    return x[..., 1:, :]


@dataclass
class Proposal:
    ids: list[int]                              # B-1 drafts: the walked path
    logits: torch.Tensor | None = None          # [B-1, V] float32 (multiplied / softcapped), when asked
    layer_out: torch.Tensor | None = None       # [n_layers, B, H]
    cand: torch.Tensor | None = None            # [B-1, K] candidate ids
    unary: torch.Tensor | None = None           # [B-1, K] their logits
    scores: torch.Tensor | None = None          # [B-1, K, K] S_j[p, c]
    idx: torch.Tensor | None = None             # [B-1] the walked candidate index per slot


class DFlash2Draft(DFlashDraft):
    """Device DFlash2 draft bound to a target engine (qwen3, or the qwen38 hybrid: it reads only the engine's
    taps, embedding, head and final-norm gain); the context path (prompt / accept) is DFlash's."""

    def __init__(self, spec: DFlash2Spec, target: Qwen3Target | Qwen38Target, max_len: int, impl: str = "auto"):
        super().__init__(spec, target, max_len)
        self.impl = resolve_impl(impl, self.device)
        self.conv, self.fused, self.topk = conv_impl(self.impl), select_impl(self.impl), topk_impl(self.impl)
        cast = lambda x: x.to(device=self.device, dtype=self.dtype)  # noqa: E731
        self.convs = [ConvWeights.gather(spec.tensors, f"layers.{i}.", cast) for i in range(spec.num_layers)]
        self.w_hp = cast(spec.tensors[SELECTOR + "hidden_projection.weight"])
        self.a = cast(spec.tensors[SELECTOR + "predecessor_codebook"])
        self.bs = cast(spec.tensors[SELECTOR + "successor_codebook"])

    def propose(self, anchor: int, detail: bool = False) -> Proposal:
        s, b, sp = self.ctx_len, self.b, self.spec
        anchor_t = torch.tensor(anchor, device=self.device)
        h = F.embedding(block_ids(anchor_t[None], sp.mask_token_id, b), self.embed)          # [1, B, H]
        if sp.input_embedding_scale != 1.0:
            h = h * sp.input_embedding_scale
        cos, sin = self.cos[s:s + b], self.sin[s:s + b]
        allowed = self.block_allowed(s)
        outs = []
        for i, (w, cw) in enumerate(zip(self.layers, self.convs, strict=True)):
            def with_context(q, k, v, i=i):
                return attend(q, torch.cat([self.k_ctx[i], k], dim=2), torch.cat([self.v_ctx[i], v], dim=2), allowed)
            h = conv_layer(h, w, cw, sp, cos, sin, with_context, b, self.conv)
            outs.append(h[0])
        rows = draft_rows(rms_norm(h[0], self.norm, self.shape.rms_eps))                      # [B-1, H]
        logits = head_logits(rows, self.head, sp.output_multiplier, sp.final_logit_softcapping)
        sel = select(logits, F.linear(rows, self.w_hp), anchor_t, self.a, self.bs, sp.selector_top_k, self.fused,
                     self.topk)
        ids = sel.ids.tolist()
        if not detail:
            return Proposal(ids)
        return Proposal(ids, logits, torch.stack(outs), sel.cand, sel.unary, sel.scores, sel.idx)


@dataclass
class TrainOut:
    """logits [N, A, B-1, V] float32; g [N, A, B-1, r]; with labels: the selector's teacher-forced
    scores [N, A, B-1, K] over candidates cand [N, A, B-1, K] and the label's index ``target`` [N, A, B-1]."""

    logits: torch.Tensor
    g: torch.Tensor
    scores: torch.Tensor | None = None
    cand: torch.Tensor | None = None
    target: torch.Tensor | None = None


def teacher_candidates(logits: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K of the (detached) logits with the label forced in (it replaces candidate K-1 when absent)
    -> (cand [..., K], index of the label in cand [...])."""
    _, cand = topk_candidates(logits.detach(), k)
    hit = (cand == labels[..., None]).any(-1, keepdim=True)
    last = torch.arange(k, device=cand.device) == k - 1
    cand = torch.where(~hit & last, labels[..., None], cand)
    return cand, first_argmax((cand == labels[..., None]).int())


def target_final_norm(target_spec: ModelSpec, target_params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The gain of the target's final norm, as its engine applies it (``final_norm``): model.norm.weight for
    qwen3, 1 + w for the zero-centred norm of the qwen38 family. Read by a feature on the target's last layer."""
    w = target_params["model.norm.weight"]
    return norm_gain(w) if target_spec.family == "qwen38" else w


def forward_train(dparams: Mapping[str, torch.Tensor], dspec: DFlash2Spec, target_params: Mapping[str, torch.Tensor],
                  target_spec: ModelSpec, hidden: list[torch.Tensor], ids: torch.Tensor, anchors: torch.Tensor,
                  labels: torch.Tensor | None = None) -> TrainOut:
    """Differentiable (torch path): ids [N, T], anchors [N, A] (1 <= s, s+B-1 <= T-1), labels [N, A, B-1]
    (the token each slot should draft) -> TrainOut. Block a reads context positions < s_a and its own B
    rows, as at inference; the conv restarts at every block. Teacher-forced selector predecessors:
    slot 1 <- the anchor x_s, slot j > 1 <- labels[j-2]."""
    shape, b = dspec.layer, dspec.block_size
    n, t = ids.shape
    a = anchors.shape[1]
    cos_t, sin_t = rope_tables(shape.head_dim, shape.rope_theta, t + b, ids.device, shape.rope_scaling)
    u = context_features(hidden, dspec.target_layer_ids, dparams["fc.weight"], dparams["hidden_norm.weight"],
                         shape.rms_eps, target_final_norm(target_spec, target_params), target_spec.layer.rms_eps)
    anchor_ids = torch.gather(ids, 1, anchors)                                             # [N, A]
    pos = (anchors[..., None] + torch.arange(b, device=ids.device)).reshape(n, a * b)
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]
    ctx_ok = (torch.arange(t, device=ids.device)[None, None, :] < anchors[..., None]).repeat_interleave(b, dim=1)
    blk = torch.arange(a * b, device=ids.device) // b
    allowed = torch.cat([ctx_ok, (blk[:, None] == blk[None, :]).expand(n, -1, -1)], dim=-1)[:, None, None]
    h = F.embedding(block_ids(anchor_ids, dspec.mask_token_id, b).reshape(n, a * b),
                    target_params["model.embed_tokens.weight"]) * dspec.input_embedding_scale
    for i in range(dspec.num_layers):
        w = LayerWeights.gather(dparams, f"layers.{i}.")
        kc, vc = project_kv(u, w, shape, cos_t[:t], sin_t[:t])
        def with_context(q, k, v, kc=kc, vc=vc):
            return attend(q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), allowed)
        h = conv_layer(h, w, ConvWeights.gather(dparams, f"layers.{i}."), dspec, cos, sin, with_context, b)
    head = target_params["model.embed_tokens.weight" if target_spec.tie_word_embeddings else "lm_head.weight"]
    rows = draft_rows(rms_norm(h, dparams["norm.weight"], shape.rms_eps).view(n, a, b, -1))   # [N, A, B-1, H]
    logits = head_logits(rows, head, dspec.output_multiplier, dspec.final_logit_softcapping)
    g = F.linear(rows, dparams[SELECTOR + "hidden_projection.weight"])
    if labels is None:
        return TrainOut(logits, g)
    cand, target = teacher_candidates(logits, labels, dspec.selector_top_k)
    pred = torch.cat([anchor_ids[..., None], labels[..., :-1]], dim=-1)[..., None]          # [N, A, B-1, 1]
    s = scores(pred, cand, logits.gather(-1, cand), g, dparams[SELECTOR + "predecessor_codebook"],
               dparams[SELECTOR + "successor_codebook"]).squeeze(-2)
    return TrainOut(logits, g, s, cand, target)
