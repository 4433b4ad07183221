"""Qwen3.8-Flash-Next ("qwen4exp") trunk on the device (torch, CPU or CUDA); the math is written out in
``reference.families.qwen4exp.model`` (docs/FAMILIES_MOE.md 4.5). Rows x [1, R, S*H]: S hyper-connection streams.

Per layer l: PLE (its one layer) on the streams, then two gated residuals (``ops.gated_hc``), each feeding its block
the mixed input b [1, R, H] and adding the block's output back per stream with the inject gains:
    linear_attention  qwen38's Gated DeltaNet (``families.qwen38.model.deltanet_mixer``), output gate silu or sigmoid
    full_attention    qwen38's gated attention over the KV cache, the causal mask ANDed with the QSA selection
                      (``ops.qsa.qsa_select``) made from the block inputs b of every position so far
    every FFN         the R1 MoE (``families.ffn.moe_ffn``)
The head reads the hyper-connection mixer's collapse of the streams (no final norm).

Engine state (the qwen38 engine's, plus three buffers written by position, so a commit keeps them by length):
  full_attention   KV cache [nkv, cap, d]; the block inputs b [cap, H] (the QSA's keys are pooled from them)
  linear_attention conv tail and delta-rule state, committed exactly as ``Qwen38Target.commit`` does
  PLE              the token ids [cap] (the n-gram history) and norm_conv(gv) rows [cap, S*H] (the dilated conv's
                   tail: the (K-1) N rows before a pass)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bloomery_gates import ple_hash
from bloomery_gates.spec import Qwen4ExpSpec

from ...ops import gated_hc as hc
from ...ops import ple as kple
from ...ops import qsa as kqsa
from ...ops.attention import attend
from ...ops.gated_deltanet import delta_chunked, prepare_torch
from ..ffn import ffn_for, record_routing
from ..qwen38.model import PREFILL_CHUNK, Pending, Qwen38Pass, Qwen38Target, attention_mixer, deltanet_mixer, fused_ops

T = torch.Tensor
ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid}

__all__ = ["Qwen4ExpTarget"]


def gated_out_norm(act):
    """The DeltaNet's output norm with the gate ``act``: (x / sqrt(mean x^2 + eps) * w * act(z)) in float32, rounded
    once to ``dtype`` (``ops.gated_deltanet.gated_rms_norm`` with its silu made a choice)."""
    def norm(x: T, w: T, z: T, eps: float, dtype: torch.dtype) -> T:
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float() * act(z.float())).to(dtype)
    return norm


class Qwen4ExpTarget(Qwen38Target):
    """The target engine over a ``Qwen4ExpSpec``: prefill / verify / commit / kv_rows / recurrent_state as
    ``Qwen38Target`` (see the module docstring for the state); ``taps`` [L+1, R, S*H] are the streams, ``final``
    [R, H] the mixer's output (the head's input); passes carry their MoE routing."""

    TENSORS = ("model.layers.", "model.hyper_connection_mixer.")
    FINAL_NORM = None                                    # the mixer's output is the head's input

    def __init__(self, spec: Qwen4ExpSpec, device: str | torch.device, dtype: torch.dtype, max_len: int,
                 rows: int | None = None, impl: str = "auto"):
        if spec.output_gate not in ACTS:
            raise ValueError(f"qwen4exp engine: GDN output gate {spec.output_gate!r} unknown (expected one of "
                             f"{sorted(ACTS)})")
        ple = spec.ple
        if ple is not None and (len(ple.layers) != 1 or not ple.hashing_known):
            raise ValueError("qwen4exp engine: PLE needs one layer, its hashing tables (HF's base and seed, or the "
                             "GGUF's ple.* arrays) and eos_token_id")
        super().__init__(spec, device, dtype, max_len, rows, impl)
        s = spec.layer
        self.b_cache = torch.zeros(len(self.attn_layers), self.cap, s.hidden_size, device=self.device, dtype=dtype)
        sh = spec.hc.count * s.hidden_size
        self.ids_buf = torch.zeros(self.cap, dtype=torch.int64, device=self.device)
        self.z_buf = torch.zeros(self.cap, sh, device=self.device, dtype=dtype)
        if spec.ple is not None:
            p = spec.ple
            if p.multipliers:                   # a GGUF stores the tables (ple.*); HF's are derived from base, seed
                self.tables = tuple(torch.tensor(v, dtype=torch.int64, device=self.device)
                                    for v in ple_hash.spec_tables(p, spec.vocab_size))
            else:
                self.tables = kple.ngram_tables(spec.vocab_size, p.ngram_size, p.heads_per_ngram, p.vocab_base, 0,
                                                p.seed, self.device)

    def _fused_ops(self) -> tuple:
        """The GDN output gate is the checkpoint's (silu: the fused kernels where they run; sigmoid: torch)."""
        gate = self.spec.output_gate
        prep = fused_ops(self.impl)[0] if gate == "silu" else prepare_torch
        return prep, (fused_ops(self.impl)[1] if gate == "silu" and self.impl == "triton"
                      else gated_out_norm(ACTS[gate]))

    # ------------------------------------------------------------------------------------------------ the blocks

    def _ple(self, l: int, x: T, ids: T, p0: int) -> T:
        """x [R, S*H] -> x + gv + silu(conv(norm_conv(gv))) on the PLE layer, its n-gram history and conv tail read
        from the buffers by position; this pass's ids and norm_conv(gv) rows written there."""
        p, spec, pre = self.spec.ple, self.spec, f"model.layers.{l}.ple."
        n, r, s, eps = p.ngram_size, len(ids), spec.hc.count, spec.layer.rms_eps
        h, sh = spec.hidden_size, x.shape[-1]
        self.ids_buf[p0:p0 + r] = ids
        ctx = torch.full((n - 1,), p.eos_token_id, dtype=torch.int64, device=self.device)
        back = min(n - 1, p0)
        if back:
            ctx[n - 1 - back:] = self.ids_buf[p0 - back:p0]
        hashed = kple.ngram_ids(ids, ctx, *self.tables, p.eos_token_id, p.heads_per_ngram)
        w = kple.PleWeights(self.t[pre + "ple_embedding.ngram_embedding.weight"], self.t[pre + "key_proj.weight"],
                            self.t[pre + "value_proj.weight"], self.t[pre + "norm_key.weight"],
                            self.t[pre + "norm_query.weight"], self.t[pre + "norm_conv.weight"],
                            self.t[pre + "conv1d.weight"].reshape(sh, p.conv_kernel))
        e = w.table[hashed].reshape(r, -1)
        key = hc.grouped_norm(F.linear(e, w.key), w.norm_key, h, eps).view(r, s, h).float()
        query = hc.grouped_norm(x, w.norm_query, h, eps).view(r, s, h).float()
        a = (key * query).sum(-1) / h ** 0.5
        gate = a.sign() * a.abs().clamp_min(1e-6).sqrt()
        gv = (torch.sigmoid(gate)[:, :, None] * F.linear(e, w.value).float()[:, None, :]).to(x.dtype).reshape(r, sh)
        z = hc.grouped_norm(gv, w.norm_conv, h, eps)
        self.z_buf[p0:p0 + r] = z
        span = (p.conv_kernel - 1) * n
        tail = torch.zeros(span, sh, device=self.device, dtype=x.dtype)
        if p0:
            tail[span - min(span, p0):] = self.z_buf[max(0, p0 - span):p0]
        y = kple.dilated_conv(z, w.conv, n, tail)
        return (x.float() + (gv.float() + F.silu(y)).to(x.dtype).float()).to(x.dtype)

    def _residual(self, pre: str, x: T, inject: bool = True) -> hc.HcIn:
        t, s = self.t, self.spec
        return hc.gated_residual(x, t[pre + "hc_norm.weight"], t[pre + "input_mix_weight_down.weight"],
                                 t[pre + "input_mix_weight_up.weight"],
                                 t[pre + "block_inject_weight.weight"] if inject else None, s.hc.count,
                                 s.layer.rms_eps)

    def _run(self, ids: list[int], want_logits: bool, keep_rows: bool) -> Qwen38Pass:
        with record_routing() as rec:
            out = self._layers(ids, want_logits, keep_rows)
        out.routing = {int(p.split(".")[2]): r for p, r in rec}
        return out

    def _layers(self, ids: list[int], want_logits: bool, keep_rows: bool) -> Qwen38Pass:
        p0, r = self.length, len(ids)
        if p0 + r > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {p0 + r})")
        spec, s, q = self.spec, self.shape, self.spec.qsa
        pos = torch.arange(p0, p0 + r, device=self.device)
        cos, sin = self.cos[p0:p0 + r], self.sin[p0:p0 + r]
        causal = self.key_pos[None, :] <= pos[:, None]                                   # [R, cap]
        tok = torch.tensor(ids, dtype=torch.int64, device=self.device)
        x = hc.repeat_streams(F.embedding(tok[None], self.embed), spec.hc.count)          # [1, R, S*H]
        taps, pending = [x[0]], []
        for l in range(spec.num_layers):
            p = f"model.layers.{l}."
            if spec.ple is not None and l in spec.ple.layers:
                x = self._ple(l, x[0], tok, p0)[None]
            a = self._residual(p + "attn_hyper_connection.", x)
            if self.hybrid.is_linear(l):
                i = self.lin_layers.index(l)
                pend = Pending(self.conv_tail[i])

                def scan(qq, k, v, g, b, i=i, pend=pend):
                    if not keep_rows:
                        o, pend.last = delta_chunked(qq, k, v, g, b, self.state[i], chunk=PREFILL_CHUNK)
                        return o
                    pend.rows = (qq, k, v, g, b)
                    return self.recur(qq, k, v, g, b, self.state[i])[0]

                y, pend.buf = deltanet_mixer(spec, self.t, p + "linear_attn.", a.block_in, self.conv_tail[i], scan,
                                             self.fused)
                pending.append(pend)
            else:
                j, ip = self.attn_layers.index(l), p + "self_attn.indexer."
                self.b_cache[j, p0:p0 + r] = a.block_in[0]
                w = kqsa.QsaWeights(self.t[ip + "index_qk_proj.weight"], self.t[ip + "q_layernorm.weight"],
                                    self.t[ip + "k_layernorm.weight"])
                sel = kqsa.qsa_select(self.b_cache[j, :p0 + r], a.block_in[0], pos, w, q.num_heads, q.compress_ratio,
                                      q.budget, s.rms_eps, self.cos, self.sin)
                allowed = causal.clone()
                allowed[:, :p0 + r] &= sel.mask

                def cached(qq, k, v, j=j, allowed=allowed):
                    self.k_cache[j, :, :, p0:p0 + r] = k
                    self.v_cache[j, :, :, p0:p0 + r] = v
                    return attend(qq, self.k_cache[j], self.v_cache[j], allowed)

                y = attention_mixer(spec, self.t, p + "self_attn.", a.block_in, cos, sin, cached)
            x = hc.hc_inject(x, y, a.inject)
            m = self._residual(p + "mlp_hyper_connection.", x)
            x = hc.hc_inject(x, ffn_for(spec)(spec, self.t, p, m.block_in), m.inject)
            taps.append(x[0])
        self._pending = pending
        self.rows_run += r
        final = self._residual("model.hyper_connection_mixer.", x[0], inject=False).block_in
        logits = F.linear(final, self.head)
        return Qwen38Pass(logits.argmax(-1).tolist(), torch.stack(taps), logits if want_logits else None, final)
