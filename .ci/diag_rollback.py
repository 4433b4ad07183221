"""Which part of the qwen38 fast engine's drafted-vs-plain run differs on CUDA (issue 11's open finding): per k,
logits / continuation / state / conv tail / K cache bit-equal?, at head_dim 8 (masked-matmul attention) and 16 (the
Triton attention too); run it with BLOOMERY_GEMV=off and without (.ci/device-speed.sh's diag step). Not a test."""
import os
import sys

sys.path.insert(0, "tests")
from test_qwen38 import FULL, LIN, make_qwen38  # noqa: E402
from test_qwen38_fast import drafted_vs_plain_parts  # noqa: E402

for d in (8, 16):
    spec = make_qwen38(types=(LIN, FULL, LIN, LIN, FULL), nk=2, nv=4, dk=8, d=d)
    for att in ("auto", "torch") + (("triton",) if d >= 16 else ()):
        print(f"head_dim={d} attention={att} BLOOMERY_GEMV={os.environ.get('BLOOMERY_GEMV', 'auto')}")
        try:
            for k, part in enumerate(drafted_vs_plain_parts(spec, "triton", attention=att, dev="cuda"), 1):
                print(f"  k={k} " + " ".join(f"{n}={v}" for n, v in part.items()))
        except Exception as e:  # noqa: BLE001  (a variant that cannot run here is reported, the others still run)
            print("  error", type(e).__name__, str(e)[:200])
