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

from bloomery_gates.spec import LayerShape, ModelSpec

from ...chain import ChainBufs, decode_plain
from ...dispatch import decode_ops
from ...graphs import GraphSet, Staged, rows_pad
from ...ops.attention import attend
from ...ops.mlp import swiglu
from ...ops.norm import rms_norm
from ...ops.rope import apply_rope, rope_tables
from ..rows import RowPasses

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


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def decoder_layer(h: torch.Tensor, w: LayerWeights, shape: LayerShape, cos: torch.Tensor, sin: torch.Tensor,
                  attend_kv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                  reduce_o: Callable[[torch.Tensor], torch.Tensor] = _same,
                  reduce_mlp: Callable[[torch.Tensor], torch.Tensor] = _same) -> torch.Tensor:
    """One layer over rows h [N, R, H]; ``attend_kv(q, k_rows, v_rows)`` owns where keys come from. A layer split
    over ranks (``qwen3_tp``) holds a slice of the heads and of the MLP: ``reduce_o`` / ``reduce_mlp`` sum the
    o_proj and down_proj partials across ranks (one process: the identity)."""
    a = rms_norm(h, w.ln_in, shape.rms_eps)
    q = project_q(a, w, shape, cos, sin)
    k, v = project_kv(a, w, shape, cos, sin)
    h = h + reduce_o(F.linear(attend_kv(q, k, v), w.wo))
    return h + reduce_mlp(swiglu(rms_norm(h, w.ln_post, shape.rms_eps), w.wg, w.wu, w.wd))


def layers_of(spec: ModelSpec, cast=lambda x: x) -> list[LayerWeights]:
    return [LayerWeights.gather(spec.tensors, f"model.layers.{i}.", cast) for i in range(spec.num_layers)]


def forward_train(params: Mapping[str, torch.Tensor], spec: ModelSpec, ids: torch.Tensor):
    """Differentiable full-sequence forward. ids [N, T] -> (logits [N, T, V], hidden: L+1 x [N, T, H]).

    hidden[0] is the embedding output, hidden[l+1] the output of layer l (before the final norm).
    """
    shape = spec.layer
    n, t = ids.shape
    cos, sin = rope_tables(shape.head_dim, shape.rope_theta, t, ids.device, shape.rope_scaling)
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


@dataclass
class StaticCache:
    """The static KV cache [L, 1, nkv, cap, d] of a qwen3-style target, its RoPE tables and key positions."""

    cap: int
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    key_pos: torch.Tensor

    @classmethod
    def make(cls, shape: LayerShape, layers: int, cap: int, device: torch.device, dtype: torch.dtype) -> StaticCache:
        cos, sin = rope_tables(shape.head_dim, shape.rope_theta, cap, device, shape.rope_scaling)
        kv = (layers, 1, shape.num_kv_heads, cap, shape.head_dim)
        return cls(cap, cos, sin, torch.zeros(kv, device=device, dtype=dtype),
                   torch.zeros(kv, device=device, dtype=dtype), torch.arange(cap, device=device))


