"""DeepSeek V4.1 ("deepseek41") trunk on the device (torch, CPU or CUDA): the V4.1 deltas over
``kernels.families.deepseek4.model`` (docs/V41.md), written out in ``reference.families.deepseek41.model``: the
lagged hyper-connection mixes and the LastMix collapse (``kernels.ops.mhc_lagged``), no per-head q norm, on
window-only layers; V4's attention, routing and MoE (MXFP4 experts included) are the deepseek4 engine's.

Rows [R, ...] (one sequence). A layer's state is (streams x [R, S, H], lag [R, S] float32); the taps are its packed
form [L+1, R, S+1, H] in the run dtype (``pack_lag``), and the lag travels between layers in that tap (rounded to
the run dtype at each layer boundary, as the reference's ``pack_lag`` stores it). ``final`` [R, H] =
norm(last_mix(x, lag)): no ``model.hc_head.*``. The caches, commit and passes are the deepseek4 engine's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek41Spec

from ...ops import mhc_lagged as klag
from ...ops import v4_attention as kv4
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..deepseek4.model import F32_SUFFIXES, Deepseek4Target, P, attn_weights, ffn, layer_rope
from ..qwen38.model import Qwen38Pass

T = torch.Tensor


class Deepseek41Target(Deepseek4Target):
    """The V4.1 target engine: prefill / verify / commit / kv_rows as deepseek4's; passes are ``Qwen38Pass`` with
    taps [L+1, R, S+1, H] (module docstring) and ``final`` [R, H] = norm(last_mix(streams, lag))."""

    def __init__(self, spec: Deepseek41Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        if (spec.hc_mix, spec.collapse) != ("lagged", "last_mix") or set(spec.layer_types) != {"sliding"}:
            raise ValueError("deepseek41 runs lagged mixes + LastMix on window-only layers only (docs/V41.md 10)")
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
        self.final_norm = self.final_w
        self.tap_width = (spec.hc.count + 1) * spec.hidden_size      # a tap row: the S streams and the lag row
        self.cap = max_len + (rows or 0)
        a = spec.attn
        self.cache = {l: kv4.V4Cache.empty(self.cap, k, a.head_dim, a.index_head_dim, self.device, dtype)
                      for l, k in enumerate(spec.layer_types)}
        self.routings: dict[int, Routing] = {}
        self.chosen: dict[int, T] = {}
        self.length = 0
        self.rows_run = 0
        self._ran: int | None = None

    def _attention(self, l: int, a: T, p0: int) -> T:
        s = self.spec.attn
        return kv4.v4_attention(a, attn_weights(self.spec, self.t, l), "sliding", s.num_heads, s.window,
                                layer_rope(self.spec, l), self.shape.rms_eps, groups=s.o_groups, p0=p0,
                                cache=self.cache[l], q_head_norm=self.spec.q_head_norm)[0]

    def layer(self, l: int, state: T, tok: T, p0: int) -> T:
        """Layer l: state [R, S+1, H] -> the next (attention, then MoE, each a lagged sublayer)."""
        spec, eps, t, p = self.spec, self.shape.rms_eps, self.t, f"layers.{l}."
        hc = spec.hc
        x, lag = klag.unpack_lag(state)
        x, pre = klag.lagged_sublayer(x, lag, t[p + "attn_hc.fn"], t[p + "attn_hc.base"], t[p + "attn_hc.scale"],
                                      hc.sinkhorn_iters, hc.eps, eps,
                                      lambda a: self._attention(l, rms_norm(a, t[p + "input_layernorm.weight"], eps),
                                                                p0))
        x, lag = klag.lagged_sublayer(x, pre, t[p + "ffn_hc.fn"], t[p + "ffn_hc.base"], t[p + "ffn_hc.scale"],
                                      hc.sinkhorn_iters, hc.eps, eps,
                                      lambda b: ffn(spec, t, l, rms_norm(b, t[p + "post_attention_layernorm.weight"],
                                                                         eps), tok, self.routings))
        return klag.pack_lag(x, lag)

    def _run(self, ids: list[int], want_logits: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"cache of {self.cap} positions is full (pass ends at {p0 + r})")
        spec, eps = self.spec, self.shape.rms_eps
        tok = torch.tensor(ids, device=self.device)
        e = F.embedding(tok, self.embed)                                                    # [R, H]
        x = e[:, None, :].expand(r, spec.hc.count, -1).contiguous()                         # [R, S, H]
        state = klag.pack_lag(x, klag.lag_init(x))
        taps = [state]
        for l in range(spec.num_layers):
            state = self.layer(l, state, tok, p0)
            taps.append(state)
        self._ran = r
        self.rows_run += r
        x, lag = klag.unpack_lag(state)
        final = rms_norm(klag.last_mix(x, lag), self.final_w, eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final,
                          dict(self.routings))
