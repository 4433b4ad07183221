"""Qwen3.5 / 3.6 / 3.8 dense hybrid ("qwen38") on the device (torch, CPU or CUDA): its layers, a
differentiable full forward, and the target engine the speculative loop drives. The math is written out
in ``reference.families.qwen38.model``; here: norms n1(x, w) = rms(x) * (1 + w) with the gain 1 + w formed in
float32 (``norm_gain``), rows x [N, R, H].

Engine state, per layer kind:
  full_attention   static KV cache [nkv, cap, d] cut by position (as qwen3): rows past the commit point
                   are masked out by position and overwritten by the next pass.
  linear_attention conv tail [K-1, C] and recurrent state [nv, dk, dv] (float32).

Passes over a linear layer:
  prefill  the chunked delta rule (``delta_chunked``, chunks of 64: a few triangular solves, no loop over
           rows); the state after the prompt is committed at once. Plain and drafted runs prefill the same.
  verify   the sequential recurrence (``delta_recurrent``: one Triton launch on CUDA, the torch scan
           elsewhere) from the committed state, outputs only. The pass keeps its conv buffer [tail ; R rows]
           and the prepared delta-rule inputs of its R rows (q, k, v, g, b: [R, nv, dk|dv|1], float32), NOT
           the state after every row (R x nv dk dv floats: 48 MB a layer at the 27B shape, R = 16).
  commit(k) tail = buffer[k : k+K-1] (a slice of stored rows); state = the recurrence replayed over the k kept
           rows' stored inputs from the committed state, by the same function the verify ran. Exact, not
           approximate: each row's update reads only the state before it and that row, in an order fixed by
           the shapes alone, so the replay performs the verify's float operations on the same operands and
           gives its bits; and a plain run's k one-row commits perform the same operations again, so the
           drafted and plain runs' states stay bit-equal. Cost: one more read and write of the state per layer
           (the replay), against R state writes. No layer, projection or conv is re-run.
The chunked form is not used for verify: it sums the same terms in another order (equal to rounding, not
bit-equal), so a drafted row would not give the plain row's bits and ids identical could not be promised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Qwen38Spec

from ...ops.attention import attend
from ...ops.causal_conv import with_tail
from ...ops.gated_deltanet import delta_chunked, gated_rms_norm, prepare_torch
from ...ops.norm import rms_norm
from ...ops.rope import partial_rope, rope_tables
from ...triton import delta_dims_ok, delta_impl, resolve_impl
from ..ffn import ffn_for
from ..qwen3.model import Pass
from ..rows import pad_rows, trim_rows

T = torch.Tensor
Scan = Callable[[T, T, T, T, T], T]      # (q, k, v, g, b) prepared f32 -> o [N, R, nv, dv]
PREFILL_CHUNK = 64                       # the prefill's delta-rule chunk (rows per triangular solve)
Fused = tuple[Callable[..., tuple[T, ...]], Callable[..., T]]   # (prepare, gated_rms_norm)
TORCH_FUSED: Fused = (prepare_torch, gated_rms_norm)


def fused_ops(impl: str) -> Fused:
    """The DeltaNet's pre/post-recurrence ops of a resolved impl (``kernels.triton.deltanet_prep`` or torch)."""
    if impl != "triton":
        return TORCH_FUSED
    from ...triton.deltanet_prep import gated_rms_norm as tri_norm
    from ...triton.deltanet_prep import prepare as tri_prep
    return tri_prep, tri_norm


def norm_gain(w: T) -> T:
    """The zero-centred norm's gain 1 + w, float32 (HF: ``output * (1.0 + weight.float())``)."""
    return 1.0 + w.float()


@dataclass
class Qwen38Pass(Pass):
    """``Pass`` plus ``final`` [R, H]: the post-final-norm rows n1(taps[L], model.norm), the vectors that
    enter the head (what an MTP draft reads as the target hidden); ``routing`` (MoE families, else None);
    ``choices`` (named as the reference's ``moe.pinned`` keys: deepseek41's stream choices, else None)."""

    final: T | None = field(default=None)
    routing: dict | None = field(default=None)     # MoE families: layer -> the pass's chosen experts
    choices: dict | None = field(default=None)     # other discrete choices: name -> the pass's chosen ids [R, k]


def _mlp(h: T, t: Mapping[str, T], p: str, eps: float, spec: Qwen38Spec | None = None, train: bool = False) -> T:
    """h + ffn(n1(h, post_attention_layernorm)): the family's FFN (``ffn.ffn_for``: dense SwiGLU, or the MoE)."""
    a = rms_norm(h, norm_gain(t[p + "post_attention_layernorm.weight"]), eps)
    return h + ffn_for(spec, train)(spec, t, p, a)


