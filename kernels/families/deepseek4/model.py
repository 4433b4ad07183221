"""DeepSeek V4 ("deepseek4") trunk on the device (torch, CPU or CUDA): its layers and the target engine the
speculative loop drives. The math is written out in ``reference.families.deepseek4.model``; rows are [R, ...] (one
sequence), the residual is S streams x [R, S, H], norms RMSNorm with gain w.

Engine state, per layer (``kernels.ops.v4_attention.V4Cache``): the roped key = value head of every position
[cap, d] and, on CSA / HCA layers, the compressor's (and indexer's) projections the entries are pooled from; cut by
position as qwen3's KV: the window, the compressed entries a query may see and the indexer's choice read only
positions at or before the query, so rows past the commit point are never read by a committed row and are
overwritten by the next pass. ``commit(k)`` moves the length only.
The weights HF keeps in float32 (norms, sinks, position biases, mHC and HC-head mixes, the router bias) are held in
float32; everything else in the run dtype; ``tid2eid`` as int64. MXFP4 routed experts (``spec.experts_mxfp4``: the
reader hands their codes and ``_scale_inv`` scales over as uint8 bytes) stay packed on the device, 4.25 bits a
weight (``kernels.ops.mxfp4``): each pass gathers the chosen experts' tiles and decodes them in the run dtype right
before the batched product (``routed_experts_mxfp4``), never the whole tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek4Spec

from ...ops import mhc as kmhc
from ...ops import mxfp4 as kmx
from ...ops import router_v4 as krouter
from ...ops import v4_attention as kv4
from ...ops.moe import Routing, router_logits
from ...ops.norm import rms_norm
from ...ops.swiglu_clamp import routed_experts_clamped, swiglu_clamped
from ..ffn import note_routing
from ..qwen38.model import Qwen38Pass
from ..rows import RowPasses

T = torch.Tensor
P = "model."
F32_SUFFIXES = ("norm.weight", "sinks", "position_bias", "_hc.fn", "_hc.base", "_hc.scale", "hc_head.hc_fn",
                "hc_head.hc_base", "hc_head.hc_scale", "e_score_correction_bias")


def compressor_weights(t: Mapping[str, T], c: str) -> kv4.CompressorWeights:
    return kv4.CompressorWeights(kv=t[c + "kv_proj.weight"], gate=t[c + "gate_proj.weight"],
                                 bias=t[c + "position_bias"], norm=t[c + "kv_norm.weight"])


def attn_weights_at(t: Mapping[str, T], a: str, kind: str) -> kv4.V4AttnWeights:
    """The attention tensors under prefix ``a`` (``...self_attn.``) of a ``kind`` layer (its compressor and
    indexer by the kind); the trunk's layers and the MTP block share it."""
    comp = idx = None
    if kind != "sliding":
        comp = compressor_weights(t, a + "compressor.")
    if kind == "csa":
        i = a + "compressor.indexer."
        idx = kv4.IndexerWeights(compressor_weights(t, i), t[i + "q_b_proj.weight"],
                                 t[i + "scorer.weights_proj.weight"])
    return kv4.V4AttnWeights(
        q_a=t[a + "q_a_proj.weight"], q_a_norm=t[a + "q_a_norm.weight"], q_b=t[a + "q_b_proj.weight"],
        kv=t[a + "kv_proj.weight"], kv_norm=t[a + "kv_norm.weight"], o_a=t[a + "o_a_proj.weight"],
        o_b=t[a + "o_b_proj.weight"], sinks=t[a + "sinks"], comp=comp, indexer=idx)


def attn_weights(spec: Deepseek4Spec, t: Mapping[str, T], l: int) -> kv4.V4AttnWeights:
    return attn_weights_at(t, f"layers.{l}.self_attn.", spec.layer_types[l])


def layer_rope(spec: Deepseek4Spec, l: int) -> kv4.Rope:
    a = spec.attn
    if spec.layer_types[l] == "sliding":
        return kv4.Rope(a.rope_theta, a.rope_dim)
    return kv4.Rope(a.compress_theta, a.rope_dim, a.compress_scaling)


