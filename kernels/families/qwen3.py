"""Qwen3 on the device (torch, CPU or CUDA): the layer, a differentiable full forward, and the
target engine with a static KV cache that the speculative loop drives.

One layer (x [N, R, H], positions p):
    a = rms(h, input_layernorm)
    q = rms_head(a Wq^T, q_norm) -> rope     [N, nh, R, d]
    k = rms_head(a Wk^T, k_norm) -> rope     [N, nkv, R, d]      v = a Wv^T
    h = h + attend(q, K, V, mask) Wo^T
    h = h + swiglu(rms(h, post_attention_layernorm))
logits = rms(h, model.norm) head^T
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomery_cli.spec import LayerShape, ModelSpec

from ..ops.attention import attend
from ..ops.mlp import swiglu
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope, rope_tables

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LayerWeights:
    ln_in: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    ln_post: torch.Tensor
    wg: torch.Tensor
    wu: torch.Tensor
    wd: torch.Tensor

    @classmethod
    def gather(cls, t: Mapping[str, torch.Tensor], prefix: str, cast=lambda x: x) -> LayerWeights:
        """prefix e.g. 'model.layers.3.' (target) or 'layers.0.' (DFlash draft)."""
        a, m = prefix + "self_attn.", prefix + "mlp."
        return cls(
            cast(t[prefix + "input_layernorm.weight"]), cast(t[a + "q_proj.weight"]), cast(t[a + "k_proj.weight"]),
            cast(t[a + "v_proj.weight"]), cast(t[a + "o_proj.weight"]), cast(t[a + "q_norm.weight"]),
            cast(t[a + "k_norm.weight"]), cast(t[prefix + "post_attention_layernorm.weight"]),
            cast(t[m + "gate_proj.weight"]), cast(t[m + "up_proj.weight"]), cast(t[m + "down_proj.weight"]),
        )


def project_kv(a: torch.Tensor, w: LayerWeights, shape: LayerShape, cos: torch.Tensor, sin: torch.Tensor):
    """a [N, R, H] -> k, v [N, nkv, R, d] (k normed per head and rotated)."""
    n, r, _ = a.shape
    k = F.linear(a, w.wk).view(n, r, shape.num_kv_heads, shape.head_dim)
    v = F.linear(a, w.wv).view(n, r, shape.num_kv_heads, shape.head_dim)
    k = apply_rope(rms_norm(k, w.k_norm, shape.rms_eps).transpose(1, 2), cos, sin)
    return k, v.transpose(1, 2)


def project_q(a: torch.Tensor, w: LayerWeights, shape: LayerShape, cos: torch.Tensor, sin: torch.Tensor):
    """a [N, R, H] -> q [N, nh, R, d] (normed per head and rotated)."""
    n, r, _ = a.shape
    q = F.linear(a, w.wq).view(n, r, shape.num_heads, shape.head_dim)
    return apply_rope(rms_norm(q, w.q_norm, shape.rms_eps).transpose(1, 2), cos, sin)


def decoder_layer(h: torch.Tensor, w: LayerWeights, shape: LayerShape, cos: torch.Tensor, sin: torch.Tensor,
                  attend_kv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One layer over rows h [N, R, H]; ``attend_kv(q, k_rows, v_rows)`` owns where keys come from."""
    a = rms_norm(h, w.ln_in, shape.rms_eps)
    q = project_q(a, w, shape, cos, sin)
    k, v = project_kv(a, w, shape, cos, sin)
    h = h + F.linear(attend_kv(q, k, v), w.wo)
    return h + swiglu(rms_norm(h, w.ln_post, shape.rms_eps), w.wg, w.wu, w.wd)


def layers_of(spec: ModelSpec, cast=lambda x: x) -> list[LayerWeights]:
    return [LayerWeights.gather(spec.tensors, f"model.layers.{i}.", cast) for i in range(spec.num_layers)]