class Qwen3Target(RowPasses):
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
        c = StaticCache.make(self.shape, spec.num_layers, max_len + (rows or 0), self.device, dtype)
        self.cap, self.cos, self.sin, self.key_pos = c.cap, c.cos, c.sin, c.key_pos
        self.k_cache, self.v_cache = c.k_cache, c.v_cache
        self.length = 0

    def kv_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only views (never write through them) of layer ``layer``'s committed rows, positions 0..length-1,
        as stored: (k after k_norm and RoPE, v), each [nkv, length, d]."""
        return self.k_cache[layer, 0, :, :self.length], self.v_cache[layer, 0, :, :self.length]

    def _run(self, ids: list[int], want_logits: bool) -> Pass:
        taps = cached_layers(self, ids, self.length)
        logits = F.linear(rms_norm(taps[-1], self.final_norm, self.shape.rms_eps), self.head)
        return Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None)


def cached_layers(eng, ids: list[int], p0: int, reduce_o: Callable[[torch.Tensor], torch.Tensor] = _same,
                  reduce_mlp: Callable[[torch.Tensor], torch.Tensor] = _same) -> list[torch.Tensor]:
    """Rows ids at positions p0..p0+R-1 through ``eng``'s layers (``Qwen3Target``, or a rank's shard in
    ``qwen3.tp`` with its reduces), each layer's k / v written into its cache rows p0..p0+R-1 -> the taps
    [h_0 (the embedding), h_1, ..., h_L], each [R, H]."""
    r = len(ids)
    if p0 + r > eng.cap:
        raise ValueError(f"KV cache of {eng.cap} positions is full (pass ends at {p0 + r})")
    pos = torch.arange(p0, p0 + r, device=eng.device)
    cos, sin = eng.cos[p0:p0 + r], eng.sin[p0:p0 + r]
    allowed = eng.key_pos[None, :] <= pos[:, None]                                       # [R, cap]
    h = F.embedding(torch.tensor([ids], device=eng.device), eng.embed)                   # [1, R, H]
    taps = [h[0]]
    for i, w in enumerate(eng.layers):
        def cached(q, k, v, i=i):
            eng.k_cache[i, :, :, p0:p0 + r] = k
            eng.v_cache[i, :, :, p0:p0 + r] = v
            return attend(q, eng.k_cache[i], eng.v_cache[i], allowed)
        h = decoder_layer(h, w, eng.shape, cos, sin, cached, reduce_o, reduce_mlp)
        taps.append(h[0])
    return taps


# ------------------------------------------------------------------------------------ fast decode engine


@dataclass(frozen=True)
class FusedLayer:
    """One layer laid out for memory-bound decode: q/k/v and gate/up fused into one [out, in] matrix each
    (row views of one buffer when the checkpoint's tensors already sit that way), norm weights in f32."""

    ln_in: torch.Tensor       # [H] f32
    wqkv: torch.Tensor        # [(nh + 2 nkv) d, H]
    q_norm: torch.Tensor      # [d] f32
    k_norm: torch.Tensor      # [d] f32
    wo: torch.Tensor          # [H, nh d]
    ln_post: torch.Tensor     # [H] f32
    wgu: torch.Tensor         # [2 I, H]
    wd: torch.Tensor          # [H, I]

    @classmethod
    def of(cls, w: LayerWeights) -> FusedLayer:
        f32 = lambda x: x.float().contiguous()  # noqa: E731
        return cls(f32(w.ln_in), stack_rows(w.wq, w.wk, w.wv), f32(w.q_norm), f32(w.k_norm), w.wo.contiguous(),
                   f32(w.ln_post), stack_rows(w.wg, w.wu), w.wd.contiguous())


def stack_rows(*ts: torch.Tensor) -> torch.Tensor:
    """[sum of rows, in]: a view when the tensors are consecutive row blocks of one buffer, else a copy."""
    first = ts[0]
    esz, cols = first.element_size(), first.shape[1]
    base = first.untyped_storage().data_ptr()
    adjacent = all(t.is_contiguous() and t.shape[1] == cols and t.dtype == first.dtype and
                   t.untyped_storage().data_ptr() == base for t in ts) and all(
        b.data_ptr() == a.data_ptr() + a.numel() * esz for a, b in zip(ts, ts[1:], strict=False))
    if adjacent:
        rows = sum(t.shape[0] for t in ts)
        return first.as_strided((rows, cols), (cols, 1))
    return torch.cat(ts, 0).contiguous()


class FastQwen3Target:
    """Qwen3Target's interface (prefill / verify / commit, ``Pass`` out) for benches and serving: fused weights,
    fused ops (``kernels.dispatch.decode_ops``), KV cache [L, nkv, cap, d], and on CUDA each pass width captured
    once as a CUDA graph over static buffers (``graphs=True``); the only host sync of a pass is the argmax
    readback. ``tap_ids`` picks the taps a pass keeps (indices into L+1, 0 = embeddings; None = all);
    ``rows`` pads every verify to that many rows (as Qwen3Target does). The prompt runs eagerly."""

    def __init__(self, spec: ModelSpec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None, max_width: int = 16, tap_ids=None, graphs: bool = True,
                 impl: str = "auto"):
        self.spec, self.shape, self.rows = spec, spec.layer, rows
        self.device, self.dtype = torch.device(device), dtype
        self.ops = decode_ops(impl, self.device)
        cast = lambda x: x.to(device=self.device, dtype=dtype)  # noqa: E731
        self.layers = [FusedLayer.of(w) for w in layers_of(spec, cast)]
        self.embed = cast(spec.tensors["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight())
        self.final_norm = cast(spec.tensors["model.norm.weight"])
        self.final32 = self.final_norm.float()
        self.max_width = max(max_width, rows or 0)
        self.rp = rows_pad(self.max_width)           # every pass's projections pad to this: one kernel for all R
        self.cap = -(-(max_len + self.max_width) // 64) * 64
        s = self.shape
        self.cos, self.sin = rope_tables(s.head_dim, s.rope_theta, self.cap, self.device, s.rope_scaling)
        kv = (spec.num_layers, s.num_kv_heads, self.cap, s.head_dim)
        self.k_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.v_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.tap_ids = tuple(range(spec.num_layers + 1)) if tap_ids is None else tuple(tap_ids)
        w = self.max_width
        self.inp = Staged(1 + w, self.device)                    # [p0, ids...]
        self.taps_buf = torch.zeros(len(self.tap_ids), w, s.hidden_size, device=self.device, dtype=dtype)
        self.logits_buf = torch.zeros(w, spec.vocab_size, device=self.device, dtype=dtype)
        self.argmax_buf = torch.zeros(w, dtype=torch.long, device=self.device)
        self.graphs = GraphSet(self._graph_pass, self.device, enabled=graphs)
        self.chain = ChainBufs(self._chain_pass, self.device, graphs)                # decode_plain's inputs
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def kv_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only views of layer ``layer``'s committed rows [nkv, length, d]: (k after k_norm and RoPE, v)."""
        return self.k_cache[layer, :, :self.length], self.v_cache[layer, :, :self.length]

    def capture(self, widths) -> None:
        """Capture the passes of these widths now (they are otherwise captured on first use)."""
        self.inp.put([self.length] + [0] * self.max_width)
        for r in widths:
            self.graphs.capture(r)

    def forward(self, ids: torch.Tensor, p0: torch.Tensor, taps: torch.Tensor | None, logits: torch.Tensor,
                argmax: torch.Tensor) -> None:
        """One pass over rows ids [R] at positions p0.. (a one-element device tensor): KV written, taps /
        logits / argmax written into the given buffers. Graph-safe: no host reads."""
        s, ops = self.shape, self.ops
        nh, nkv, d, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_eps
        h = F.embedding(ids, self.embed)
        keep = {t: j for j, t in enumerate(self.tap_ids)}
        if taps is not None and 0 in keep:
            taps[keep[0]].copy_(h)
        rp = self.rp
        for i, w in enumerate(self.layers):
            qkv = ops.proj(h, w.wqkv, w.ln_in, eps, rp=rp)
            ops.qk_rope_store(qkv, nh, nkv, d, w.q_norm, w.k_norm, self.cos, self.sin, p0, self.k_cache[i],
                              self.v_cache[i], eps)
            o = ops.attention(qkv, nh, nkv, d, self.k_cache[i], self.v_cache[i], p0)
            h, a = ops.ffn_input(o, w.wo, h, w.ln_post, w.wgu, eps, rp)
            out = taps[keep[i + 1]] if taps is not None and i + 1 in keep else None
            h = ops.proj(a, w.wd, None, eps, res=h, out=out, rp=rp)
        ops.proj(h, self.head, self.final32, eps, out=logits, rp=rp)
        torch.argmax(logits, dim=-1, out=argmax)

    def _graph_pass(self, r: int) -> None:
        self.forward(self.inp.dev[1:1 + r], self.inp.dev[:1], self.taps_buf[:, :r], self.logits_buf[:r],
                     self.argmax_buf[:r])

    def _chain_pass(self, k: int) -> None:
        """K plain steps (``kernels.chain``), each one row at chain.p0 whose id is the previous step's argmax (kept
        on the device); an attention-only step commits by writing its KV row. Graph-safe: no host reads."""
        c = self.chain
        for j in range(k):
            self.forward(c.ids[j:j + 1], c.p0, None, self.logits_buf[:1], c.ids[j + 1:j + 2])
            c.p0.add_(1)
        c.ids[:1].copy_(c.ids[k:k + 1])

    def rows_pass(self, ids: torch.Tensor, p0: torch.Tensor) -> torch.Tensor:
        """The verify of rows ids [R] at p0.. (device tensors) into the static taps / logits / argmax buffers, as
        ``verify``'s pass (``kernels.accept``'s window). Graph-safe. -> argmax [R] (a view of ``argmax_buf``)."""
        r = ids.shape[0]
        self.forward(ids, p0, self.taps_buf[:, :r], self.logits_buf[:r], self.argmax_buf[:r])
        return self.argmax_buf[:r]

    def commit_dev(self, kept: torch.Tensor, r: int) -> None:
        """Commit the first ``kept`` [1] rows of the last ``rows_pass`` on the device: KV rows are kept by position
        (the rows past kept are overwritten by the next pass before any row reads them), so nothing to do."""

    def replay_plain_step(self) -> None:
        """One plain step's device work again (the staged width-1 pass; an attention-only commit has none): what the
        bench times as the device share of an id."""
        self.graphs.run(1)

    def decode_plain(self, first: int, n: int, k: int = 8) -> list[int]:
        """The next n greedy ids after ``first`` (the last pass's argmax), committed, K one-row steps a graph
        replay with the host reading ids once per K (``kernels.chain.decode_plain``)."""
        return decode_plain(self, first, n, k)

    def prefill(self, ids: list[int], logits: bool = False) -> Pass:
        r = len(ids)
        if r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (prompt of {r})")
        taps = torch.empty(len(self.tap_ids), r, self.shape.hidden_size, device=self.device, dtype=self.dtype)
        out = torch.empty(r, self.spec.vocab_size, device=self.device, dtype=self.dtype)
        am = torch.empty(r, dtype=torch.long, device=self.device)
        self.forward(torch.tensor(ids, device=self.device), torch.zeros(1, dtype=torch.long, device=self.device),
                     taps, out, am)
        self.length = r
        return Pass(am.tolist(), taps, out if logits else None)

    def verify(self, ids: list[int], logits: bool = False) -> Pass:
        real = len(ids)
        r = max(real, self.rows or 0)
        if r > self.max_width:
            raise ValueError(f"a pass of {r} rows; this engine captures at most {self.max_width}")
        if self.length + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {self.length + r})")
        self.inp.put([self.length, *ids] + [0] * (r - real))
        self.graphs.run(r)
        am = self.argmax_buf[:r].tolist()
        return Pass(am[:real], self.taps_buf[:, :real], self.logits_buf[:real] if logits else None)

    def commit(self, kept: int) -> None:
        self.length += kept
