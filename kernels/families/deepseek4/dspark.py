"""llama.cpp's DSV4 DSpark block draft (GGUF arch "dflash", docs/FAMILIES_MOE.md 5.1) on the device (torch, CPU or
CUDA); the math is in ``reference.families.deepseek4.dspark`` (name for name). Rows are one block of B, the
residual is S streams [B, S, H]; ``spec`` is a ``Deepseek4DSparkSpec`` (its tensors under the names below).

    feat_p = concat_l mhc_head(taps[l + 1][p, :S])  for l in target_layer_ids  the hc-stream MEAN entering l + 1
             (``target_streams``: a deepseek41 tap [S+1, H] carries the lag row last; it is dropped)
    u_p    = rms(fc(feat_p), enc_norm)                                                                  [H]
    ctx_i[p] = rope(rms(u_p Wkv_i^T, kv_norm_i), p)     stage i's context K = V, kept per position     [d]
    x      = E([x_s, m x (B-1)]) as S copies at positions s..s+B-1                                  [B, S, H]
    stage i: STAGE[spec.hc_mix]: "own" the trunk's mHC block (``model.hc_block``); "lagged" (V4.1, 5.2) two
             ``mhc_lagged.lagged_sublayer``s on the packed state [B, S+1, H] (the fold by the previous sublayer's
             pre, the first one-hot; ``streams_in`` packs lag_0). Attention = ``window_attention`` (keys: ctx_i[j]
             for j < s and the block's own K = V, each with p_q - p_k < W; block keys ahead of the query are
             seen: llama.cpp runs the block non-causally; the per-head q norm iff spec.q_head_norm), MoE =
             sqrt-softplus + bias top-k + the shared expert
    g      = COLLAPSE[spec.collapse](x)     "hc_head": V4's trained hyper_head(x; hc_head)             [B, H]
                                            "last_mix": sum_s lag[s] x[s] (V4.1: the last FFN's pre)
    logits = markov_decode(rms(g, norm) head^T, anchor)       serial greedy chain, prev_0 = the anchor  [B, V]
    conf_k = sigmoid(proj . [g_k ; W1[prev_k]] + b)           the PRE-norm collapse (llama.cpp's t_embd); b = 0
                                                              when the file has none (the V4.1 DSpark's conf_proj)

State: the context K = V of every stage [n_layers, cap, d] by position (prompt / accept write the kept rows); the
block's own K = V is transient (never stored), so a rejected draft leaves nothing to roll back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek4DSparkSpec

from ...drafts.dflash import block_ids
from ...drafts.dspark import DSparkProposal, keep_count, markov_decode
from ...ops import mhc as kmhc
from ...ops import mhc_lagged as klag
from ...ops import v4_attention as kv4
from ...ops.attention import sink_attention
from ...ops.norm import rms_norm
from .model import F32_SUFFIXES, attn_weights_at, ffn_at, hc_block, route_at

T = torch.Tensor
W1, W2 = "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"
PROJ, PROJ_B = "confidence_head.proj.weight", "confidence_head.proj.bias"


def hc_head_collapse(spec: Deepseek4DSparkSpec, t: Mapping[str, T], x: T) -> T:
    """V4's trained HC head: x [N, S, H] -> [N, H]."""
    return kmhc.hyper_head(x, t["hc_head.hc_fn"], t["hc_head.hc_base"], t["hc_head.hc_scale"], spec.hc.eps,
                           spec.layer.rms_eps)


def last_mix_collapse(spec: Deepseek4DSparkSpec, t: Mapping[str, T], x: T) -> T:
    """V4.1's LastMix: the packed state x [N, S+1, H] -> sum_s lag[s] x[s] [N, H] (no trained head)."""
    return klag.last_mix(*klag.unpack_lag(x))


COLLAPSE: dict[str, Callable[[Deepseek4DSparkSpec, Mapping[str, T], T], T]] = {"hc_head": hc_head_collapse,
                                                                                "last_mix": last_mix_collapse}


def target_streams(taps: T, streams: int) -> T:
    """taps [L+1, R, S (+1), H] -> the S hc streams [L+1, R, S, H] (a deepseek41 tap's lag row dropped)."""
    return taps[:, :, :streams]


def features(taps: T | Sequence[T], layer_ids: Sequence[int]) -> T:
    """taps [L+1, R, S, H] (taps[l] the streams entering layer l) -> [R, n H]: the stream means entering l + 1."""
    return torch.cat([kmhc.mhc_head(taps[l + 1]) for l in layer_ids], dim=-1)