def route_at(spec: Deepseek4Spec, t: Mapping[str, T], m: str, kind: str, b: T, ids: T) -> Routing:
    """The routing of rows b [R, H] by the router under prefix ``m`` (``...mlp.``): the hash table on a "hash"
    layer, sqrt-softplus + bias top-k on a "moe" one."""
    g, scale = m + "gate.", spec.moe.routed_scale
    logits = router_logits(b, t[g + "weight"])
    if kind == "hash":
        return krouter.hash_route(logits, t[g + "tid2eid"], ids, scale)
    return krouter.sqrtsoftplus_topk(logits, t[g + "e_score_correction_bias"], spec.moe.top_k, scale)


def route(spec: Deepseek4Spec, t: Mapping[str, T], l: int, b: T, ids: T) -> Routing:
    """Layer l's routing of rows b [R, H]: the hash table on a hash layer, sqrt-softplus + bias top-k else."""
    return route_at(spec, t, f"layers.{l}.mlp.", spec.mlp_types[l], b, ids)


def ffn_at(spec: Deepseek4Spec, t: Mapping[str, T], m: str, routing: Routing, b: T) -> T:
    """The MoE under prefix ``m`` on normed rows b [R, H] with its routing: clamped routed experts + the ungated
    clamped shared expert."""
    note_routing(m.removesuffix("mlp."), routing)   # the experts used, inside ffn.record_routing (the gates)
    lim = spec.swiglu_limit
    gu, dn = t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"]
    if m + "experts.gate_up_proj_scale_inv" in t:                 # MXFP4: codes + e8m0 scales, decoded per chunk
        out = kmx.routed_experts_mxfp4(b, routing, kmx.Mxfp4(gu, t[m + "experts.gate_up_proj_scale_inv"]),
                                       kmx.Mxfp4(dn, t[m + "experts.down_proj_scale_inv"]), lim)
    else:
        out = routed_experts_clamped(b, routing, gu, dn, lim)
    s = m + "shared_experts."
    return out + swiglu_clamped(b, t[s + "gate_proj.weight"], t[s + "up_proj.weight"], t[s + "down_proj.weight"], lim)


def ffn(spec: Deepseek4Spec, t: Mapping[str, T], l: int, b: T, ids: T, routings: dict | None = None) -> T:
    """Layer l's MoE on normed rows b [R, H]: clamped routed experts + the ungated clamped shared expert."""
    routing = route(spec, t, l, b, ids)
    if routings is not None:
        routings[l] = routing
    return ffn_at(spec, t, f"layers.{l}.mlp.", routing, b)


def hc_block(spec: Deepseek4Spec, t: Mapping[str, T], p: str, x: T, attend: Callable[[T], T],
             moe: Callable[[T], T]) -> T:
    """One mHC block under prefix ``p`` on streams x [R, S, H]: the attention sublayer ``attend`` (normed rows
    [R, H] -> [R, H]) and the MoE sublayer ``moe``, each between its mHC collapse and expand -> x' [R, S, H]."""
    s, eps = spec.hc, spec.layer.rms_eps
    hw = kmhc.mhc_weights(x, t[p + "attn_hc.fn"], t[p + "attn_hc.base"], t[p + "attn_hc.scale"], s.sinkhorn_iters,
                          s.eps, eps)
    a = rms_norm(kmhc.mhc_collapse(x, hw.pre), t[p + "input_layernorm.weight"], eps)
    x = kmhc.mhc_expand(attend(a), x, hw.post, hw.comb)
    fw = kmhc.mhc_weights(x, t[p + "ffn_hc.fn"], t[p + "ffn_hc.base"], t[p + "ffn_hc.scale"], s.sinkhorn_iters,
                          s.eps, eps)
    b = rms_norm(kmhc.mhc_collapse(x, fw.pre), t[p + "post_attention_layernorm.weight"], eps)
    return kmhc.mhc_expand(moe(b), x, fw.post, fw.comb)


