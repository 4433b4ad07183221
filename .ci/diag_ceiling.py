"""Issue 27 diagnostic (device only, never CI): what fusing the 8B step's small kernels away could give at most.
One process, the qwen3-8b shape's random weights made once; per VARIANT a fresh engine whose decode ops skip the
named small kernels (the numbers are then wrong: a timing ceiling, not an engine), its plain loop run once for its
ids, then ``bench.chain.measure_variant``: one graphed plain step's device time and the chained plain decode at K = 16
(tok/s against the read roofline, ids against the plain loop's). A fusion that removes a
kernel can at best reach its variant's time; where a variant gains little, that fusion is not worth building.

python3 -P .ci/diag_ceiling.py [-n 256] [VARIANT ...]
  VARIANT: base, or skipped kernels joined by "+": rope (q/k norm + RoPE + KV store), combine (the attention's
  second launch), attn (both attention launches), rms (the norm before cuBLAS gate/up), silu, embed (the
  embedding gather: a copy of row 0), argmax; and old-norm (real numbers, the ids compared with base's): the rms
  kernel before cuBLAS gate/up instead of ffn_input's deferred norm (at e360aaa also old-combine, the attention's
  combine as its own launch, against the since dropped fused combine). VARIANT%NxK[,NxK]: those projection
  shapes launched without PDL (e.g. base%6144x4096).
"""
import argparse
from contextlib import ExitStack
from unittest import mock

import torch
import torch.nn.functional as F

from bloomery_cli.bench.chain import measure_variant
from bloomery_cli.bench.dflash2 import copy_bandwidth
from bloomery_cli.bench.shapes import SHAPES, random_pair, read_per_step
from bloomery_gates.kernels import graphs
from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target
from bloomery_gates.kernels.triton import decode as dec
from bloomery_gates.kernels.triton import gemv
from bloomery_gates.kernels.triton.decode import TritonOps


class NoLaunch:
    """A kernel stand-in whose launches do nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


def skipping(skip: set[str]) -> type:
    """TritonOps with the named launches left out (outputs of the right shape, wrong numbers)."""

    class Ops(TritonOps):
        @staticmethod
        def qk_rope_store(*a, **k):
            if "rope" not in skip:
                TritonOps.qk_rope_store(*a, **k)

        @staticmethod
        def attention(qkv, nq, nkv, d, kc, vc, p0, causal=True, gate=None, first=0):
            if "attn" in skip:
                return qkv[:, :nq * d]
            if "combine" in skip:
                TritonOps.attention(qkv, nq, nkv, d, kc, vc, p0, causal, gate, first)   # the split launch only
                return qkv[:, :nq * d]                                                 # (main patches the combine)
            return TritonOps.attention(qkv, nq, nkv, d, kc, vc, p0, causal, gate, first)

        @staticmethod
        def proj(x, w, g32, eps, res=None, out=None, rp=None):
            if "rms" in skip and g32 is not None and w.shape[0] > 8192 and w.shape[0] < 100000:
                return graphs.proj(x, w, None, eps, res, out)
            return TritonOps.proj(x, w, g32, eps, res, out, rp)

        @staticmethod
        def silu_mul(gu, ss=None, h=1, eps=0.0):
            return gu[:, :gu.shape[1] // 2] if "silu" in skip else TritonOps.silu_mul(gu, ss, h, eps)

        @staticmethod
        def ffn_input(o, wo, h, g32, wgu, eps, rp):
            if skip & {"rms", "old-norm", "silu"}:      # the unfused composition (with its skips)
                return graphs.ffn_input_of(Ops, o, wo, h, g32, wgu, eps, rp)
            return TritonOps.ffn_input(o, wo, h, g32, wgu, eps, rp)

    return Ops


def plain_proj(shapes: set[tuple[int, int]]):
    """gemv.proj with the weights of ``shapes`` launched without PDL (the rest as configured)."""
    orig = gemv.proj

    def proj(x, w, *args, **kw):
        if tuple(w.shape) not in shapes:
            return orig(x, w, *args, **kw)
        with mock.patch.object(gemv.pdl_policy, "mode", lambda d: (0, None)):
            return orig(x, w, *args, **kw)
    return proj


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("variants", nargs="*", default=["base", "rope", "combine", "attn", "rms", "silu",
                                                    "rope+combine+rms+silu", "base"])
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    bw = copy_bandwidth(dev)
    tspec, _ = random_pair(SHAPES[a.shape], dev, dt)
    read = read_per_step(tspec)
    prompt = torch.randint(0, tspec.vocab_size, (a.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"diag_ceiling n={a.n} copy_GBps={bw / 1e9:.0f} roofline_read_tok_s={bw / read:.1f}", flush=True)
    base = None
    for v in a.variants:
        v, _, plain = v.partition("%")     # base%6144x4096: that projection shape launched without PDL
        skip = set() if v == "base" else set(v.split("+"))
        target = FastQwen3Target(tspec, dev, dt, a.prompt_len + a.n + 64, max_width=16, graphs=True)
        target.ops = skipping(skip)
        with ExitStack() as patches:
            if "combine" in skip:       # split only: the combine launch replaced by nothing
                patches.enter_context(mock.patch.object(dec, "_attn_combine_kernel", NoLaunch()))
            if "embed" in skip:
                patches.enter_context(mock.patch.object(F, "embedding", lambda ids, w: w[:ids.shape[0]]))
            if "argmax" in skip:
                patches.enter_context(mock.patch.object(torch, "argmax", lambda x, dim=-1, out=None: out))
            if plain:
                patches.enter_context(mock.patch.object(gemv, "proj", plain_proj(
                    {tuple(int(d) for d in s.split("x")) for s in plain.split(",")})))
            m = measure_variant(target, prompt, a.n)
        base = m.ids if v == "base" and base is None else base
        same = "" if base is None else f" ids_as_base={m.ids == base}"
        print(f"skip={v}{'%' + plain if plain else ''}{same} {m.line(read, bw)}", flush=True)
        del target
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
