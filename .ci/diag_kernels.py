"""Row-place / width invariance of the kernels the qwen38 fast engine's drafted and plain runs share, on CUDA, at
the rollback test's tiny f32 shapes (issue 11's open finding): the delta-rule recurrence (T rows at once vs one
row a launch, state carried), proj (a row at place j of a 4-row pass vs place 0), the Triton attention and the
masked matmul (row j of a 4-row pass at p0 vs row 0 of a pass at p0 + j). Prints bit-equal? per case. Not a test."""
import torch

from bloomery_gates.kernels.graphs import rows_pad
from bloomery_gates.kernels.ops.attention import attend
from bloomery_gates.kernels.triton import deltanet
from bloomery_gates.kernels.triton.decode import TritonOps
from bloomery_gates.kernels.triton.deltanet import delta_recurrent
from bloomery_gates.kernels.triton.gemv import config

dev = "cuda"
torch.manual_seed(0)
RULE = deltanet.recurrent_warps
for nv, dk, dv, warps in ((4, 8, 8, None), (4, 8, 8, 4), (4, 16, 16, None), (4, 16, 16, 4)):
    # the launch's warps forced (None: recurrent_warps' rule)
    deltanet.recurrent_warps = (lambda dk, bv, w=warps: w) if warps else RULE
    q, k = (torch.nn.functional.normalize(torch.randn(1, 4, nv, dk, device=dev), dim=-1) for _ in range(2))
    v = torch.randn(1, 4, nv, dv, device=dev)
    g, b = -torch.rand(1, 4, nv, device=dev), torch.rand(1, 4, nv, device=dev)
    s0 = torch.randn(1, nv, dk, dv, device=dev)
    for t in (2, 3, 4):
        o_all, s_all = delta_recurrent(q[:, :t], k[:, :t], v[:, :t], g[:, :t], b[:, :t], s0)
        s, outs = s0.clone(), []
        for i in range(t):
            o, s = delta_recurrent(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], g[:, i:i + 1], b[:, i:i + 1], s)
            outs.append(o)
        print(f"recurrence nv={nv} dk={dk} warps={warps or 'rule'} T={t}: outputs "
              f"{torch.equal(o_all, torch.cat(outs, 1))} state {torch.equal(s_all, s)}")
deltanet.recurrent_warps = RULE
for dt in (torch.float32, torch.bfloat16):
    for n, kk in ((32, 32), (64, 32), (32, 64), (97, 32), (48, 32)):
        x = torch.randn(4, kk, device=dev).to(dt)
        w = (torch.randn(n, kk, device=dev) / kk ** 0.5).to(dt)
        gn = torch.rand(kk, device=dev) + 0.5
        res = torch.randn(4, n, device=dev).to(dt)
        full = TritonOps.proj(x, w, gn, 1e-6, res, rp=rows_pad(4))
        ok = []
        for j in range(4):
            xs = torch.cat([x[j:j + 1], torch.zeros(3, kk, device=dev, dtype=dt)])
            rs = torch.cat([res[j:j + 1], torch.zeros(3, n, device=dev, dtype=dt)])
            ok.append(torch.equal(TritonOps.proj(xs, w, gn, 1e-6, rs, rp=rows_pad(4))[0], full[j]))
        print(f"proj {dt} {n}x{kk} cfg={config(n, kk)}: row place 0..3 equal {ok}")
for d in (8, 16):
    nq, nkv, cap, p0 = 4, 2, 64, 12
    kc = torch.randn(nkv, cap, d, device=dev)
    vc = torch.randn(nkv, cap, d, device=dev)
    qs = torch.randn(4, nq * d, device=dev)
    pos = torch.arange(cap, device=dev)
    full_m = attend(qs.view(1, 4, nq, d).transpose(1, 2), kc[None], vc[None],
                    pos[None, :] <= (p0 + torch.arange(4, device=dev))[:, None])[0]
    okm, okt = [], []
    full_t = TritonOps.attention(qs, nq, nkv, d, kc, vc, torch.tensor([p0], device=dev)) if d >= 16 else None
    for j in range(4):
        one = torch.cat([qs[j:j + 1], torch.randn(3, nq * d, device=dev)])
        m = attend(one.view(1, 4, nq, d).transpose(1, 2), kc[None], vc[None],
                   pos[None, :] <= (p0 + j + torch.arange(4, device=dev))[:, None])[0]
        okm.append(torch.equal(m[0], full_m[j]))
        if d >= 16:
            okt.append(torch.equal(TritonOps.attention(one, nq, nkv, d, kc, vc, torch.tensor([p0 + j], device=dev))[0],
                                   full_t[j]))
    print(f"attention d={d}: masked matmul row place 0..3 equal {okm}; triton {okt or 'n/a (d < 16)'}")