class Deepseek4Target(RowPasses):
    """The target engine: prefill / verify / commit / kv_rows as the other targets (module docstring for the
    state); passes are ``Qwen38Pass`` with taps [L+1, R, S, H] (the streams; taps[0] the S copies of the
    embedding) and ``final`` [R, H] = norm(hc_head(streams)), what the head reads. Every verify runs exactly
    ``rows`` rows when set (short passes padded at the end)."""

    def __init__(self, spec: Deepseek4Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        if spec.source_format not in ("hf", "gguf"):        # the GGUF reader hands over the HF names too
            raise ValueError(f"kernels.families.deepseek4 reads HF tensor names; source format "
                             f"{spec.source_format!r}")
        self._load_trunk(spec, device, dtype, rows)
        self.tap_width = spec.hc.count * spec.hidden_size      # a tap row is the S streams [S, H]
        self.hc_head = [spec.tensors[P + "hc_head." + k].float().to(self.device)
                        for k in ("hc_fn", "hc_base", "hc_scale")]
        self.cap = max_len + (rows or 0)
        a = spec.attn
        self.cache = {l: kv4.V4Cache.empty(self.cap, k, a.head_dim, a.index_head_dim, self.device, dtype)
                      for l, k in enumerate(spec.layer_types)}
        self.routings: dict[int, Routing] = {}        # the last pass's routing per layer
        self.chosen: dict[int, T] = {}                # the last pass's CSA indexer choice per CSA layer [R, k]
        self.length = 0
        self.rows_run = 0
        self._ran: int | None = None

    def _load_trunk(self, spec: Deepseek4Spec, device: str | torch.device, dtype: torch.dtype,
                    rows: int | None) -> None:
        """The trunk's layer tensors (``t``, by HF name less "model.": the F32 islands float32, MXFP4 codes uint8,
        other integers long, the rest ``dtype``), ``embed`` [V, H] and ``head`` [V, H] in ``dtype``, ``final_w`` [H]
        float32, on ``device``."""
        self.spec, self.shape = spec, spec.layer
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        self.t: dict[str, T] = {}
        for n, x in spec.tensors.items():
            if n.startswith(P + "layers.") and int(n[len(P) + 7:].split(".")[0]) < spec.num_layers:
                keep32 = torch.float32 if n.endswith(F32_SUFFIXES) else dtype
                dt = keep32 if x.is_floating_point() else x.dtype if x.dtype == torch.uint8 else torch.long
                self.t[n[len(P):]] = x.to(device=self.device, dtype=dt)
        self.embed = spec.tensors[P + "embed_tokens.weight"].to(device=self.device, dtype=dtype)
        self.head = spec.head_weight().to(device=self.device, dtype=dtype)
        self.final_w = spec.tensors[P + "norm.weight"].float().to(self.device)
        self.final_norm = self.final_w                 # the name ``parallel.draft_device.TargetView`` reads

    def reset(self) -> None:
        self.length = 0
        self._ran = None

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last pass (the caches are cut by position)."""
        if self._ran is None or not 0 < kept <= self._ran:
            raise ValueError(f"cannot commit {kept} rows of a {self._ran}-row pass")
        self.length += kept
        self._ran = None

    def kv_rows(self, layer: int) -> tuple[T, T]:
        """Read-only views of layer ``layer``'s committed rows: the roped K = V head [length, d] and (CSA / HCA)
        the compressor's projections [length, 2 c d] (k then z), else an empty [length, 0]."""
        c = self.cache[layer]
        kv = c.kv[:self.length]
        return kv, (torch.cat([c.k, c.z], 1)[:self.length] if c.k is not None else kv[:, :0])

    def _attention(self, l: int, a: T, p0: int) -> T:
        s, kind = self.spec.attn, self.spec.layer_types[l]
        rate = {"csa": s.csa_rate, "hca": s.hca_rate}.get(kind, 0)
        y, chosen = kv4.v4_attention(a, attn_weights(self.spec, self.t, l), kind, s.num_heads, s.window,
                                     layer_rope(self.spec, l), self.shape.rms_eps, rate, s.index_heads,
                                     s.index_topk, s.o_groups, p0, self.cache[l])
        if chosen is not None:
            self.chosen[l] = chosen
        return y

    def _run(self, ids: list[int], want_logits: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"cache of {self.cap} positions is full (pass ends at {p0 + r})")
        spec, eps = self.spec, self.shape.rms_eps
        tok = torch.tensor(ids, device=self.device)
        e = F.embedding(tok, self.embed)                                                    # [R, H]
        x = e[:, None, :].expand(r, spec.hc.count, -1).contiguous()                         # [R, S, H]
        taps = [x]
        for l in range(spec.num_layers):
            x = hc_block(spec, self.t, f"layers.{l}.", x, lambda a, l=l: self._attention(l, a, p0),
                         lambda b, l=l: ffn(spec, self.t, l, b, tok, self.routings))
            taps.append(x)
        self._ran = r
        self.rows_run += r
        final = rms_norm(kmhc.hyper_head(x, *self.hc_head, spec.hc.eps, eps), self.final_w, eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final,
                          dict(self.routings))
