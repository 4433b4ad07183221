"""Which part of the qwen38 fast engine's drafted-vs-plain run differs on CUDA (issue 11's open finding):
per k, logits / continuation / state / conv tail / K cache equal?, with the projection kernel on and off and
at head_dim 8 (masked-matmul attention) and 16 (the Triton attention). Device diagnostic, not a test."""
import os
import sys

sys.path.insert(0, "tests")
import torch  # noqa: E402
from test_qwen38 import FULL, IDS, LIN, make_qwen38  # noqa: E402

from bloomery_gates.kernels.families.qwen38_fast import FastQwen38Target  # noqa: E402

TYPES = (LIN, FULL, LIN, LIN, FULL)


def run(spec, attention, rows=4):
    prompt, window, after = IDS[:12], IDS[12:12 + rows], IDS[12 + rows:16 + rows]

    def engine():
        e = FastQwen38Target(spec, "cuda", torch.float32, 64, rows, max_width=rows, impl="triton",
                             attention=attention)
        e.prefill(prompt)
        return e
    plain = engine()
    pl = []
    for x in window + after:
        pl.append(plain.verify([x], logits=True).logits[0].clone())
        plain.commit(1)
    pl = torch.stack(pl)
    for k in range(1, rows + 1):
        eng = engine()
        d = eng.verify(window, logits=True).logits[:k].clone()
        eng.commit(k)
        cont = []
        for x in window[k:] + after:
            cont.append(eng.verify([x], logits=True).logits[0].clone())
            eng.commit(1)
        cont = torch.stack(cont)
        print(f"  k={k} attn={eng.attention} drafted={torch.equal(d, pl[:k])} "
              f"({(d - pl[:k]).abs().max().item():.1e}) cont={torch.equal(cont, pl[k:])} "
              f"({(cont - pl[k:]).abs().max().item():.1e}) state={torch.equal(eng.state, plain.state)} "
              f"conv={torch.equal(eng.conv_tail, plain.conv_tail)} "
              f"kcache={torch.equal(eng.k_cache[:, :, :eng.length], plain.k_cache[:, :, :plain.length])}")


for d in (8, 16):
    spec = make_qwen38(types=TYPES, nk=2, nv=4, dk=8, d=d)
    for att in ("auto", "torch") + (("triton",) if d >= 16 else ()):
        print(f"head_dim={d} attention={att} BLOOMERY_GEMV={os.environ.get('BLOOMERY_GEMV', 'auto')}")
        try:
            run(spec, att)
        except Exception as e:  # noqa: BLE001
            print("  error", type(e).__name__, str(e)[:200])