def attention_mixer(spec: Qwen38Spec, t: Mapping[str, T], p: str, a: T, cos: T, sin: T,
                    attend_kv: Callable[[T, T, T], T]) -> T:
    """Gated attention on normed rows a [N, R, H] -> [N, R, H]; ``attend_kv(q, k, v)`` [N, heads, R, d]
    -> [N, R, nh d] owns where keys come from (cache or the rows themselves). ``p`` ends in "self_attn."."""
    s = spec.layer
    n, r, _ = a.shape
    d, eps = s.head_dim, s.rms_eps
    qg = F.linear(a, t[p + "q_proj.weight"]).view(n, r, s.num_heads, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(n, r, s.num_heads * d)
    k = F.linear(a, t[p + "k_proj.weight"]).view(n, r, s.num_kv_heads, d)
    v = F.linear(a, t[p + "v_proj.weight"]).view(n, r, s.num_kv_heads, d).transpose(1, 2)
    q = partial_rope(rms_norm(q, norm_gain(t[p + "q_norm.weight"]), eps).transpose(1, 2), cos, sin)
    k = partial_rope(rms_norm(k, norm_gain(t[p + "k_norm.weight"]), eps).transpose(1, 2), cos, sin)
    return F.linear(attend_kv(q, k, v) * torch.sigmoid(gate), t[p + "o_proj.weight"])


def deltanet_mixer(spec: Qwen38Spec, t: Mapping[str, T], p: str, a: T, tail: T | None, scan: Scan,
                   fused: Fused = TORCH_FUSED) -> tuple[T, T]:
    """Gated DeltaNet on normed rows a [N, R, H] after conv tail ``tail`` [N, K-1, C] (None: zeros) ->
    (out [N, R, H], the conv buffer [tail ; x] [N, K-1+R, C]). ``scan`` runs the delta rule from the
    layer's state; ``fused`` = (prepare, gated_rms_norm): the torch composition or the Triton kernels.
    ``p`` ends in "linear_attn."."""
    hy, eps = spec.hybrid, spec.layer.rms_eps
    n, r, _ = a.shape
    nk, nv, dk, dv = hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_key_head_dim, \
        hy.linear_value_head_dim
    buf = with_tail(F.linear(a, t[p + "in_proj_qkv.weight"]), hy.linear_conv_kernel_dim, tail)
    prep, out_norm = fused
    q, k, v, g, b = prep(buf, t[p + "conv1d.weight"].reshape(hy.conv_dim, -1), F.linear(a, t[p + "in_proj_a.weight"]),
                         F.linear(a, t[p + "in_proj_b.weight"]), t[p + "A_log"], t[p + "dt_bias"], nk, dk, dv)
    o = scan(q, k, v, g, b)
    z = F.linear(a, t[p + "in_proj_z.weight"]).view(n, r, nv, dv)
    o = out_norm(o, t[p + "norm.weight"], z, eps, a.dtype).reshape(n, r, nv * dv)
    return F.linear(o, t[p + "out_proj.weight"]), buf


def forward_train(params: Mapping[str, T], spec: Qwen38Spec, ids: T, chunk: int = 64) -> tuple[T, list[T]]:
    """Differentiable full-sequence forward (chunked delta rule, SDPA attention). ids [N, T] ->
    (logits [N, T, V], hidden: L+1 x [N, T, H]; hidden[0] the embeddings, hidden[l+1] layer l's output,
    before the final norm)."""
    s, hy = spec.layer, spec.hybrid
    n, tl = ids.shape
    cos, sin = rope_tables(hy.rotary_dim, s.rope_theta, tl, ids.device)
    rep = s.num_heads // s.num_kv_heads

    def causal(q, k, v):
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1).to(q.dtype),
                                           v.repeat_interleave(rep, 1).to(q.dtype), is_causal=True)
        return o.transpose(1, 2).reshape(n, tl, -1)

    def scan(q, k, v, g, b):
        return delta_chunked(q, k, v, g, b, chunk=chunk)[0]

    h = F.embedding(ids, params["model.embed_tokens.weight"])
    hidden = [h]
    for l in range(spec.num_layers):
        p = f"model.layers.{l}."
        a = rms_norm(h, norm_gain(params[p + "input_layernorm.weight"]), s.rms_eps)
        if hy.is_linear(l):
            h = h + deltanet_mixer(spec, params, p + "linear_attn.", a, None, scan)[0]
        else:
            h = h + attention_mixer(spec, params, p + "self_attn.", a, cos, sin, causal)
        h = _mlp(h, params, p, s.rms_eps, spec, train=True)
        hidden.append(h)
    head = params["model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"]
    logits = F.linear(rms_norm(h, norm_gain(params["model.norm.weight"]), s.rms_eps), head)
    return logits, hidden


