"""The qwen38 hybrid's decode engine over static device buffers: ``Qwen38Target``'s interface (prefill / verify /
commit, ``Qwen38Pass`` out) whose verify of R rows and commit of k rows are functions of static buffers only, so that
on CUDA each is captured once per width as a CUDA graph (``kernels.graphs.GraphSet``) and replayed; on CPU the same
code runs eagerly. The math and the exactness argument are ``Qwen38Target``'s (module docstring of
``kernels.families.qwen38.model``); only the layout changes.

Static state (allocated once; never resized, never reallocated):
  k_cache, v_cache [La, nkv, cap, d]           full-attention layers, written at positions p0..p0+R-1
  conv_tail [Ll, K-1, C], state [Ll, nv, dk, dv] (f32)   Gated DeltaNet layers, the committed ones, updated in place
  proj [Ll, K-1+W, Ctot]                       per DeltaNet layer: rows 0..K-2 = the committed tail (columns :C),
                                               rows K-1.. = the pass's projection a [Wqkv; Wz; Wa; Wb]^T (one GEMM)
  q, k [Ll, 1, W, nv, dk], v [Ll, 1, W, nv, dv], g, b [Ll, 1, W, nv] (f32)  the pass's delta-rule inputs
  taps [L+1, W, H]                             the residual stream itself: layer l writes its output into taps[l+1]
  final [W, H], logits [W, V], argmax [W]      the head's input, the logits, their argmax
  inp (Staged) [p0, ids...]                    the one host -> device copy of a pass (pinned, async)

Passes (R rows at positions p0 + r, p0 read on the device from ``inp``; no host read inside a pass):
  verify(R)  proj[:, :K-1, :C] <- conv_tail; every layer on taps[l] -> taps[l+1]; a DeltaNet layer runs the
             recurrence from ``state`` (outputs only: the committed state is not touched) and leaves its rows'
             prepared inputs in q, k, v, g, b; an attention layer writes K/V into the cache at p0..p0+R-1.
  commit(k)  state <- the recurrence replayed over rows 0..k-1 of q, k, v, g, b from ``state`` (the same
             function the verify ran: bit-equal to it, and to k one-row commits of a plain run);
             conv_tail <- proj[:, k : k+K-1, :C]. Captured per k as well (it mutates state: captured with the
             state saved and restored around the capture's warm-up runs).
  prefill    eager (its length is the prompt's): the chunked delta rule writes ``state``, the tail is the prompt's
             last K-1 projected rows; plain and drafted runs prefill alike.

Ops: ``kernels.dispatch.decode_ops`` (Triton rms / attention / silu on CUDA, torch elsewhere) and the DeltaNet's
Triton prepare / out-norm / recurrence (``kernels.triton.deltanet*``) when ``impl`` resolves to "triton"; the q/k
norm + partial RoPE + cache store is torch (16 of the 64 layers at the 27B shape).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bloomery_gates.spec import Qwen38Spec

from ...chain import ChainBufs, decode_plain
from ...dispatch import decode_ops
from ...graphs import GraphSet, Staged, rows_pad, sigmoid_gate
from ...ops.attention import attend
from ...ops.gated_deltanet import delta_chunked
from ...ops.rope import rope_tables
from ...triton import delta_dims_ok, delta_impl, resolve_impl
from ..qwen3.model import stack_rows
from .model import PREFILL_CHUNK, Qwen38Pass, fused_ops, norm_gain

T = torch.Tensor


@dataclass(frozen=True)
class FastMLP:
    ln_post: T          # [H] f32 gain 1 + w
    wgu: T              # [2 I, H]
    wd: T               # [H, I]


@dataclass(frozen=True)
class FastDelta:
    """A Gated DeltaNet layer: one projection [C + nv dv + 2 nv, H] = [in_proj_qkv; in_proj_z; in_proj_a; in_proj_b]."""

    ln_in: T            # [H] f32
    w_proj: T           # [Ctot, H]
    conv_w: T           # [C, K]
    a_log: T            # [nv]
    dt_bias: T          # [nv]
    norm_w: T           # [dv] (the plain gain w)
    w_out: T            # [H, nv dv]
    mlp: FastMLP


@dataclass(frozen=True)
class FastAttn:
    """A gated full-attention layer: one projection [2 nh d + 2 nkv d, H] = [q_proj (query | gate per head); k; v]."""

    ln_in: T
    w_qgkv: T
    q_norm: T           # [d] f32 gain
    k_norm: T           # [d] f32 gain
    wo: T               # [H, nh d]
    mlp: FastMLP


@dataclass
class PassBufs:
    """The buffers one pass of R rows reads and writes (static slices on the graphed path, new ones in prefill)."""

    proj: T
    rows: tuple[T, T, T, T, T] | None      # None: prefill (the chunked rule writes the state directly)
    taps: T
    final: T
    logits: T
    argmax: T
    commit: bool = False                   # a chained one-row step: its row is kept, its state written in the pass


def _mlp(t, p: str, cast) -> FastMLP:
    m = p + "mlp."
    return FastMLP(norm_gain(t[p + "post_attention_layernorm.weight"]).to(cast.device),
                   stack_rows(cast(t[m + "gate_proj.weight"]), cast(t[m + "up_proj.weight"])),
                   cast(t[m + "down_proj.weight"]).contiguous())


class _Cast:
    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype

    def __call__(self, x: T) -> T:
        return x.to(device=self.device, dtype=self.dtype)


def fast_attn(t, p: str, cast: _Cast) -> FastAttn:
    """The gated attention layer under prefix ``p`` ("model.layers.3." or "mtp.layers.0.") in the fused layout."""
    a = p + "self_attn."
    return FastAttn(norm_gain(t[p + "input_layernorm.weight"]).to(cast.device),
                    stack_rows(*(cast(t[a + n + "_proj.weight"]) for n in "qkv")),
                    norm_gain(t[a + "q_norm.weight"]).to(cast.device),
                    norm_gain(t[a + "k_norm.weight"]).to(cast.device),
                    cast(t[a + "o_proj.weight"]).contiguous(), _mlp(t, p, cast))


def gated_attention(ops, shape, h: T, w: FastAttn, kc: T, vc: T, pos: T, p0: T, allowed: T | None, cos: T, sin: T,
                    eps: float, rp: int | None = None, first: int = 0) -> T:
    """h + the gated attention on rows h [R, H] at positions pos (= p0 + r): K/V stored into kc, vc [nkv, cap, d]
    at pos, each row attending the keys ``allowed`` [R, cap] lets it (the masked matmul ``ops.attention.attend``,
    whose rows are independent of R and of their place in the pass), or with ``allowed`` None the keys first..its
    position through ``ops.attention`` (the flash-decoding kernel of ``kernels.triton.decode``)."""
    nh, nkv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    r = h.shape[0]
    x = ops.proj(h, w.w_qgkv, w.ln_in, eps, rp=rp)                                  # [R, 2 nh d + 2 nkv d]
    qg = x[:, :2 * nh * d].view(r, nh, 2 * d)
    q = ops.norm_rope(qg[..., :d], w.q_norm, eps, cos, sin).reshape(r, nh * d)
    ops.norm_rope(x[:, 2 * nh * d:(2 * nh + nkv) * d].view(r, nkv, d), w.k_norm, eps, cos, sin, kc=kc, pos=pos,
                  v=x[:, (2 * nh + nkv) * d:].view(r, nkv, d), vc=vc)
    if allowed is not None:
        o = attend(q.view(1, r, nh, d).transpose(1, 2), kc[None], vc[None], allowed)[0]
        o = sigmoid_gate(o, qg[..., d:])
    else:                               # the sigmoid gate applied in the attention's last kernel
        o = ops.attention(q, nh, nkv, d, kc, vc, p0, gate=qg[..., d:], first=first)
    return ops.proj(o, w.wo, None, eps, res=h, rp=rp)


def ffn_into(ops, h: T, m: FastMLP, eps: float, out: T | None = None, rp: int | None = None) -> T:
    """h + swiglu(rms(h, post_attention_layernorm)), into ``out`` when given (``rp``: ``ops.proj``'s padding)."""
    gu = ops.proj(h, m.wgu, m.ln_post, eps, rp=rp)
    return ops.proj(ops.silu_mul(gu), m.wd, None, eps, res=h, out=out, rp=rp)


class FastQwen38Target:
    """The graphed hybrid engine (module docstring). ``rows`` pads every verify to that many rows (as
    ``Qwen38Target``); ``max_width`` the widest pass it captures; ``graphs`` CUDA graphs on CUDA (ignored elsewhere);
    ``impl`` "auto" | "torch" | "triton" for both the decode ops and the DeltaNet kernels."""

    def __init__(self, spec: Qwen38Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None, max_width: int = 16, graphs: bool = True, impl: str = "auto",
                 attention: str = "auto"):
        if getattr(spec, "moe", None) is not None:
            raise ValueError("FastQwen38Target runs the dense qwen38 FFN; a MoE target runs on its eager engine")
        self.spec, self.shape, self.hybrid = spec, spec.layer, spec.hybrid
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        hy, s = self.hybrid, self.shape
        if impl == "auto" and not delta_dims_ok(hy.linear_key_head_dim, hy.linear_value_head_dim):
            impl = "torch"
        self.impl = resolve_impl(impl, self.device)
        self.ops = decode_ops(self.impl, self.device)
        self.recur = delta_impl(self.impl)
        self.prep, self.out_norm = fused_ops(self.impl)
        if attention not in ("auto", "torch", "triton"):
            raise ValueError(f"attention={attention!r}: expected auto, torch or triton")
        # the flash-decoding kernel's dots need head_dim >= 16 (tl.dot's K): tiny test shapes take the masked matmul
        auto = "triton" if self.impl == "triton" and spec.layer.head_dim >= 16 else "torch"
        self.attention = auto if attention == "auto" else attention
        if self.attention == "triton" and self.ops.name != "triton":
            raise ValueError("attention='triton' needs impl='triton'")
        cast = _Cast(self.device, dtype)
        t = spec.tensors
        self.attn_layers = [l for l in range(spec.num_layers) if not hy.is_linear(l)]
        self.lin_layers = [l for l in range(spec.num_layers) if hy.is_linear(l)]
        self.layers: list[FastDelta | FastAttn] = []
        for l in range(spec.num_layers):
            p = f"model.layers.{l}."
            if hy.is_linear(l):
                a = p + "linear_attn."
                names = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b")
                self.layers.append(FastDelta(
                    norm_gain(t[p + "input_layernorm.weight"]).to(self.device),
                    stack_rows(*(cast(t[a + n + ".weight"]) for n in names)),
                    cast(t[a + "conv1d.weight"]).reshape(hy.conv_dim, -1).contiguous(), cast(t[a + "A_log"]),
                    cast(t[a + "dt_bias"]), cast(t[a + "norm.weight"]), cast(t[a + "out_proj.weight"]).contiguous(),
                    _mlp(t, p, cast)))
            else:
                self.layers.append(fast_attn(t, p, cast))
        self.embed = cast(t["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight())
        self.final_norm = norm_gain(t["model.norm.weight"]).to(self.device)      # f32 gain, as Qwen38Target
        self.max_width = max(max_width, rows or 0)
        self.rp = rows_pad(self.max_width)           # every pass's projections pad to this: one kernel for all R
        self.cap = -(-(max_len + self.max_width) // 64) * 64
        self.cos, self.sin = rope_tables(hy.rotary_dim, s.rope_theta, self.cap, self.device)
        dev, w, f32 = self.device, self.max_width, torch.float32
        kv = (len(self.attn_layers), s.num_kv_heads, self.cap, s.head_dim)
        self.k_cache = torch.zeros(kv, device=dev, dtype=dtype)
        self.v_cache = torch.zeros(kv, device=dev, dtype=dtype)
        self.key_pos = torch.arange(self.cap, device=dev)
        nl, k, c = len(self.lin_layers), hy.linear_conv_kernel_dim, hy.conv_dim
        nv, dk, dv = hy.linear_num_value_heads, hy.linear_key_head_dim, hy.linear_value_head_dim
        self.ctot = c + nv * dv + 2 * nv
        self.conv_tail = torch.zeros(nl, k - 1, c, device=dev, dtype=dtype)
        self.state = torch.zeros(nl, 1, nv, dk, dv, device=dev, dtype=f32)
        self.proj = torch.zeros(nl, k - 1 + w, self.ctot, device=dev, dtype=dtype)
        self.rows_buf = tuple(torch.zeros(nl, 1, w, *tail, device=dev, dtype=f32)
                              for tail in ((nv, dk), (nv, dk), (nv, dv), (nv,), (nv,)))
        self.taps_buf = torch.zeros(spec.num_layers + 1, w, s.hidden_size, device=dev, dtype=dtype)
        self.final_buf = torch.zeros(w, s.hidden_size, device=dev, dtype=dtype)
        self.logits_buf = torch.zeros(w, spec.vocab_size, device=dev, dtype=dtype)
        self.argmax_buf = torch.zeros(w, dtype=torch.long, device=dev)
        self.inp = Staged(1 + w, dev)                                             # [p0, ids...]
        self.graphs = GraphSet(self._verify_pass, dev, enabled=graphs)
        self.commit_graphs = GraphSet(self._commit_pass, dev, enabled=graphs)
        self.chain = ChainBufs(self._chain_pass, dev, graphs, keep=self._committed)
        self.length = 0
        self._last: int | None = None             # rows of the last uncommitted verify
        self._pending = None                      # Qwen38Target's name (benches clear it); unused here

    # ------------------------------------------------------------------------------------------ the API

    def reset(self) -> None:
        self.length, self._last = 0, None
        self.conv_tail.zero_()
        self.state.zero_()

    def prefill(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Run the prompt from position 0 (fresh tails and states) eagerly and commit it whole."""
        r = len(ids)
        if not 1 <= r <= self.cap:
            raise ValueError(f"a prompt of {r} ids; this engine holds 1..{self.cap} positions")
        self.reset()
        dev, s, k = self.device, self.shape, self.hybrid.linear_conv_kernel_dim
        bufs = PassBufs(torch.empty(len(self.lin_layers), k - 1 + r, self.ctot, device=dev, dtype=self.dtype), None,
                        torch.empty(self.spec.num_layers + 1, r, s.hidden_size, device=dev, dtype=self.dtype),
                        torch.empty(r, s.hidden_size, device=dev, dtype=self.dtype),
                        torch.empty(r, self.spec.vocab_size, device=dev, dtype=self.dtype),
                        torch.empty(r, dtype=torch.long, device=dev))
        self.forward(torch.tensor(ids, device=dev), torch.zeros(1, dtype=torch.long, device=dev), bufs)
        self.conv_tail.copy_(bufs.proj[:, r:r + k - 1, :self.hybrid.conv_dim])
        self.length = r
        return Qwen38Pass(bufs.argmax.tolist(), bufs.taps, bufs.logits if logits else None, bufs.final)

    def verify(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Rows ids at positions length..length+R-1 (padded to ``rows``): KV written, the rows' delta-rule inputs
        kept, nothing committed. The returned taps / final / logits are views of static buffers: valid until the
        next pass."""
        real = len(ids)
        r = max(real, self.rows or 0)
        if not 1 <= r <= self.max_width:
            raise ValueError(f"a pass of {r} rows; this engine captures 1..{self.max_width}")
        if self.length + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {self.length + r})")
        self.inp.put([self.length, *ids] + [0] * (r - real))
        self.graphs.run(r)
        self._last = r
        am = self.argmax_buf[:r].tolist()
        return Qwen38Pass(am[:real], self.taps_buf[:, :real], self.logits_buf[:real] if logits else None,
                          self.final_buf[:real])

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last verify (KV by position; the DeltaNet state replayed over them and
        the conv tail sliced after them: module docstring)."""
        if self._last is None:
            raise RuntimeError("commit without a pass to commit")
        if not 1 <= kept <= self._last:
            raise ValueError(f"cannot commit {kept} rows of a pass of {self._last}")
        g = self.commit_graphs
        if g.enabled and kept not in g.graphs:
            self._capture_commit(kept)
        g.run(kept)
        self.length += kept
        self._last = None

    def capture(self, widths) -> None:
        """Capture the verify of these widths and the commit of every k <= max(widths) now (between passes: the
        warm-up runs overwrite the pass buffers, never the committed state)."""
        self.inp.put([self.length] + [0] * self.max_width)
        widths = list(widths)
        for r in widths:
            self.graphs.capture(r)
        for k in range(1, max(widths, default=0) + 1):
            if self.commit_graphs.enabled and k not in self.commit_graphs.graphs:
                self._capture_commit(k)
        self._last = None

    def replay_plain_step(self) -> None:
        """One plain step's device work again: the staged width-1 verify and its commit of one row (captured by the
        last ``verify`` / ``commit(1)``); the state it advances is the bench's to reset (``prefill``)."""
        self.graphs.run(1)
        self.commit_graphs.run(1)

    def decode_plain(self, first: int, n: int, k: int = 8) -> list[int]:
        """The next n greedy ids after ``first`` (the last pass's argmax), committed: the one-row verify + commit(1)
        n times, K of them a graph replay with the host reading ids once per K (``kernels.chain``; no replay runs
        the recurrent state past the n-th id)."""
        self._last = None
        return decode_plain(self, first, n, k)

    def kv_rows(self, layer: int) -> tuple[T, T]:
        """Read-only views of attention layer ``layer``'s committed rows [nkv, length, d]: k (normed, rotated), v."""
        j = self.attn_layers.index(layer)
        return self.k_cache[j, :, :self.length], self.v_cache[j, :, :self.length]

    def recurrent_state(self, layer: int) -> tuple[T, T]:
        """Read-only views of linear layer ``layer``'s committed conv tail [K-1, C] and state [nv, dk, dv] (f32)."""
        i = self.lin_layers.index(layer)
        return self.conv_tail[i], self.state[i, 0]

    # ------------------------------------------------------------------------------------------ the passes

    def _verify_pass(self, r: int) -> None:
        k = self.hybrid.linear_conv_kernel_dim
        bufs = PassBufs(self.proj[:, :k - 1 + r], tuple(x[:, :, :r] for x in self.rows_buf), self.taps_buf[:, :r],
                        self.final_buf[:r], self.logits_buf[:r], self.argmax_buf[:r])
        self.forward(self.inp.dev[1:1 + r], self.inp.dev[:1], bufs)

    def _committed(self) -> tuple[T, T]:
        """The committed state a chain capture's warm-ups change (``ChainBufs.keep``)."""
        return self.state, self.conv_tail

    def _commit_pass(self, kept: int) -> None:
        """state <- replay of rows 0..kept-1 from state (every linear layer in one launch); conv_tail <- proj[:,
        kept : kept+K-1, :C]. Graph-safe."""
        st = self.state[:, 0]                                                         # [layers, nv, dk, dv]
        self.recur(*(x[:, 0, :kept] for x in self.rows_buf), st, st, outputs=False)
        self._commit_tail(kept)

    def _commit_tail(self, kept: int) -> None:
        k = self.hybrid.linear_conv_kernel_dim
        self.conv_tail.copy_(self.proj[:, kept:kept + k - 1, :self.hybrid.conv_dim])

    def _chain_pass(self, k: int) -> None:
        """K committed one-row steps (``kernels.chain``): step j runs chain.ids[j] at chain.p0 with its argmax into
        chain.ids[j + 1], its row's state written by the pass's own recurrence (the row is kept: the launch the
        commit would replay it with, the same bits), then the conv tail shifted by one. Graph-safe."""
        c, kk = self.chain, self.hybrid.linear_conv_kernel_dim
        for j in range(k):
            self.forward(c.ids[j:j + 1], c.p0, PassBufs(self.proj[:, :kk], tuple(x[:, :, :1] for x in self.rows_buf),
                                                        self.taps_buf[:, :1], self.final_buf[:1], self.logits_buf[:1],
                                                        c.ids[j + 1:j + 2], commit=True))
            self._commit_tail(1)
            c.p0.add_(1)
        c.ids[:1].copy_(c.ids[k:k + 1])

    def rows_pass(self, ids: T, p0: T) -> T:
        """``verify``'s pass over rows ids [R] at p0.. (device tensors; ``kernels.accept``'s window): KV written, the
        rows' delta-rule inputs kept, nothing committed. Graph-safe. -> argmax [R] (a view of ``argmax_buf``)."""
        r, kk = ids.shape[0], self.hybrid.linear_conv_kernel_dim
        self.forward(ids, p0, PassBufs(self.proj[:, :kk - 1 + r], tuple(x[:, :, :r] for x in self.rows_buf),
                                       self.taps_buf[:, :r], self.final_buf[:r], self.logits_buf[:r],
                                       self.argmax_buf[:r]))
        return self.argmax_buf[:r]

    def commit_dev(self, kept: T, r: int) -> None:
        """``commit`` with kept [1] on the device (0..R; 0 keeps nothing), after a ``rows_pass`` of R rows. Graph-safe:

            state     <- the recurrence over rows 0..kept-1 from ``state``, every linear layer in one launch, the
                         bound read on the device (``delta_recurrent(rows=kept)``; the torch scan makes the rows past
                         kept identity updates, g = b = 0): the same operations on the same operands as
                         ``commit(kept)``'s replay
            conv_tail <- proj[:, kept + j, :C], j < K-1 (gathered by index; kept = 0 gives the tail back)"""
        st = self.state[:, 0]                                                         # [layers, nv, dk, dv]
        self.recur(*(x[:, 0, :r] for x in self.rows_buf), st, st, rows=kept, outputs=False)
        kk, c = self.hybrid.linear_conv_kernel_dim, self.hybrid.conv_dim
        self.conv_tail.copy_(self.proj.index_select(1, kept + self.key_pos[:kk - 1])[:, :, :c])

    def _capture_commit(self, kept: int) -> None:
        saved = self.state.clone(), self.conv_tail.clone()
        self.commit_graphs.capture(kept)                     # its warm-up runs replay into the state...
        self.state.copy_(saved[0])                           # ...which is put back (capture itself runs nothing)
        self.conv_tail.copy_(saved[1])

    def forward(self, ids: T, p0: T, bufs: PassBufs) -> None:
        """One pass over rows ids [R] at positions p0 + r (p0 a one-element device tensor) into ``bufs``; with
        ``bufs.rows`` None (prefill) the chunked rule writes ``state``. Graph-safe: no host reads, static shapes."""
        s, hy, ops = self.shape, self.hybrid, self.ops
        eps, k, c = s.rms_eps, hy.linear_conv_kernel_dim, hy.conv_dim
        r = ids.shape[0]
        pos = p0 + torch.arange(r, device=ids.device)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]                    # [R, 1, rot]
        allowed = self.key_pos[None, :] <= pos[:, None] if self.attention == "torch" else None   # [R, cap]
        bufs.proj[:, :k - 1, :c].copy_(self.conv_tail)
        torch.index_select(self.embed, 0, ids, out=bufs.taps[0])
        h = bufs.taps[0]
        i = j = 0
        for l, w in enumerate(self.layers):
            if isinstance(w, FastDelta):
                hm = self._delta(h, w, i, bufs, eps)
                i += 1
            else:
                hm = self._attention(h, w, j, pos, p0, allowed, cos, sin, eps)
                j += 1
            h = ffn_into(ops, hm, w.mlp, eps, out=bufs.taps[l + 1], rp=self.rp)
        bufs.final.copy_(ops.rms(h, self.final_norm, eps))
        ops.proj(bufs.final, self.head, None, eps, out=bufs.logits, rp=self.rp)
        torch.argmax(bufs.logits, dim=-1, out=bufs.argmax)

    def _delta(self, h: T, w: FastDelta, i: int, bufs: PassBufs, eps: float) -> T:
        """h + the Gated DeltaNet of linear layer i on rows h [R, H] (its tail already in proj[i, :K-1])."""
        hy = self.hybrid
        k, c, nv, dv = hy.linear_conv_kernel_dim, hy.conv_dim, hy.linear_num_value_heads, hy.linear_value_head_dim
        r, vd = h.shape[0], nv * dv
        pr = bufs.proj[i]                                                             # [K-1+R, Ctot]
        self.ops.proj(h, w.w_proj, w.ln_in, eps, out=pr[k - 1:], rp=self.rp)
        x = pr[k - 1:]
        args = (pr[None, :, :c], w.conv_w, x[None, :, c + vd:c + vd + nv], x[None, :, c + vd + nv:], w.a_log,
                w.dt_bias, hy.linear_num_key_heads, hy.linear_key_head_dim, dv)
        if bufs.rows is None:                                                         # prefill: chunked, committed
            o, last = delta_chunked(*self.prep(*args), self.state[i], chunk=PREFILL_CHUNK)
            self.state[i].copy_(last)
        else:
            rows = tuple(x_[i] for x_ in bufs.rows)
            self._prepare_into(args, rows)
            o = self.recur(*rows, self.state[i], self.state[i], store=bufs.commit)[0]   # else outputs only
        o = self.out_norm(o, w.norm_w, x[:, c:c + vd].reshape(1, r, nv, dv), eps, self.dtype).reshape(r, vd)
        return self.ops.proj(o, w.w_out, None, eps, res=h, rp=self.rp)

    def _prepare_into(self, args: tuple, rows: tuple[T, ...]) -> None:
        if self.impl == "triton":
            self.prep(*args, out=rows)
            return
        for dst, src in zip(rows, self.prep(*args), strict=True):
            dst.copy_(src)

    def _attention(self, h: T, w: FastAttn, j: int, pos: T, p0: T, allowed: T | None, cos: T, sin: T,
                   eps: float) -> T:
        """h + the gated attention of full layer j (``gated_attention`` over this layer's static cache)."""
        return gated_attention(self.ops, self.shape, h, w, self.k_cache[j], self.v_cache[j], pos, p0, allowed, cos,
                               sin, eps, self.rp)
