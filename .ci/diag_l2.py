"""Issue 27 diagnostic (device only, never CI): can the HBM-idle time of a decode step's latency-bound kernels
(attention, rope, rms, silu: about 12 us a layer at 8B) pull the next projection's weights into L2?

  1. proj [N, K] (kernels.triton.gemv) with the L2 flushed (cold) against right after a touch kernel read the
     same weight (warm): the most a prefetch can give that projection
  2. the touch kernel's time for a 4096x4096 bf16 weight (33.5 MB) with P programs (how many SMs it needs)
  3. a latency-bound chain (the rms kernel on one row, 8 launches ~ the attention's glue) on the main stream alone,
     and with the touch kernel on a side stream at the same time (does the prefetch slow the chain?)
python3 -P .ci/diag_l2.py  -> one line per measurement
"""
import torch
import triton
import triton.language as tl

from bloomery_gates.kernels.triton.gemv import proj


@triton.jit
def _touch(w_ptr, n, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(pid * BLOCK, n, step):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def touch(w, out, progs):
    _touch[(progs,)](w, w.numel(), out, BLOCK=2048, num_warps=8)


def timed(fn, reps=50, before=None):
    ts = []
    for _ in range(reps):
        if before:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    dev = torch.device("cuda")
    flush_buf = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    out = torch.zeros(1024, device=dev)

    def flush():
        flush_buf.zero_()
    for n, k in [(4096, 4096), (6144, 4096), (4096, 12288), (24576, 4096)]:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        res = torch.zeros(1, n, device=dev, dtype=torch.bfloat16)
        o = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        def call(x=x, w=w, res=res, o=o, narrow=n <= 8192):
            return proj(x, w, None, 1e-6, res, o) if narrow else torch.mm(x, w.t(), out=o)
        call()
        torch.cuda.synchronize()
        cold = timed(call, before=flush)
        warm = timed(call, before=lambda w=w: (flush(), touch(w, out, 132)))
        mb = n * k * 2 / 1e6
        print(f"l2 proj {n}x{k} {mb:.1f}MB cold_us={cold:.1f} ({mb / cold * 1e3:.0f} GB/s) "
              f"after_touch_us={warm:.1f} ({mb / warm * 1e3:.0f} GB/s)", flush=True)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for p in (8, 16, 32, 66, 132, 264):
        t = timed(lambda p=p: touch(w, out, p), before=flush)
        print(f"l2 touch 33.5MB progs={p} us={t:.1f} GBps={33.55e6 / t / 1e3:.0f}", flush=True)
    row = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    gw = torch.ones(4096, device=dev, dtype=torch.bfloat16)

    def chain():
        y = row
        for _ in range(8):
            y = torch.nn.functional.rms_norm(y, (4096,), gw, 1e-6)
        return y
    side = torch.cuda.Stream()
    alone = timed(chain, before=flush)
    for p in (16, 32, 66):
        def both(p=p):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                touch(w, out, p)
            chain()
            torch.cuda.current_stream().wait_stream(side)
        t = timed(both, before=flush)
        print(f"l2 chain8 alone_us={alone:.1f} with_touch progs={p} us={t:.1f}", flush=True)


if __name__ == "__main__":
    main()