@dataclass
class Pending:
    """What a pass leaves for ``commit`` per linear layer: the conv buffer [1, K-1+R, C] and either the prepared
    delta-rule inputs of its rows (verify: q, k [1, R, nv, dk], v [1, R, nv, dv], g, b [1, R, nv]) or the state
    after its last row (prefill: [1, nv, dk, dv])."""

    buf: T
    rows: tuple[T, T, T, T, T] | None = None
    last: T | None = None


class Qwen38Target:
    """The target engine: prefill / verify / commit with Qwen3Target's API (see the module docstring for
    the state). ``final_norm`` is the final norm's effective float32 gain 1 + w, so that
    ``rms_norm(taps[L], final_norm, shape.rms_eps)`` is the head's input, as for qwen3. Every verify runs
    exactly ``rows`` rows when set (short passes padded at the end), so plain and drafted runs have equal
    shapes; the verify's delta rule is sequential over rows, so a row's numbers never depend on the row count.
    ``impl`` picks the verify recurrence: "auto" (Triton on CUDA when it imports and the head dims are powers of
    two), "torch" or "triton".
    """

    TENSORS: tuple[str, ...] = ("model.layers.",)          # the per-layer weights it holds in the run dtype
    FINAL_NORM: str | None = "model.norm.weight"              # None: the family has no final norm (qwen4exp)

    def __init__(self, spec: Qwen38Spec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None, impl: str = "auto"):
        self.spec, self.shape, self.hybrid = spec, spec.layer, spec.hybrid
        self.device, self.dtype, self.rows = torch.device(device), dtype, rows
        if impl == "auto" and not delta_dims_ok(spec.hybrid.linear_key_head_dim, spec.hybrid.linear_value_head_dim):
            impl = "torch"
        self.impl = resolve_impl(impl, self.device)
        self.recur = delta_impl(self.impl)
        self.fused = self._fused_ops()
        cast = lambda x: x.to(device=self.device, dtype=dtype)  # noqa: E731
        self.t = {n: cast(x) for n, x in spec.tensors.items() if n.startswith(self.TENSORS)}
        self.embed = cast(spec.tensors["model.embed_tokens.weight"])
        self.head = cast(spec.head_weight())
        if self.FINAL_NORM is not None:
            self.final_norm = norm_gain(spec.tensors[self.FINAL_NORM]).to(self.device)
        self.cap = max_len + (rows or 0)
        s, hy = self.shape, self.hybrid
        self.cos, self.sin = rope_tables(hy.rotary_dim, s.rope_theta, self.cap, self.device)
        self.attn_layers = [l for l in range(spec.num_layers) if not hy.is_linear(l)]
        self.lin_layers = [l for l in range(spec.num_layers) if hy.is_linear(l)]
        kv = (len(self.attn_layers), 1, s.num_kv_heads, self.cap, s.head_dim)
        self.k_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.v_cache = torch.zeros(kv, device=self.device, dtype=dtype)
        self.key_pos = torch.arange(self.cap, device=self.device)
        k, c = hy.linear_conv_kernel_dim, hy.conv_dim
        self.conv_tail = torch.zeros(len(self.lin_layers), 1, k - 1, c, device=self.device, dtype=dtype)
        self.state = torch.zeros(len(self.lin_layers), 1, hy.linear_num_value_heads, hy.linear_key_head_dim,
                                 hy.linear_value_head_dim, device=self.device, dtype=torch.float32)
        self._pending: list[Pending] | None = None             # per linear layer, what the last pass left
        self.length = 0
        self.rows_run = 0                                      # rows pushed through the layers so far

    def _fused_ops(self) -> tuple:
        """(prepare, gated output norm) of the linear layers for ``self.impl`` (kernels.dispatch)."""
        return fused_ops(self.impl)

    def reset(self) -> None:
        self.length = 0
        self.conv_tail.zero_()
        self.state.zero_()
        self._pending = None

    def prefill(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Run the prompt from position 0 (fresh conv tails and states) and commit it whole."""
        self.reset()
        out = self._run(ids, logits, keep_rows=False)
        self.commit(len(ids))
        return out

    def verify(self, ids: list[int], logits: bool = False) -> Qwen38Pass:
        """Run rows ids at positions length..length+R-1 (KV written, the rows' delta-rule inputs kept, nothing
        committed)."""
        return trim_rows(self._run(pad_rows(ids, self.rows), logits, keep_rows=True), len(ids))

    def commit(self, kept: int) -> None:
        """Keep the first ``kept`` rows of the last pass: KV by position; per linear layer the conv tail (a slice
        of the pass's conv buffer) and the recurrent state after row kept-1: after a prefill the pass's last
        state, after a verify the recurrence replayed over the kept rows' stored inputs (module docstring)."""
        if self._pending is None:
            raise RuntimeError("commit without a pass to commit")
        k = self.hybrid.linear_conv_kernel_dim
        for i, pend in enumerate(self._pending):
            if pend.rows is None:
                self._rollback_row(kept, pend.buf.shape[1] - (k - 1) - 1, 1)
                self.state[i] = pend.last
            else:
                n = self._rollback_row(kept, 0, pend.rows[0].shape[1]) + 1
                self.recur(*(x[:, :n] for x in pend.rows), self.state[i], self.state[i])
            self.conv_tail[i] = pend.buf[:, kept:kept + k - 1]
        self.length += kept
        self._pending = None

    def kv_rows(self, layer: int) -> tuple[T, T]:
        """Read-only views (never write through them) of full-attention layer ``layer``'s (a model layer index)
        committed rows, positions 0..length-1, as stored: (k after k_norm and partial RoPE, v), each
        [nkv, length, d]."""
        j = self.attn_layers.index(layer)
        return self.k_cache[j, 0, :, :self.length], self.v_cache[j, 0, :, :self.length]

    def recurrent_state(self, layer: int) -> tuple[T, T]:
        """Read-only views of linear-attention layer ``layer``'s (a model layer index) committed state: the conv
        tail [K-1, C] (the projected rows at positions length-K+1..length-1, run dtype) and the delta-rule state
        [nv, dk, dv] (float32) after position length-1."""
        i = self.lin_layers.index(layer)
        return self.conv_tail[i, 0], self.state[i, 0]

    def _rollback_row(self, kept: int, first: int, n_states: int) -> int:
        """Which of the states after rows first..first+n_states-1 the commit restores, as an index from
        ``first``: the state after row kept-1 (a verify replays its rows 0..index)."""
        row = kept - 1 - first
        if not 0 <= row < n_states:
            raise ValueError(f"cannot commit {kept} rows: this pass can restore the states after rows "
                             f"{first}..{first + n_states - 1}")
        return row

    def _run(self, ids: list[int], want_logits: bool, keep_rows: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {p0 + r})")
        s, eps = self.shape, self.shape.rms_eps
        pos = torch.arange(p0, p0 + r, device=self.device)
        cos, sin = self.cos[p0:p0 + r], self.sin[p0:p0 + r]
        allowed = self.key_pos[None, :] <= pos[:, None]                                  # [R, cap]
        h = F.embedding(torch.tensor([ids], device=self.device), self.embed)             # [1, R, H]
        taps, pending = [h[0]], []
        for l in range(self.spec.num_layers):
            p = f"model.layers.{l}."
            a = rms_norm(h, norm_gain(self.t[p + "input_layernorm.weight"]), eps)
            if self.hybrid.is_linear(l):
                i = self.lin_layers.index(l)
                pend = Pending(self.conv_tail[i])

                def scan(q, k, v, g, b, i=i, pend=pend):
                    if not keep_rows:                                                     # prefill
                        o, pend.last = delta_chunked(q, k, v, g, b, self.state[i], chunk=PREFILL_CHUNK)
                        return o
                    pend.rows = (q, k, v, g, b)
                    return self.recur(q, k, v, g, b, self.state[i])[0]

                out, pend.buf = deltanet_mixer(self.spec, self.t, p + "linear_attn.", a, self.conv_tail[i], scan,
                                               self.fused)
                pending.append(pend)
                h = h + out
            else:
                j = self.attn_layers.index(l)

                def cached(q, k, v, j=j):
                    self.k_cache[j, :, :, p0:p0 + r] = k
                    self.v_cache[j, :, :, p0:p0 + r] = v
                    return attend(q, self.k_cache[j], self.v_cache[j], allowed)

                h = h + attention_mixer(self.spec, self.t, p + "self_attn.", a, cos, sin, cached)
            h = _mlp(h, self.t, p, eps, self.spec)
            taps.append(h[0])
        self._pending = pending
        self.rows_run += r
        final = rms_norm(h[0], self.final_norm, s.rms_eps)
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final)
