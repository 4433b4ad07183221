"""MiMo-V2-Flash ("mimo2") on the device (torch, CPU or CUDA): its layers, a differentiable full forward, and the
target engine the speculative loop drives. The math is written out in ``reference.families.mimo2.model``; rows x are
[N, R, H], norms plain RMSNorm (gain w).

Engine state: per layer a static KV cache, k [nkv_l, cap, d] and v [nkv_l, cap, dv] (the layer kind's own kv heads:
SWA layers have twice the full layers'), cut by position as qwen3's: rows past the commit point are masked out and
overwritten by the next pass. An SWA layer keeps every position too; its window is a mask on the reads
(key position > query position - W), so a rollback never needs a row the window dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from bloomery_gates.spec import AttnShape, Mimo2Spec

from ...ops.attention import sink_attention, window_mask
from ...ops.mlp import swiglu
from ...ops.moe import Routing, routed_experts
from ...ops.norm import rms_norm
from ...ops.rope import partial_rope, rope_tables
from ..ffn import route
from ..qwen38.model import Qwen38Pass
from ..rows import RowPasses

T = torch.Tensor
AttendKV = Callable[[T, T, T, T | None], T]     # (q, k, v, sinks) -> [N, R, nh dv]


def attention_mixer(a_shape: AttnShape, value_scale: float, t: Mapping[str, T], p: str, a: T, cos: T, sin: T,
                    attend_kv: AttendKV) -> T:
    """One attention sublayer on normed rows a [N, R, H] -> [N, R, H]; ``attend_kv(q, k, v, sinks)`` with q/k
    [N, heads, R, d] (after RoPE) and v [N, nkv, R, dv] (after the value scale) owns where keys come from."""
    n, r, _ = a.shape
    nh, nkv, d, dv = a_shape.num_heads, a_shape.num_kv_heads, a_shape.head_dim, a_shape.v_head_dim
    q = partial_rope(F.linear(a, t[p + "q_proj.weight"]).view(n, r, nh, d).transpose(1, 2), cos, sin)
    k = partial_rope(F.linear(a, t[p + "k_proj.weight"]).view(n, r, nkv, d).transpose(1, 2), cos, sin)
    v = (F.linear(a, t[p + "v_proj.weight"]).view(n, r, nkv, dv) * value_scale).transpose(1, 2)
    sinks = t[p + "attention_sink_bias"] if a_shape.sinks else None
    return F.linear(attend_kv(q, k, v, sinks), t[p + "o_proj.weight"])


def fused_experts(t: Mapping[str, T], p: str, experts: int) -> tuple[T, T]:
    """(gate_up [E, 2F, H], down [E, H, F]) of the experts under ``p`` ("model.layers.{l}.mlp."): the engine's
    fused copies when present, else stacked from the checkpoint's per-expert tensors (differentiable)."""
    if p + "experts.gate_up_proj" in t:
        return t[p + "experts.gate_up_proj"], t[p + "experts.down_proj"]
    e = [f"{p}experts.{i}." for i in range(experts)]
    gate_up = torch.stack([torch.cat([t[x + "gate_proj.weight"], t[x + "up_proj.weight"]]) for x in e])
    return gate_up, torch.stack([t[x + "down_proj.weight"] for x in e])


def ffn(spec: Mimo2Spec, t: Mapping[str, T], l: int, x: T, routings: dict | None = None) -> T:
    """Layer l's MLP on normed rows x [N, R, H]: dense SwiGLU, or the routed experts (no shared expert); a sparse
    layer's routing goes to ``routings[l]`` when given (the gate's tier-1 check reads it)."""
    p = f"model.layers.{l}.mlp."
    if spec.mimo.mlp_types[l] == "dense":
        return swiglu(x, t[p + "gate_proj.weight"], t[p + "up_proj.weight"], t[p + "down_proj.weight"])
    flat = x.reshape(-1, x.shape[-1])
    routing = route(spec.mimo.moe, t, p, flat)          # the shared router (ffn.route: sigmoid, bias, groups)
    if routings is not None:
        routings[l] = routing
    gate_up, down = fused_experts(t, p, spec.mimo.moe.num_experts)
    return routed_experts(flat, routing, gate_up, down).view(x.shape)


def layer(spec: Mimo2Spec, t: Mapping[str, T], l: int, h: T, cos: T, sin: T, attend_kv: AttendKV,
          routings: dict | None = None) -> T:
    """Decoder layer l on rows h [N, R, H] (cos/sin: the layer kind's tables at the rows' positions)."""
    p, eps, m = f"model.layers.{l}.", spec.layer.rms_eps, spec.mimo
    a = rms_norm(h, t[p + "input_layernorm.weight"], eps)
    h = h + attention_mixer(m.attn(l), m.value_scale, t, p + "self_attn.", a, cos, sin, attend_kv)
    return h + ffn(spec, t, l, rms_norm(h, t[p + "post_attention_layernorm.weight"], eps), routings)


def tables(a_shape: AttnShape, length: int, device) -> tuple[T, T]:
    return rope_tables(a_shape.rotary_dim, a_shape.rope_theta, length, device)


