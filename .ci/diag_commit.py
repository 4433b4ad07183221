"""Issue 27 diagnostic (device only, never CI): the hybrid engine's commit, one launch for every linear layer
(kernels/families/qwen38/fast.py at fa294b8), against the per-layer replay before it, on one card. One process, the
qwen38-27b width's random weights (``--layers`` of its pattern) made once; per VARIANT a fresh engine, its plain
loop run once for its ids, then ``bench.chain.measure_variant``: one graphed plain step (verify + commit of one row)
and the chained plain decode at K = 16 (tok/s against the read roofline, ids against the plain loop's).

python3 -P .ci/diag_commit.py [-n 128] [--layers 16] [VARIANT ...]
  VARIANT: new (the tree), old (each linear layer's commit its own launch, outputs written; a chained step's row
  replayed by the commit; a verify writing the state it discards). Both must give the same ids: same loop body.
"""
import argparse
from contextlib import ExitStack
from unittest import mock

import torch

from bloomery_cli.bench.chain import measure_variant
from bloomery_cli.bench.dflash2 import copy_bandwidth
from bloomery_cli.bench.hybrid import read_bytes
from bloomery_cli.bench.hybrid_shapes import HYBRID_SHAPES, random_qwen38
from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target, PassBufs


def _old_commit_pass(self, kept: int) -> None:
    for i in range(len(self.lin_layers)):
        self.recur(*(x[i, :, :kept] for x in self.rows_buf), self.state[i], self.state[i])
    self._commit_tail(kept)


def _old_chain_pass(self, k: int) -> None:
    c, kk = self.chain, self.hybrid.linear_conv_kernel_dim
    for j in range(k):
        self.forward(c.ids[j:j + 1], c.p0, PassBufs(self.proj[:, :kk], tuple(x[:, :, :1] for x in self.rows_buf),
                                                    self.taps_buf[:, :1], self.final_buf[:1], self.logits_buf[:1],
                                                    c.ids[j + 1:j + 2]))
        _old_commit_pass(self, 1)
        c.p0.add_(1)
    c.ids[:1].copy_(c.ids[k:k + 1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("variants", nargs="*", default=["new", "old", "new", "old"])
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    bw = copy_bandwidth(dev)
    tspec, _ = random_qwen38(HYBRID_SHAPES["qwen38-27b"], dev, dt, a.layers)
    read = read_bytes(tspec)
    prompt = torch.randint(0, tspec.vocab_size, (a.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"diag_commit layers={a.layers} n={a.n} copy_GBps={bw / 1e9:.0f} roofline_read_tok_s={bw / read:.1f}",
          flush=True)
    base = None
    for v in a.variants:
        target = FastQwen38Target(tspec, dev, dt, a.prompt_len + a.n + 64, max_width=16, graphs=True)
        with ExitStack() as patches:
            if v == "old":
                recur = target.recur
                target.recur = lambda *x, store=True, _r=recur, **k: _r(*x, **k)   # the verify writes its state again
                patches.enter_context(mock.patch.object(FastQwen38Target, "_commit_pass", _old_commit_pass))
                patches.enter_context(mock.patch.object(FastQwen38Target, "_chain_pass", _old_chain_pass))
            m = measure_variant(target, prompt, a.n)
        base = m.ids if base is None else base
        print(f"variant={v} ids_as_first={m.ids == base} {m.line(read, bw)}", flush=True)
        del target
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