def encode(t: Mapping[str, T], feats: T, eps: float) -> T:
    """u [..., H] = rms(fc(feats), enc_norm)."""
    return rms_norm(F.linear(feats, t["fc.weight"]), t["enc_norm.weight"], eps)


def rope_of(spec: Deepseek4DSparkSpec) -> kv4.Rope:
    return kv4.Rope(spec.attn.rope_theta, spec.attn.rope_dim)


def context_kv(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int, u: T, pos: T) -> T:
    """Stage i's context K = V rows [R, d] of u [R, H] at positions pos [R]."""
    aw = attn_weights_at(t, f"layers.{i}.self_attn.", "sliding")
    return kv4.tail_rope(kv4.kv_rows(u, aw, spec.layer.rms_eps), pos, rope_of(spec))


def window_allowed(pos_q: T, pos_k: T, key_ok: T, window: int) -> T:
    """[R, K]: key_ok[r, k] and pos_q[r] - pos_k[k] < W (llama.cpp's non-causal SWA: keys ahead are seen)."""
    return key_ok & ((pos_q[:, None] - pos_k[None, :]) < window)


def window_attention(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int, a: T, pos: T, ctx: T, ctx_pos: T,
                     ctx_ok: T, blk_ok: T) -> T:
    """Stage i's attention of normed rows a [R, H] at positions pos [R] over [ctx [C, d] ; the rows' own K = V]
    -> [R, H]; ctx_ok [R, C] / blk_ok [R, R] say which keys a row may read before the window rule."""
    s, eps, rope = spec.attn, spec.layer.rms_eps, rope_of(spec)
    aw = attn_weights_at(t, f"layers.{i}.self_attn.", "sliding")
    _, q = kv4.q_heads(a, aw, s.num_heads, eps, spec.q_head_norm)
    q = kv4.tail_rope(q, pos, rope)
    own = kv4.tail_rope(kv4.kv_rows(a, aw, eps), pos, rope)
    keys = torch.cat([ctx, own])[None, None]                                             # [1, 1, C + R, d]
    allowed = window_allowed(pos, torch.cat([ctx_pos, pos]), torch.cat([ctx_ok, blk_ok], 1), s.window)
    o = sink_attention(q.transpose(0, 1)[None], keys, keys, allowed, aw.sinks)[0]        # [R, nh d]
    o = kv4.tail_rope(o.view(a.shape[0], s.num_heads, -1), pos, rope, conjugate=True)
    return kv4.grouped_output(o.reshape(a.shape[0], -1), aw.o_a, aw.o_b, s.o_groups)


def moe_of(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int) -> Callable[[T], T]:
    """Stage i's MoE on normed rows b [R, H]: sqrt-softplus + bias top-k (never hashed) + the shared expert."""
    m = f"layers.{i}.mlp."

    def moe(b: T) -> T:
        none = torch.zeros(b.shape[0], dtype=torch.long, device=b.device)
        return ffn_at(spec, t, m, route_at(spec, t, m, "moe", b, none), b)
    return moe


def own_stage(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int, x: T, attend: Callable[[T], T]) -> T:
    """V4: stage i on streams x [R, S, H]: mHC attention sublayer ``attend`` then the sqrt-softplus MoE."""
    return hc_block(spec, t, f"layers.{i}.", x, attend, moe_of(spec, t, i))


