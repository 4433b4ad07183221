"""CUDA graphs for decode passes, and the graph-friendly decode ops they run.

A pass is a function of static device buffers only: its inputs (ids, the first position p0) are staged into
device buffers before the pass (``Staged``), positions are computed on the device from p0, and its outputs
are written into preallocated buffers. Nothing inside a pass reads a device value back to the host, so a
pass can be captured once per width and replayed (``GraphSet``); the one host sync per pass is the caller's
readback of argmax ids.

``GraphSet(fn, device)``: ``run(key)`` runs ``fn(key)``. On CUDA the first run of a key warms ``fn`` up on a
side stream (Triton compiles, cuBLAS picks its kernels), captures it into a CUDA graph (all keys share one
memory pool) and replays it; later runs replay. ``fn`` must be idempotent for fixed inputs (a pass that
writes KV rows at its positions and reads them back is). Elsewhere (CPU), or with ``enabled=False``, fn runs.
A GraphSet holds a bound method weakly (``held``), so that an engine is freed when its last reference goes, not
at some later cyclic collection; and the collector is off during the warm-up and capture besides: a dead cycle
freed mid-capture makes CUDA calls a capture forbids, and the capture fails (results/h200/restore-gc).

The ops (``kernels.dispatch.decode_ops(impl)``): the fused Triton kernels of ``kernels.triton.decode`` on CUDA,
else these torch versions (same signatures, same rule, more launches):

    rms(x [R, H], w32 [H], eps)                 -> x / sqrt(mean(x^2) + eps) * w, f32 arithmetic, x's dtype
    qk_rope_store(qkv [R, (nq+2nkv)*d], ...)    q heads: rms(q, qn) -> rope, written back in place;
                                                k heads: rms(k, kn) -> rope -> kc[:, p0+r]; v heads -> vc[:, p0+r]
    attention(qkv, nq, nkv, d, kc, vc, p0, causal, gate=None, first=0)
                                                -> o [R, nq*d]: row r attends keys first <= k <= p0+r (causal)
                                                or first <= k <= p0+R-1 (a bidirectional block), over the whole
                                                static cache (``first``: slots before it hold no row, as an MTP
                                                store's slot 0); times sigmoid(gate [R, nq, d]) when given
    silu_mul(gu [R, 2I])                        -> silu(gu[:, :I]) * gu[:, I:]
    norm_rope(x [R, heads, d], w32, eps, cos, sin, kc=None, pos=None, v=None, vc=None)
                                                -> rms per head, RoPE on the first rot channels (partial rotary);
                                                with kc: stored into the cache at pos instead of returned (and v
                                                into vc beside it)
    proj(x [R, K], w [N, K], g32 | None, eps, res | None, out | None)
                                                -> (rms(x, g32) if g32 else x) @ w^T (+ res), into out when given
                                                (Triton: ``kernels.triton.gemv``, one kernel; a row's sum in
                                                one order at every pass width)
"""

from __future__ import annotations

import gc
import inspect
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .ops.rope import partial_rope

# ---------------------------------------------------------------------------------------------- graphs


_GRAPHING = [0]                         # GraphSet.capture's warm-up and capture under way (nesting depth)


def held(fn: Callable) -> Callable[[], Callable]:
    """A resolver of ``fn``: a bound method held weakly (the object it is bound to owns the holder, so a strong
    hold would be a reference cycle and the object freed only by the cyclic collector), anything else strongly.
    Calling the resolver after the object was freed is a RuntimeError."""
    if not inspect.ismethod(fn):
        return lambda: fn
    ref, name = weakref.WeakMethod(fn), fn.__qualname__

    def resolve() -> Callable:
        f = ref()
        if f is None:
            raise RuntimeError(f"{name}: its object was freed")
        return f
    return resolve


def graphing() -> bool:
    """Whether the launches made now are a ``GraphSet``'s warm-up or capture: where ``kernels.triton.pdl`` lets
    the decode kernels take programmatic dependent launch (the warm-up compiles what the capture will launch)."""
    return _GRAPHING[0] > 0


