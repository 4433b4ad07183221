"""GLM-5.3-Flash ("glm5next") trunk on the device (torch, CPU or CUDA): its layers and the target engine the
speculative loop drives. The math is written out in ``reference.families.glm5next.model``; rows are [R, ...] (one
sequence), the residual is S streams x [R, S, H], norms plain RMSNorm (gain w), NoPE throughout.

Engine state, per layer kind:
  indexed_attention (MLA + DSA)  the latent cache c [cap, kl] (what MLA keeps per token) and, on a "full" indexer
                    layer, the normed block inputs a [cap, H] the indexer's keys are made from; both cut by
                    position as qwen3's KV: rows past the commit point are never read (the DSA choice and its tail
                    are causal) and are overwritten by the next pass. Keys, values and the pooled indexer keys are
                    expanded from these rows on every pass (the non-absorbed form).
  linear_attention (KDA)  conv tail [K-1, 3C] (run dtype) and recurrent state [n, d, d] (float32). A prefill runs
                    the chunked form and commits its last state; a verify runs the sequential scan keeping the
                    state after every row, and ``commit(k)`` takes the state after row k-1 and the conv tail
                    buf[k : k+K-1]: exact by construction (row t reads only the state after row t-1).
The weights HF keeps in float32 (router weight and bias, mHC base and scale, KDA conv, dt_bias, A_log) are held in
float32; everything else in the run dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Glm5NextSpec

from ...ops import dsa as kdsa
from ...ops import kda as kkda
from ...ops import mhc as kmhc
from ...ops import mla as kmla
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ...ops.swiglu_clamp import routed_experts_clamped, swiglu_clamped
from ..ffn import route
from ..qwen38.model import Qwen38Pass
from ..rows import pad_rows, trim_rows

T = torch.Tensor
F32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "_hc.base", "_hc.scale", "conv1d.weight",
                "forget_gate.dt_bias", "forget_gate.A_log")


def text_prefix(spec: Glm5NextSpec) -> str:
    """``model.language_model.`` (the conditional-generation wrapper) or ``model.``."""
    for p in ("model.language_model.", "model."):         # a GGUF spec's reader renames to HF's "model."
        if p + "embed_tokens.weight" in spec.tensors:
            return p
    raise ValueError("kernels.families.glm5next reads HF tensor names; this spec has no "
                     "model[.language_model].embed_tokens")


def kda_weights(t: Mapping[str, T], a: str) -> kkda.KdaWeights:
    conv = t[a + "conv1d.weight"]
    return kkda.KdaWeights(
        q=t[a + "q_proj.weight"], k=t[a + "k_proj.weight"], v=t[a + "v_proj.weight"],
        conv=conv.reshape(conv.shape[0], conv.shape[-1]), f_a=t[a + "forget_gate.f_a_proj.weight"],
        f_b=t[a + "forget_gate.f_b_proj.weight"], dt_bias=t[a + "forget_gate.dt_bias"],
        a_log=t[a + "forget_gate.A_log"], b=t[a + "b_proj.weight"], g_a=t[a + "g_a_proj.weight"],
        g_b=t[a + "g_b_proj.weight"], norm=t[a + "o_norm.weight"], o=t[a + "o_proj.weight"])


def mla_weights(t: Mapping[str, T], a: str) -> kmla.MlaWeights:
    return kmla.MlaWeights(
        q_a=t[a + "q_a_proj.weight"], q_a_norm=t[a + "q_a_layernorm.weight"], q_b=t[a + "q_b_proj.weight"],
        kv_a=t[a + "kv_a_proj_with_mqa.weight"], kv_a_norm=t[a + "kv_a_layernorm.weight"],
        kv_b=t[a + "kv_b_proj.weight"], o=t[a + "o_proj.weight"])


def indexer_weights(t: Mapping[str, T], a: str) -> kdsa.IndexerWeights:
    i = a + "indexer."
    return kdsa.IndexerWeights(
        wq_b=t[i + "wq_b.weight"], wk=t[i + "wk.weight"], k_norm_w=t[i + "k_norm.weight"],
        k_norm_b=t[i + "k_norm.bias"], weights_proj=t[i + "weights_proj.weight"],
        gate=t[i + "index_kpool_compress_gate"], ape=t[i + "index_kpool_compress_ape"])


def mhc(spec: Glm5NextSpec, t: Mapping[str, T], p: str, x: T) -> kmhc.MhcWeights:
    """The mHC weights of one sublayer (``p`` ends in "attn_hc." or "ffn_hc."), float32."""
    return kmhc.mhc_weights(x, t[p + "fn"], t[p + "base"], t[p + "scale"], spec.hc.sinkhorn_iters, spec.hc.eps,
                            spec.layer.rms_eps)


def ffn(spec: Glm5NextSpec, t: Mapping[str, T], m: str, l: int, a: T, routings: dict | None = None) -> T:
    """Layer l's FFN on normed rows a [R, H] (tensors under ``m`` = p + "mlp."): clamped dense SwiGLU, or the R2
    router, clamped routed experts and the ungated clamped shared expert."""
    lim = spec.swiglu_limit
    if spec.mlp_types[l] == "dense":
        return swiglu_clamped(a, t[m + "gate_proj.weight"], t[m + "up_proj.weight"], t[m + "down_proj.weight"], lim)
    routing = route(spec.moe, t, m, a)
    if routings is not None:
        routings[l] = routing
    return moe(spec, t, m, a, routing)


def moe(spec: Glm5NextSpec, t: Mapping[str, T], m: str, a: T, routing: Routing) -> T:
    """The sparse FFN under ``m`` (a trunk layer's or the NextN layer's "mlp.") on normed rows a [R, H] with the
    router's choice ``routing``: clamped routed experts + the ungated clamped shared expert."""
    lim = spec.swiglu_limit
    out = routed_experts_clamped(a, routing, t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"], lim)
    if spec.moe.shared_ff is None:
        return out
    s = m + "shared_experts."
    return out + swiglu_clamped(a, t[s + "gate_proj.weight"], t[s + "up_proj.weight"], t[s + "down_proj.weight"],
                                lim)


@dataclass
class KdaPending:
    """What a pass leaves per KDA layer: the conv buffer [K-1+R, 3C] and the state after its last row (prefill,
    [n, d, d]) or after every row (verify, [R, n, d, d])."""

    buf: T
    states: T
    every_row: bool


class Glm5NextTarget:
    """The target engine: prefill / verify / commit / kv_rows / recurrent_state as the other targets (module
    docstring for the state); passes are ``Qwen38Pass`` with taps [L+1, R, S, H] (the streams; taps[0] the S
    copies of the embedding) and ``final`` [R, H] = norm(mean of the streams), what the head and a NextN layer
    read. Every verify runs exactly ``rows`` rows when set (short passes padded at the end)."""

    def __init__(self, spec: Glm5NextSpec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        self.spec, self.shape = spec, spec.layer
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        pre = text_prefix(spec)
        self.t: dict[str, T] = {}
        for n, x in spec.tensors.items():
            if n.startswith(pre + "layers.") and int(n[len(pre) + 7:].split(".")[0]) < spec.num_layers:
                keep32 = n.endswith(F32_SUFFIXES)
                self.t[n[len(pre):]] = x.to(device=self.device, dtype=torch.float32 if keep32 else dtype)
        self.embed = spec.tensors[pre + "embed_tokens.weight"].to(device=self.device, dtype=dtype)
        head = pre + "embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
        self.head = spec.tensors[head].to(device=self.device, dtype=dtype)
        self.final_norm = spec.tensors[pre + "norm.weight"].float().to(self.device)
        self.cap = max_len + (rows or 0)
        self.mla_layers = [l for l, k in enumerate(spec.layer_types) if k == "indexed_attention"]
        self.kda_layers = [l for l, k in enumerate(spec.layer_types) if k == "linear_attention"]
        self.full_layers = [l for l in self.mla_layers if spec.dsa.types[l] == "full"]
        z = lambda *s, dt=dtype: torch.zeros(*s, device=self.device, dtype=dt)  # noqa: E731
        self.latent = {l: z(self.cap, spec.mla.kv_lora_rank) for l in self.mla_layers}
        self.index_in = {l: z(self.cap, spec.hidden_size) for l in self.full_layers}
        c, k = spec.kda.num_heads * spec.kda.head_dim, spec.kda.conv_kernel
        self.conv_tail = {l: z(k - 1, 3 * c) for l in self.kda_layers}
        d = spec.kda.head_dim
        self.state = {l: z(spec.kda.num_heads, d, d, dt=torch.float32) for l in self.kda_layers}
        self.routings: dict[int, Routing] = {}        # the last pass's routing per sparse layer
        self.masks: dict[int, T] = {}                 # the last pass's DSA mask per full layer [R, length + R]
        self._pending: dict[int, KdaPending] | None = None
        self.length = 0
        self.rows_run = 0

    def reset(self) -> None:
        self.length = 0
        for l in self.kda_layers:
            self.conv_tail[l].zero_()
            self.state[l].zero_()
        self._pending = None

    def prefill(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Run the prompt from position 0 (fresh KDA tails and states) and commit it whole."""
        self.reset()
        out = self._run(ids, logits, verify=False)
        self.commit(len(ids))
        return out

    def verify(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Run rows ids at positions length..length+R-1 (caches written, every row's KDA state kept, nothing
        committed)."""
        return trim_rows(self._run(pad_rows(ids, self.rows), logits, verify=True), len(ids))

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last pass: caches by position; per KDA layer the conv tail
        buf[kept : kept+K-1] and the state after row kept-1."""
        if self._pending is None:
            raise RuntimeError("commit without a pass to commit")
        k = self.spec.kda.conv_kernel
        for l, pend in self._pending.items():
            rows = pend.buf.shape[0] - (k - 1)
            if not 0 < kept <= rows or (not pend.every_row and kept != rows):
                raise ValueError(f"cannot commit {kept} rows of a {rows}-row pass")
            self.state[l] = pend.states[kept - 1] if pend.every_row else pend.states
            self.conv_tail[l] = pend.buf[kept:kept + k - 1]
        self.length += kept
        self._pending = None

    def kv_rows(self, layer: int) -> tuple[T, T]:
        """Read-only views of MLA layer ``layer``'s committed rows, positions 0..length-1, as stored: the latent
        [length, kl] and (a full indexer layer) the normed block inputs [length, H], else an empty [length, 0]."""
        c = self.latent[layer][:self.length]
        return c, (self.index_in[layer][:self.length] if layer in self.index_in else c[:, :0])

    def recurrent_state(self, layer: int) -> tuple[T, T]:
        """Read-only views of KDA layer ``layer``'s committed conv tail [K-1, 3C] and state [n, d, d] (float32)."""
        return self.conv_tail[layer], self.state[layer]

    def _mixer(self, l: int, a: T, p0: int, verify: bool, mask: T | None,
               pending: dict[int, KdaPending]) -> tuple[T, T | None]:
        """Layer l's token mixer on normed rows a [R, H] at positions p0.. -> (out [R, H], the DSA mask used)."""
        spec, r, eps = self.spec, a.shape[0], self.shape.rms_eps
        s = f"layers.{l}.self_attn."
        if spec.layer_types[l] == "linear_attention":
            kd = spec.kda
            o = kkda.kda_attention(a, kda_weights(self.t, s), kd.num_heads, kd.lower_bound, eps, self.conv_tail[l],
                                   self.state[l], form="scan" if verify else "chunked", keep=verify)
            pending[l] = KdaPending(o.buf, o.state, verify)
            return o.out, None
        w, end = mla_weights(self.t, s), p0 + r
        self.latent[l][p0:end] = kmla.latent(a, w, eps)
        qr = kmla.q_resid(a, w, eps)
        if spec.dsa.types[l] == "full":
            self.index_in[l][p0:end] = a
            d = spec.dsa
            pos = torch.arange(p0, end, device=self.device)
            mask = kdsa.indexer(self.index_in[l][:end], a, qr, pos, indexer_weights(self.t, s), d.num_heads,
                                d.kpool, d.topk, d.select_tail).mask
            self.masks[l] = mask
        elif mask is None:
            raise ValueError(f"glm5next layer {l}: a shared indexer layer with no full layer before it")
        return kmla.mla_attention(qr, self.latent[l][:end], mask, w, spec.mla.num_heads,
                                  spec.mla.qk_nope_head_dim), mask

    def _run(self, ids: list[int], want_logits: bool, verify: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"cache of {self.cap} positions is full (pass ends at {p0 + r})")
        spec, eps = self.spec, self.shape.rms_eps
        e = F.embedding(torch.tensor(ids, device=self.device), self.embed)                 # [R, H]
        x = e[:, None, :].expand(r, spec.hc.count, -1).contiguous()                         # [R, S, H]
        taps, pending, mask = [x], {}, None
        for l in range(spec.num_layers):
            p = f"layers.{l}."
            hw = mhc(spec, self.t, p + "attn_hc.", x)
            a = rms_norm(kmhc.mhc_collapse(x, hw.pre), self.t[p + "input_layernorm.weight"], eps)
            y, used = self._mixer(l, a, p0, verify, mask, pending)
            mask = used if used is not None else mask
            x = kmhc.mhc_expand(y, x, hw.post, hw.comb)
            fw = mhc(spec, self.t, p + "ffn_hc.", x)
            b = rms_norm(kmhc.mhc_collapse(x, fw.pre), self.t[p + "post_attention_layernorm.weight"], eps)
            x = kmhc.mhc_expand(ffn(spec, self.t, p + "mlp.", l, b, self.routings), x, fw.post, fw.comb)
            taps.append(x)
        self._pending = pending
        self.rows_run += r
        final = rms_norm(kmhc.mhc_head(x), self.final_norm, eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final,
                          dict(self.routings))