def forward_train(params: Mapping[str, T], spec: Mimo2Spec, ids: T) -> tuple[T, list[T]]:
    """Differentiable full-sequence forward. ids [N, T] -> (logits [N, T, V], hidden: L+1 x [N, T, H]; hidden[0]
    the embeddings, hidden[l+1] layer l's output before the final norm)."""
    n, tl = ids.shape
    pos = torch.arange(tl, device=ids.device)
    rope = {kind: tables(spec.mimo.attn(spec.mimo.layer_types.index(kind)), tl, ids.device)
            for kind in set(spec.mimo.layer_types)}
    h = F.embedding(ids, params["model.embed_tokens.weight"])
    hidden = [h]
    for l in range(spec.num_layers):
        a_shape = spec.mimo.attn(l)
        allowed = window_mask(pos, pos, a_shape.window)
        h = layer(spec, params, l, h, *rope[spec.mimo.layer_types[l]],
                  lambda q, k, v, z, allowed=allowed: sink_attention(q, k, v, allowed, z))
        hidden.append(h)
    head = params["model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"]
    return F.linear(rms_norm(h, params["model.norm.weight"], spec.layer.rms_eps), head), hidden


class Mimo2Target(RowPasses):
    """The target engine: prefill / verify / commit with Qwen3Target's API; passes are ``Qwen38Pass`` (``final``:
    the post-final-norm rows, what an MTP head reads). Every verify runs exactly ``rows`` rows when set (short
    passes padded at the end), so plain and drafted runs have equal shapes."""

    def __init__(self, spec: Mimo2Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        self.spec, self.shape, self.mimo = spec, spec.layer, spec.mimo
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        cast = lambda x: x.to(device=self.device, dtype=dtype)  # noqa: E731
        self.t = {n: cast(x) for n, x in spec.tensors.items() if n.startswith("model.layers.") and
                  ".mlp.experts." not in n and ".mlp.gate." not in n}
        for l in range(spec.num_layers):       # experts fused once; the router kept float32 (HF keeps it so)
            if self.mimo.mlp_types[l] == "sparse":
                p = f"model.layers.{l}.mlp."
                gu, dn = fused_experts(spec.tensors, p, self.mimo.moe.num_experts)
                self.t[p + "experts.gate_up_proj"], self.t[p + "experts.down_proj"] = cast(gu), cast(dn)
                for n in ("gate.weight", "gate.e_score_correction_bias"):
                    self.t[p + n] = spec.tensors[p + n].float().to(self.device)
        self.routings: dict[int, Routing] = {}        # the last pass's routing per sparse layer
        self.embed = cast(spec.tensors["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight())
        self.final_norm = spec.tensors["model.norm.weight"].float().to(self.device)
        self.cap = max_len + (rows or 0)
        self.rope = {kind: tables(self.mimo.attn(self.mimo.layer_types.index(kind)), self.cap, self.device)
                     for kind in set(self.mimo.layer_types)}
        self.k_cache, self.v_cache = [], []
        for l in range(spec.num_layers):
            a = self.mimo.attn(l)
            self.k_cache.append(torch.zeros(1, a.num_kv_heads, self.cap, a.head_dim, device=self.device, dtype=dtype))
            self.v_cache.append(torch.zeros(1, a.num_kv_heads, self.cap, a.v_head_dim, device=self.device,
                                            dtype=dtype))
        self.key_pos = torch.arange(self.cap, device=self.device)
        self.length = 0
        self.rows_run = 0
        self._pending = False

    def reset(self) -> None:
        self.length = 0
        self._pending = False

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last pass (KV by position: nothing else to restore)."""
        if not self._pending:
            raise RuntimeError("commit without a pass to commit")
        self.length += kept
        self._pending = False

    def kv_rows(self, layer: int) -> tuple[T, T]:
        """Read-only views of layer ``layer``'s committed rows, positions 0..length-1, as stored: (k after RoPE
        [nkv, length, d], v after the value scale [nkv, length, dv])."""
        return self.k_cache[layer][0, :, :self.length], self.v_cache[layer][0, :, :self.length]

    def _run(self, ids: list[int], want_logits: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {p0 + r})")
        pos = torch.arange(p0, p0 + r, device=self.device)
        h = F.embedding(torch.tensor([ids], device=self.device), self.embed)
        taps = [h[0]]
        for l in range(self.spec.num_layers):
            allowed = window_mask(pos, self.key_pos, self.mimo.attn(l).window)

            def cached(q, k, v, z, l=l, allowed=allowed):
                self.k_cache[l][:, :, p0:p0 + r] = k
                self.v_cache[l][:, :, p0:p0 + r] = v
                return sink_attention(q, self.k_cache[l], self.v_cache[l], allowed, z)

            cos, sin = self.rope[self.mimo.layer_types[l]]
            h = layer(self.spec, self.t, l, h, cos[p0:p0 + r], sin[p0:p0 + r], cached, self.routings)
            taps.append(h[0])
        self._pending = True
        self.rows_run += r
        final = rms_norm(h[0], self.final_norm, self.shape.rms_eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final,
                          routing=dict(self.routings))