class GraphSet:
    """One CUDA graph per key (e.g. the pass width), captured on first use, sharing a memory pool."""

    def __init__(self, fn: Callable[[Any], None], device: torch.device | str, enabled: bool = True,
                 warmup: int = 2):
        self.fn, self.warmup = fn, warmup               # a bound method held weakly (``held``)
        self.enabled = enabled and torch.device(device).type == "cuda"
        self.graphs: dict[Any, torch.cuda.CUDAGraph] = {}
        self.pool = None

    @property
    def fn(self) -> Callable[[Any], None]:
        return self._fn()

    @fn.setter
    def fn(self, fn: Callable[[Any], None]) -> None:
        self._fn = held(fn)

    def capture(self, key: Any) -> None:
        if not self.enabled or key in self.graphs:
            return
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        collecting = gc.isenabled()
        gc.disable()                        # no cyclic collection mid-capture (module docstring)
        _GRAPHING[0] += 1
        try:
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.fn(key)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.fn(key)
        finally:
            _GRAPHING[0] -= 1
            if collecting:
                gc.enable()
        self.graphs[key] = graph

    def run(self, key: Any) -> None:
        if not self.enabled:
            self.fn(key)
            return
        if key not in self.graphs:
            self.capture(key)
        self.graphs[key].replay()


