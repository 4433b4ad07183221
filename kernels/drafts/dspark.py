"""DSpark block drafter on the device (DRAFTERS.md section 4): DFlash's backbone, an anchor-first read-out,
a serial low-rank Markov head and a confidence head.

Backbone (DFlash's, reused from kernels.drafts.dflash: context cache, ``block_ids``, the layer):
    u_p = rms( fc( concat_j taps[l_j + 1][p] ), hidden_norm )        context K/V cached per position
    rows y = [x_s, m, ..., m] at positions s..s+B-1, h = E(y)      [B, H]  (E: the drafter's copy if any)
    each layer: queries = block rows; keys/values = [context ; block]; no mask
Read-out, anchor-first (row k predicts the token at s+k+1; B rows give B drafts):
    hn   = rms(h, norm)                                             [B, H]
    base = hn head^T                                                [B, V]  (head: the drafter's copy if any)
    prev_0 = x_s; for k = 0..B-1 (serial):
        logits_k = base_k + W2 W1[prev_k]       W1, W2: markov_w1 / markov_w2 [V, r]; the term and the sum
                                                each stored in the run dtype (reference: markov_logits)
        d_k = argmax logits_k;  prev_{k+1} = d_k
    conf_k = sigmoid( proj . [hn_k ; W1[prev_k]] + bias )           [B]
    cut (threshold t > 0): keep the drafts before the first k with conf_k < t, at least one.

The Markov loop stays on the device: per row a few small launches (gather, matvec, add, argmax, write), no host
sync, fixed shapes (so a CUDA graph can capture the block); the ids and the cut length are read back
once per block. The engine keeps only context K/V (DFlash's cache); block K/V are transient.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DSparkSpec, ModelSpec

from ..families.qwen3.model import LayerWeights, Qwen3Target, decoder_layer, project_kv
from ..ops.attention import attend
from ..ops.norm import rms_norm
from ..ops.rope import rope_tables
from .dflash import DFlashDraft, Proposal, block_ids, context_features


@dataclass
class DSparkProposal(Proposal):
    drafts: list[int] | None = None             # all B drafts (``ids`` may be cut shorter)
    prev: torch.Tensor | None = None            # [B] the id each row's Markov term read
    confidence: torch.Tensor | None = None      # [B] sigmoid(conf_logits), None without a confidence head
    conf_logits: torch.Tensor | None = None     # [B]


def markov_decode(base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor | None,
                  w2: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Serial Markov correction over the B rows, all on the device (no .item()).

    base [B, V], anchor [1] (long, on the device) -> (logits [B, V], prev [B]); prev_0 = anchor,
    prev_{k+1} = argmax logits_k. Without a Markov head (w1 None) logits = base.
    """
    b = base.shape[0]
    if w1 is None or w2 is None:
        return base, torch.cat([anchor, base[:-1].argmax(-1)])
    prev = torch.empty(b, dtype=torch.long, device=base.device)
    prev[:1] = anchor
    logits = torch.empty_like(base)
    for k in range(b):
        logits[k] = base[k] + F.linear(F.embedding(prev[k:k + 1], w1), w2)[0]
        if k + 1 < b:
            prev[k + 1] = logits[k].argmax()
    return logits, prev


def keep_count(confidence: torch.Tensor | None, threshold: float, b: int, device: torch.device) -> torch.Tensor:
    """Device scalar: the drafts kept before the first conf_k < t, at least 1; all B when t <= 0 or no head."""
    if confidence is None or threshold <= 0:
        return torch.full((), b, dtype=torch.long, device=device)
    low = (confidence < threshold).int()
    return torch.where(low.any(), low.argmax(), b).clamp(min=1)