def forward_train(params: Mapping[str, torch.Tensor], spec: ModelSpec, ids: torch.Tensor):
    """Differentiable full-sequence forward. ids [N, T] -> (logits [N, T, V], hidden: L+1 x [N, T, H]).

    hidden[0] is the embedding output, hidden[l+1] the output of layer l (before the final norm).
    """
    shape = spec.layer
    n, t = ids.shape
    cos, sin = rope_tables(shape.head_dim, shape.rope_theta, t, ids.device)
    g = shape.num_heads // shape.num_kv_heads

    def causal(q, k, v):
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)
        return o.transpose(1, 2).reshape(n, t, -1)

    h = F.embedding(ids, params["model.embed_tokens.weight"])
    hidden = [h]
    for i in range(spec.num_layers):
        h = decoder_layer(h, LayerWeights.gather(params, f"model.layers.{i}."), shape, cos, sin, causal)
        hidden.append(h)
    head = params["model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"]
    logits = F.linear(rms_norm(h, params["model.norm.weight"], shape.rms_eps), head)
    return logits, hidden


@dataclass
class Pass:
    """What one target pass returns: argmax ids per real row (read back once), the layer taps
    [L+1, R, H] on the device (taps[0] = embeddings), and the logits [R, V] when asked."""

    argmax: list[int]
    taps: torch.Tensor
    logits: torch.Tensor | None = None


class Qwen3Target:
    """The target engine: a static KV cache [L, nkv, cap, d], prefill / verify / commit.

    Every verify runs exactly ``rows`` rows when ``rows`` is set (short passes are padded), so each
    matrix product has the same shape in the plain and the drafted run: a row's numbers then do not
    depend on how many rows shared its pass. Padding rows sit after the real rows, so the causal
    mask keeps them out of every real row; their KV slots are overwritten by the next pass.
    """

    def __init__(self, spec: ModelSpec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None):
        self.spec, self.shape = spec, spec.layer
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        cast = lambda x: x.to(device=self.device, dtype=dtype)  # noqa: E731
        self.layers = layers_of(spec, cast)
        self.embed = cast(spec.tensors["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight())
        self.final_norm = cast(spec.tensors["model.norm.weight"])
        self.cap = max_len + (rows or 0)
        s = self.shape
        self.cos, self.sin = rope_tables(s.head_dim, s.rope_theta, self.cap, self.device)
        kv = (spec.num_layers, 1, s.num_kv_heads, self.cap, s.head_dim)
        self.k_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.v_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.key_pos = torch.arange(self.cap, device=self.device)
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def prefill(self, ids: list[int], logits: bool = False) -> Pass:
        """Run the prompt from position 0 and commit it whole."""
        self.length = 0
        out = self._run(ids, logits)
        self.commit(len(ids))
        return out

    def verify(self, ids: list[int], logits: bool = False) -> Pass:
        """Run rows ids at positions length..length+R-1 (KV written, nothing committed)."""
        real = len(ids)
        padded = ids + [0] * (self.rows - real) if self.rows and real < self.rows else ids
        out = self._run(padded, logits)
        out.argmax, out.taps = out.argmax[:real], out.taps[:, :real]
        out.logits = out.logits[:real] if out.logits is not None else None
        return out

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last verify; later KV slots are dead (masked by position)."""
        self.length += kept

    def _run(self, ids: list[int], want_logits: bool) -> Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {p0 + r})")
        pos = torch.arange(p0, p0 + r, device=self.device)
        cos, sin = self.cos[p0:p0 + r], self.sin[p0:p0 + r]
        allowed = self.key_pos[None, :] <= pos[:, None]                                  # [R, cap]
        h = F.embedding(torch.tensor([ids], device=self.device), self.embed)             # [1, R, H]
        taps = [h[0]]
        for i, w in enumerate(self.layers):
            def cached(q, k, v, i=i):
                self.k_cache[i, :, :, p0:p0 + r] = k
                self.v_cache[i, :, :, p0:p0 + r] = v
                return attend(q, self.k_cache[i], self.v_cache[i], allowed)
            h = decoder_layer(h, w, self.shape, cos, sin, cached)
            taps.append(h[0])
        logits = F.linear(rms_norm(h[0], self.final_norm, self.shape.rms_eps), self.head)
        return Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None)