class Staged:
    """Host values -> a static device int64 buffer without a sync: a pinned host copy, then an async H2D copy.
    The next ``put`` waits for the previous copy to have left the host buffer."""

    def __init__(self, n: int, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.dev = torch.zeros(n, dtype=torch.long, device=device)
        self.host = torch.zeros(n, dtype=torch.long, pin_memory=self.cuda)
        self.np = self.host.numpy()                 # the same memory: a list is written into it without a tensor
        self.done = torch.cuda.Event() if self.cuda else None
        self.pending = False

    def put(self, values: list[int]) -> None:
        if len(values) > self.dev.numel():
            raise ValueError(f"{len(values)} values for a staging buffer of {self.dev.numel()}")
        if self.pending:
            self.done.synchronize()
        k = len(values)
        self.np[:k] = values
        self.dev[:k].copy_(self.host[:k], non_blocking=True)
        if self.cuda:
            self.done.record()
            self.pending = True


def time_replays(fn: Callable[[], None], device: torch.device, iters: int, warmup: int = 2) -> float:
    """Seconds per call of ``fn`` (back to back; CUDA events on CUDA, perf_counter elsewhere)."""
    import time

    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


# ---------------------------------------------------------------------------------------------- torch ops


def rms(x: torch.Tensor, w32: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * w32).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x32 = x.float()
    return (x32 * cos + torch.cat([-x32[..., half:], x32[..., :half]], -1) * sin).to(x.dtype)


def qk_rope_store(qkv: torch.Tensor, nq: int, nkv: int, d: int, qn32: torch.Tensor | None, kn32: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, p0: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  eps: float) -> None:
    """qkv [R, (nq+2nkv)*d] (row stride may exceed the width); kc / vc [nkv, cap, d]; p0 a one-element device
    tensor. Rotated q goes back into qkv; k / v land in the caches at positions p0..p0+R-1."""
    r = qkv.shape[0]
    pos = p0 + torch.arange(r, device=qkv.device)
    c, s = cos[pos][:, None], sin[pos][:, None]
    if nq:
        q = qkv[:, : nq * d].view(r, nq, d)
        q.copy_(_rope(rms(q, qn32, eps), c, s))
    k = qkv[:, nq * d:(nq + nkv) * d].reshape(r, nkv, d)
    v = qkv[:, (nq + nkv) * d:(nq + 2 * nkv) * d].reshape(r, nkv, d)
    kc.index_copy_(1, pos, _rope(rms(k, kn32, eps), c, s).transpose(0, 1))
    vc.index_copy_(1, pos, v.transpose(0, 1))


def attention(qkv: torch.Tensor, nq: int, nkv: int, d: int, kc: torch.Tensor, vc: torch.Tensor, p0: torch.Tensor,
              causal: bool = True, gate: torch.Tensor | None = None, first: int = 0) -> torch.Tensor:
    r, g = qkv.shape[0], nq // nkv
    pos = p0 + torch.arange(r, device=qkv.device)
    lim = pos if causal else (p0 + r - 1).expand(r)
    keys = torch.arange(kc.shape[1], device=qkv.device)[None, :]
    allowed = (keys <= lim[:, None]) & (keys >= first)                                        # [R, cap]
    bias = torch.zeros(allowed.shape, dtype=qkv.dtype, device=qkv.device).masked_fill(~allowed, float("-inf"))
    q = qkv[:, : nq * d].reshape(r, nkv, g, d).permute(1, 2, 0, 3).reshape(1, nkv, g * r, d)
    o = F.scaled_dot_product_attention(q, kc[None], vc[None], attn_mask=bias.repeat(g, 1)[None, None],
                                       scale=1.0 / math.sqrt(d))
    o = o.view(nkv, g, r, d).permute(2, 0, 1, 3).reshape(r, nq * d)
    return o if gate is None else sigmoid_gate(o, gate)


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o [R, nq*d] * sigmoid(gate [R, nq, d]) (qwen38's gated attention), each op rounded to o's dtype (the Triton
    combine kernel's GATE epilogue rounds the same way)."""
    return o * torch.sigmoid(gate.reshape(o.shape))


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    i = gu.shape[-1] // 2
    g, u = gu[:, :i].float(), gu[:, i:].float()
    return (F.silu(g) * u).to(gu.dtype)


def norm_rope(x: torch.Tensor, w32: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
              kc: torch.Tensor | None = None, pos: torch.Tensor | None = None, v: torch.Tensor | None = None,
              vc: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [R, heads, d] (a view; unit stride within a head) -> rms(x) * w rounded to x's dtype, then RoPE on the
    first rot channels (cos / sin [R, 1, rot], gathered at the rows' positions; the rest pass through). With ``kc``
    [heads, cap, d] the result is stored at kc[:, pos[r]] (pos [R] on the device) and None is returned; with ``v``
    [R, heads, d] and ``vc`` like kc, v is stored into vc at the same places."""
    out = partial_rope(rms(x, w32, eps), cos, sin)
    if kc is None:
        return out
    kc.index_copy_(1, pos, out.transpose(0, 1))
    if v is not None:
        vc.index_copy_(1, pos, v.transpose(0, 1))
    return None


def rows_pad(r: int) -> int:
    """The padded row count of a projection over r rows (a power of two >= 16: the tensor cores' narrow side)."""
    return max(16, 1 << (max(r, 1) - 1).bit_length())


def proj(x: torch.Tensor, w: torch.Tensor, g32: torch.Tensor | None, eps: float, res: torch.Tensor | None = None,
         out: torch.Tensor | None = None, rp: int | None = None) -> torch.Tensor:
    """(rms(x, g32, eps) if g32 is given else x) @ w^T, plus res when given, into out when given (``rp`` is the
    Triton kernel's padding; unused here)."""
    a = x if g32 is None else rms(x, g32, eps)
    if res is None:
        return torch.mm(a, w.t()) if out is None else torch.mm(a, w.t(), out=out)
    return torch.addmm(res, a, w.t()) if out is None else torch.addmm(res, a, w.t(), out=out)


def ffn_input(o: torch.Tensor, wo: torch.Tensor, h: torch.Tensor, g32: torch.Tensor, wgu: torch.Tensor, eps: float,
              rp: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's output projection and the FFN's input: h2 = o wo^T + h [R, H], and silu(g) u [R, I] of
    [g | u] = rms(h2, g32) wgu^T (the down projection, h2 its residual, is the caller's)."""
    return ffn_input_of(TorchOps, o, wo, h, g32, wgu, eps, rp)


def ffn_input_of(ops, o: torch.Tensor, wo: torch.Tensor, h: torch.Tensor, g32: torch.Tensor, wgu: torch.Tensor,
                 eps: float, rp: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ffn_input`` composed of ``ops``' proj and silu_mul (the norm folded where ``ops.proj`` folds it): the torch
    ops', and the Triton ops' wherever they do not defer the norm."""
    h2 = ops.proj(o, wo, None, eps, res=h, rp=rp)
    return h2, ops.silu_mul(ops.proj(h2, wgu, g32, eps, rp=rp))


class TorchOps:
    name = "torch"
    proj = staticmethod(proj)
    norm_rope = staticmethod(norm_rope)
    rms = staticmethod(rms)
    qk_rope_store = staticmethod(qk_rope_store)
    attention = staticmethod(attention)
    silu_mul = staticmethod(silu_mul)
    ffn_input = staticmethod(ffn_input)