class DSparkDraft(DFlashDraft):
    """Device DSpark draft bound to a target engine. The context cache, ``prompt`` and ``accept`` are
    DFlash's; ``propose`` returns up to B drafts (anchor-first), cut by ``confidence_cut`` when > 0."""

    def __init__(self, spec: DSparkSpec, target: Qwen3Target, max_len: int, confidence_cut: float = 0.0):
        super().__init__(spec, target, max_len)  # type: ignore[arg-type]  (same backbone fields)
        self.max_len, self.confidence_cut = max_len, float(confidence_cut)
        t = spec.tensors
        cast = lambda x: x.to(device=self.device, dtype=self.dtype)  # noqa: E731
        if "embed_tokens.weight" in t:
            self.embed = cast(t["embed_tokens.weight"])
        if "lm_head.weight" in t:
            self.head = cast(t["lm_head.weight"])
        r = spec.markov_rank
        self.w1 = cast(t["markov_head.markov_w1.weight"]) if r else None
        self.w2 = cast(t["markov_head.markov_w2.weight"]) if r else None
        self.proj = (cast(t["confidence_head.proj.weight"]), cast(t["confidence_head.proj.bias"])) \
            if spec.confidence else None

    def backbone(self, anchor: torch.Tensor) -> list[torch.Tensor]:
        """anchor [1] -> each draft layer's output over the block rows, n_layers x [B, H]."""
        s, b = self.ctx_len, self.b
        h = F.embedding(block_ids(anchor, self.spec.mask_token_id, b), self.embed)            # [1, B, H]
        cos, sin = self.cos[s:s + b], self.sin[s:s + b]
        allowed = self.block_allowed(s)                                                      # [B, cap + B]
        outs = []
        for i, w in enumerate(self.layers):
            def with_context(q, k, v, i=i):
                keys, vals = torch.cat([self.k_ctx[i], k], dim=2), torch.cat([self.v_ctx[i], v], dim=2)
                return attend(q, keys, vals, allowed)
            h = decoder_layer(h, w, self.shape, cos, sin, with_context)
            outs.append(h[0])
        return outs

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, H] (last layer) -> hn [B, H]; row k predicts the token at s+k+1."""
        return rms_norm(h, self.norm, self.shape.rms_eps)

    def decode(self, hn: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return markov_decode(F.linear(hn, self.head), anchor, self.w1, self.w2)

    def confidence_logits(self, hn: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        if self.proj is None:
            return None
        e = F.embedding(prev, self.w1) if self.w1 is not None else hn[:, :0]
        return F.linear(torch.cat([hn, e], -1), *self.proj)[:, 0]

    def propose(self, anchor: int, detail: bool = False) -> DSparkProposal:
        a = torch.tensor([anchor], device=self.device)
        outs = self.backbone(a)
        hn = self.readout(outs[-1])
        logits, prev = self.decode(hn, a)
        z = self.confidence_logits(hn, prev)
        conf = torch.sigmoid(z.float()) if z is not None else None
        b = self.b
        read = torch.cat([logits.argmax(-1), keep_count(conf, self.confidence_cut, b, self.device).view(1)])
        got = read.tolist()                                   # the block's one read-back
        drafts, keep = got[:b], got[b]
        if not detail:
            return DSparkProposal(drafts[:keep])
        return DSparkProposal(drafts[:keep], logits, torch.stack(outs), drafts, prev, conf, z)


def teacher_prev(ids: torch.Tensor, greedy: torch.Tensor, anchors: torch.Tensor, b: int) -> torch.Tensor:
    """prev [N, A, B]: row 0 reads the anchor ids[s], row k >= 1 the target's greedy id at s+k-1."""
    pos = anchors[..., None] + torch.arange(-1, b - 1, device=ids.device)                # s-1 .. s+B-2
    n, a = anchors.shape
    prev = torch.gather(greedy, 1, pos.reshape(n, -1)).reshape(n, a, b)
    return torch.cat([torch.gather(ids, 1, anchors)[..., None], prev[..., 1:]], dim=-1)


def forward_train(dparams: Mapping[str, torch.Tensor], dspec: DSparkSpec, target_params: Mapping[str, torch.Tensor],
                  target_spec: ModelSpec, hidden: list[torch.Tensor], ids: torch.Tensor, anchors: torch.Tensor,
                  prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Differentiable: ids [N, T], anchors [N, A] (1 <= s, s+B-1 <= T-1) -> (logits [N, A, B, V],
    conf_logits [N, A, B] or None without a confidence head).

    Block a reads context positions < s_a and its own B rows, as at inference. The Markov inputs are
    teacher-forced: ``prev`` [N, A, B], by default ``teacher_prev`` with the target's greedy ids
    (argmax of its head over hidden[-1]), i.e. the ids a greedy verify accepts.
    """
    shape, b = dspec.layer, dspec.block_size
    n, t = ids.shape
    a = anchors.shape[1]
    t_head = target_params["model.embed_tokens.weight" if target_spec.tie_word_embeddings else "lm_head.weight"]
    if prev is None:
        with torch.no_grad():
            fin = rms_norm(hidden[-1], target_params["model.norm.weight"], target_spec.layer.rms_eps)
            prev = teacher_prev(ids, F.linear(fin, t_head).argmax(-1), anchors, b)
    cos_t, sin_t = rope_tables(shape.head_dim, shape.rope_theta, t + b, ids.device, shape.rope_scaling)
    u = context_features(hidden, dspec.target_layer_ids, dparams["fc.weight"], dparams["hidden_norm.weight"],
                         shape.rms_eps, target_params["model.norm.weight"], target_spec.layer.rms_eps)  # [N, T, H]
    block = block_ids(torch.gather(ids, 1, anchors), dspec.mask_token_id, b)             # [N, A, B]
    pos = (anchors[..., None] + torch.arange(b, device=ids.device)).reshape(n, a * b)   # [N, A*B]
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]
    ctx_ok = (torch.arange(t, device=ids.device)[None, None, :] < anchors[..., None]).repeat_interleave(b, dim=1)
    blk = torch.arange(a * b, device=ids.device) // b
    allowed = torch.cat([ctx_ok, (blk[:, None] == blk[None, :]).expand(n, -1, -1)], dim=-1)[:, None, None]
    embed = dparams.get("embed_tokens.weight", target_params["model.embed_tokens.weight"])
    h = F.embedding(block.reshape(n, a * b), embed)
    for i in range(dspec.num_layers):
        w = LayerWeights.gather(dparams, f"layers.{i}.")
        kc, vc = project_kv(u, w, shape, cos_t[:t], sin_t[:t])
        def with_context(q, k, v, kc=kc, vc=vc):
            return attend(q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), allowed)
        h = decoder_layer(h, w, shape, cos, sin, with_context)
    hn = rms_norm(h, dparams["norm.weight"], shape.rms_eps).view(n, a, b, -1)
    logits = F.linear(hn, dparams.get("lm_head.weight", t_head))
    e = hn[..., :0]
    if dspec.markov_rank:
        e = F.embedding(prev, dparams["markov_head.markov_w1.weight"])                  # [N, A, B, r]
        logits = logits + F.linear(e, dparams["markov_head.markov_w2.weight"])
    if not dspec.confidence:
        return logits, None
    z = F.linear(torch.cat([hn, e], -1), dparams["confidence_head.proj.weight"], dparams["confidence_head.proj.bias"])
    return logits, z[..., 0]
