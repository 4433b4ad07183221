"""Issue 26's MXFP4 record (run by .ci/device-mxfp4.sh on the H200; on the host it runs too, for a check): a deepseek4
checkpoint with native FP4 routed experts at a width where they dominate (tests/deepseek4_factory.py
``write_random_fp4``: hidden 1024, 64 experts of 512, top-6, 4 layers, random bytes), the engine built on the device,
then a prefill of P ids and a verify of R rows. Printed and recorded (JSON under --out):

    plan           ``bloomery plan``'s terms for the same files at the engine's context (read_target, terms_of,
                   bytes_at with P prefill rows): resident (weights + caches), the transient, the total
    measured       CUDA: torch.cuda.memory_allocated after the build, torch.cuda.max_memory_allocated after the
                   prefill + verify (both from before the build); host: the engine's resident storages after the
                   build, + the host allocator's peak during the run (``plan.peak.allocator_peak_of``: it sees
                   the buffers ops make inside themselves, as torch.cuda.max_memory_allocated does)
    ratios         planned / measured after load, and after the run (the issue's "agree within 2%")
    experts        the packed experts' resident bytes (codes + e8m0 scales) vs the same weights in bf16 (2 bytes
                   each): the issue's "a quarter of bf16" (4.25 / 16 = 0.2656)

Usage: python3 -P .ci/device_mxfp4.py --out DIR [--device cuda] [--hidden 1024 --experts 64 --ff 512 --topk 6
--vocab 8192 --ctx 1024 --prompt 256]. Exit 0 when both ratios are within --tolerance (default 0.02), else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

VERIFY_ROWS = 4


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()

    import deepseek4_factory as fac
    import torch

    from bloomery_cli.families.deepseek4.reader import deepseek4_from_hf
    from bloomery_cli.plan.core import ELEM, bytes_at, terms_of
    from bloomery_cli.plan.measure import _resident
    from bloomery_cli.plan.model import read_target
    from bloomery_gates.kernels.families.deepseek4.model import Deepseek4Target

    t0 = time.perf_counter()
    dims = fac.Dims(h=a.hidden, v=a.vocab, e=a.experts, ff=a.ff, k=a.topk)
    work = Path(tempfile.mkdtemp(prefix="ds4-mxfp4-"))
    ckpt = fac.write_random_fp4(work / "ckpt", dims)
    (ckpt / "config.json").write_text(json.dumps(json.loads((ckpt / "config.json").read_text())
                                                 | {"max_position_embeddings": 2 * a.ctx}))
    made_s = time.perf_counter() - t0
    device, dtype = torch.device(a.device), torch.bfloat16
    cuda = device.type == "cuda"

    # the plan, headers only: the engine's cap is max_len + R = ctx + 1 (plan's cap at ctx with one row a pass)
    plan_model = read_target(ckpt)
    terms = terms_of(plan_model, None, "bf16", device.type)
    planned = bytes_at(plan_model, terms, a.ctx, 1, False, ELEM["bf16"], prefill_rows=a.prompt)
    planned_resident = planned["total"] - planned["workspace"] - planned["runtime_arena"]

    spec = deepseek4_from_hf(ckpt)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.prompt + VERIFY_ROWS,), generator=g).tolist()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t1 = time.perf_counter()
    eng = Deepseek4Target(spec, device, dtype, max_len=a.ctx + 1 - VERIFY_ROWS, rows=VERIFY_ROWS)
    resident = _resident(eng)
    if cuda:
        torch.cuda.synchronize(device)
        after_load = torch.cuda.memory_allocated(device) - base
        load_peak = torch.cuda.max_memory_allocated(device) - base
    else:
        after_load = load_peak = resident
    load_s = time.perf_counter() - t1

    def run() -> list[int]:
        eng.prefill(ids[:a.prompt])
        out = eng.verify(ids[a.prompt:])
        eng.commit(VERIFY_ROWS)
        return out.argmax

    t2 = time.perf_counter()
    if cuda:
        got = run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        what = "torch.cuda.max_memory_allocated from before the build"
    else:
        from bloomery_cli.plan.peak import allocator_peak_of
        got, during = allocator_peak_of(run)
        peak = resident + during
        what = ("resident storages after the build + the host allocator's peak during the run "
                "(plan.peak.allocator_peak_of: the ops' inner buffers too, as CUDA's allocator counts them)")
    run_s = time.perf_counter() - t2

    packed = {n: x for n, x in eng.t.items() if ".experts." in n}
    expert_bytes = sum(x.nbytes for x in packed.values())
    n_weights = sum(x.numel() * 2 for n, x in packed.items() if not n.endswith("_scale_inv"))
    rec = {
        "record": "ds4-mxfp4-plan", "device": str(device), "dtype": "bf16",
        "shape": {"hidden": a.hidden, "experts": a.experts, "expert_ff": a.ff, "top_k": a.topk, "vocab": a.vocab,
                  "layers": fac.L, "ctx": a.ctx, "prompt": a.prompt, "verify_rows": VERIFY_ROWS},
        "plan": {"weights": terms.target_weights, "resident": planned_resident, "terms": planned,
                 "packed_expert_bytes": plan_model.meta["packed_expert_bytes"]},
        "measured": {"after_load": after_load, "load_peak": load_peak, "peak_after_run": peak, "what": what,
                     "engine_resident_storages": resident},
        "ratio_load": round(planned_resident / after_load, 5), "ratio_peak": round(planned["total"] / peak, 5),
        "experts": {"resident_bytes": expert_bytes, "weights": n_weights, "bf16_bytes": 2 * n_weights,
                    "ratio_to_bf16": round(expert_bytes / (2 * n_weights), 5),
                    "plan_equals_resident": expert_bytes == plan_model.meta["packed_expert_bytes"]},
        "verify_ids": got, "tolerance": a.tolerance,
        "wall_s": {"checkpoint": round(made_s, 2), "load": round(load_s, 2), "run": round(run_s, 2)},
    }
    if cuda:
        rec["gpu"] = torch.cuda.get_device_name(device)
    rec["within"] = abs(rec["ratio_load"] - 1) <= a.tolerance and abs(rec["ratio_peak"] - 1) <= a.tolerance
    print(f"plan: weights {terms.target_weights:,} resident {planned_resident:,} total {planned['total']:,} "
          f"(workspace {planned['workspace']:,}, arena {planned['runtime_arena']:,})")
    print(f"measured: after load {after_load:,} (load peak {load_peak:,}); peak after prefill {a.prompt} + verify "
          f"{VERIFY_ROWS}: {peak:,} ({what})")
    print(f"ratio planned/measured: after load {rec['ratio_load']:.4f}, peak {rec['ratio_peak']:.4f} "
          f"(tolerance {a.tolerance}) {'PASS' if rec['within'] else 'FAIL'}")
    print(f"experts resident {expert_bytes:,} bytes for {n_weights:,} weights = {rec['experts']['ratio_to_bf16']:.4f}"
          f" of bf16's {2 * n_weights:,} (4.25/16 = 0.2656); plan's packed bytes equal: "
          f"{rec['experts']['plan_equals_resident']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"ds4-mxfp4-{device.type}-bf16.json").write_text(json.dumps(rec, indent=2))
    return 0 if rec["within"] and rec["experts"]["plan_equals_resident"] else 1


if __name__ == "__main__":
    sys.exit(main())