def lagged_stage(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int, x: T, attend: Callable[[T], T]) -> T:
    """V4.1: stage i on the packed state x [R, S+1, H] (streams, lag): the attention sublayer folds by the lag in,
    the MoE sublayer by the attention's pre; returns the packed (streams, the MoE's pre) [R, S+1, H]."""
    p, hc, eps = f"layers.{i}.", spec.hc, spec.layer.rms_eps
    moe = moe_of(spec, t, i)
    y, lag = klag.unpack_lag(x)
    y, pre = klag.lagged_sublayer(y, lag, t[p + "attn_hc.fn"], t[p + "attn_hc.base"], t[p + "attn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda f: attend(rms_norm(f, t[p + "input_layernorm.weight"], eps)))
    y, lag = klag.lagged_sublayer(y, pre, t[p + "ffn_hc.fn"], t[p + "ffn_hc.base"], t[p + "ffn_hc.scale"],
                                  hc.sinkhorn_iters, hc.eps, eps,
                                  lambda f: moe(rms_norm(f, t[p + "post_attention_layernorm.weight"], eps)))
    return klag.pack_lag(y, lag)


STAGE: dict[str, Callable[[Deepseek4DSparkSpec, Mapping[str, T], int, T, Callable[[T], T]], T]] = {
    "own": own_stage, "lagged": lagged_stage}


def stage(spec: Deepseek4DSparkSpec, t: Mapping[str, T], i: int, x: T, attend: Callable[[T], T]) -> T:
    """Stage i of the spec's HC mix (``STAGE``): attention sublayer ``attend`` (normed rows) then the MoE."""
    return STAGE[spec.hc_mix](spec, t, i, x, attend)


def streams_in(spec: Deepseek4DSparkSpec, h: T) -> T:
    """The block's embedded rows h [R, H] -> S copies [R, S, H] ("own") or packed with lag_0 [R, S+1, H]."""
    x = h[:, None, :].expand(-1, spec.hc.count, -1)
    return klag.pack_lag(x, klag.lag_init(x)) if spec.hc_mix == "lagged" else x


def own_tensors(spec: Deepseek4DSparkSpec, device: torch.device, dtype: torch.dtype) -> dict[str, T]:
    """The draft's tensors on the device: the float32 ones as the trunk keeps them (norms, sinks, mHC / HC-head
    mixes, the router bias), the rest in the run dtype."""
    return {n: x.to(device=device, dtype=torch.float32 if n.endswith(F32_SUFFIXES) else dtype)
            for n, x in spec.tensors.items()}


@dataclass
class Readout:
    g: T            # [B, H] the collapse (pre-norm: the confidence head's input)
    hn: T           # [B, H] rms(g, norm)


class Deepseek4DSparkDraft:
    """Device DSV4 DSpark draft bound to a deepseek4 target engine (or a ``TargetView``): its embedding and head
    unless the file carries its own. ``propose`` returns up to B anchor-first drafts, cut by ``confidence_cut``."""

    def __init__(self, spec: Deepseek4DSparkSpec, target, max_len: int, confidence_cut: float = 0.0):
        self.b, self.confidence_cut = spec.block_size, float(confidence_cut)
        self.device, self.dtype = target.device, target.dtype
        self.t = own_tensors(spec, self.device, self.dtype)
        self.spec = replace(spec, tensors={})     # the shapes only: the host copies stay the caller's, not the engine's
        self.embed = self.t.get("embed_tokens.weight", target.embed)
        self.head = self.t.get("lm_head.weight", target.head)
        self.w1, self.w2 = (self.t[W1], self.t[W2]) if spec.markov_rank else (None, None)
        self.proj = (self.t[PROJ], self.t.get(PROJ_B)) if spec.confidence else None   # V4.1: no bias
        self.max_len, self.cap = max_len, max_len + spec.block_size + 2
        self.kv_ctx = torch.zeros(spec.num_layers, self.cap, spec.attn.head_dim, device=self.device,
                                  dtype=self.dtype)
        self.key_pos = torch.arange(self.cap, device=self.device)
        self.ctx_len = 0

    def extend(self, taps: T, p0: int) -> None:
        """Context K = V at positions p0.. from the target's taps [L+1, R, S, H]."""
        r = taps.shape[1]
        if p0 + r > self.cap:
            raise ValueError(f"draft context of {self.cap} positions is full (pass ends at {p0 + r})")
        u = encode(self.t, features(target_streams(taps, self.spec.hc.count), self.spec.target_layer_ids),
                   self.spec.layer.rms_eps)
        pos = torch.arange(p0, p0 + r, device=self.device)
        for i in range(self.spec.num_layers):
            self.kv_ctx[i, p0:p0 + r] = context_kv(self.spec, self.t, i, u, pos)
        self.ctx_len = p0 + r

    def prompt(self, taps: T) -> None:
        self.extend(taps, 0)

    def accept(self, kept: int, taps: T) -> None:
        """The verify kept ``kept`` rows starting at the last anchor's position."""
        self.extend(taps[:, :kept], self.ctx_len)

    def context_kv(self, layer: int) -> T:
        """A read-only view of stage ``layer``'s context K = V, positions 0..ctx_len-1 [ctx_len, d]."""
        return self.kv_ctx[layer, :self.ctx_len]

    def backbone(self, anchor: T) -> list[T]:
        """anchor [1] -> each stage's output streams, n_layers x [B, S, H]."""
        s, b, spec = self.ctx_len, self.b, self.spec
        if s + b > self.cap:
            raise ValueError(f"draft context of {self.cap} positions is full")
        h = F.embedding(block_ids(anchor, spec.mask_token_id, b)[0], self.embed)              # [B, H]
        x = streams_in(spec, h).contiguous()
        pos = torch.arange(s, s + b, device=self.device)
        ctx_ok = (self.key_pos < s)[None, :].expand(b, -1)
        blk_ok = torch.ones(b, b, dtype=torch.bool, device=self.device)
        outs = []
        for i in range(spec.num_layers):
            x = stage(spec, self.t, i, x, lambda a, i=i: window_attention(spec, self.t, i, a, pos, self.kv_ctx[i],
                                                                          self.key_pos, ctx_ok, blk_ok))
            outs.append(x)
        return outs

    def readout(self, x: T) -> Readout:
        g = COLLAPSE[self.spec.collapse](self.spec, self.t, x)
        return Readout(g, rms_norm(g, self.t["norm.weight"], self.spec.layer.rms_eps))

    def confidence_logits(self, g: T, prev: T) -> T | None:
        if self.proj is None:
            return None
        e = F.embedding(prev, self.w1) if self.w1 is not None else g[:, :0]
        return F.linear(torch.cat([g, e], -1), *self.proj)[:, 0]

    def propose(self, anchor: int, detail: bool = False) -> DSparkProposal:
        a = torch.tensor([anchor], device=self.device)
        outs = self.backbone(a)
        r = self.readout(outs[-1])
        logits, prev = markov_decode(F.linear(r.hn, self.head), a, self.w1, self.w2)
        z = self.confidence_logits(r.g, prev)
        conf = torch.sigmoid(z.float()) if z is not None else None
        read = torch.cat([logits.argmax(-1), keep_count(conf, self.confidence_cut, self.b, self.device).view(1)])
        got = read.tolist()                                   # the block's one read-back
        drafts, keep = got[:self.b], got[self.b]
        if not detail:
            return DSparkProposal(drafts[:keep])
        return DSparkProposal(drafts[:keep], logits, torch.stack(outs), drafts, prev, conf, z)


def forward_train(t: Mapping[str, T], spec: Deepseek4DSparkSpec, embed: T, head: T, feats: T, ids: T, anchors: T,
                  prev: T) -> tuple[T, T | None]:
    """Differentiable blocks of one sequence: feats [T, n H] (``features`` of its ``target_streams``), ids [T],
    anchors [A] (1 <= s <= T - B), prev [A, B] the teacher-forced Markov inputs -> (logits [A, B, V], conf_logits
    [A, B] or None). Block a reads context positions < s_a and its own B rows, as at inference."""
    b, n = spec.block_size, ids.shape[0]
    a = anchors.shape[0]
    u = encode(t, feats, spec.layer.rms_eps)
    ctx_pos = torch.arange(n, device=ids.device)
    pos = (anchors[:, None] + torch.arange(b, device=ids.device)).reshape(-1)                     # [A B]
    ctx_ok = (ctx_pos[None, :] < anchors[:, None]).repeat_interleave(b, dim=0)                   # [A B, T]
    blk = torch.arange(a * b, device=ids.device) // b
    blk_ok = blk[:, None] == blk[None, :]
    h = F.embedding(block_ids(ids[anchors], spec.mask_token_id, b).reshape(-1), embed)
    x = streams_in(spec, h)
    for i in range(spec.num_layers):
        ctx = context_kv(spec, t, i, u, ctx_pos)
        x = stage(spec, t, i, x, lambda q, i=i, ctx=ctx: window_attention(spec, t, i, q, pos, ctx, ctx_pos, ctx_ok,
                                                                           blk_ok))
    g = COLLAPSE[spec.collapse](spec, t, x)
    logits = F.linear(rms_norm(g, t["norm.weight"], spec.layer.rms_eps), head).view(a, b, -1)
    e = g[:, :0].view(a, b, 0)
    if spec.markov_rank:
        e = F.embedding(prev, t[W1])                                                              # [A, B, r]
        logits = logits + F.linear(e, t[W2])
    if not spec.confidence:
        return logits, None
    z = F.linear(torch.cat([g.view(a, b, -1), e], -1), t[PROJ], t.get(PROJ_B))
    return logits, z[..., 0]
