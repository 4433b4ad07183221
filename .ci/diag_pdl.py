"""Issue 27 diagnostic (device only, never CI): programmatic dependent launch in the 8B decode step
(kernels/triton/pdl.py). One process, the qwen3-8b shape's random weights made once; per BLOOMERY_PDL setting a
fresh engine (its own graphs), the plain loop (ids, tok/s), the device time of one graphed plain step, and the
chained plain decode at K = 16 (tok/s against the read roofline, ids equal to the plain loop's). Every setting's
plain ids must equal those of PDL off: the setting changes when kernels start, never what they compute.

python3 -P .ci/diag_pdl.py [-n 256] [SETTING ...]
  SETTING: off, or BLOOMERY_PDL's flags joined by "+" (on, early, l2=MB), and "gu": the 8B gate/up [24576, 4096]
  in the projection kernel too (tiles 128 x 128, its RMSNorm folded; BLOOMERY_GEMV_CONFIGS) instead of cuBLAS;
  "tNxK=BNxBKxWARPSxSTAGESxSPLITS": the projection kernel's tiles for the [N, K] weight (BLOOMERY_GEMV_CONFIGS).
  A setting whose tiles change a sum's order may change the plain ids (reported, not a defect); its chain must
  still equal its own plain run.
DIAG_L2_HINT=evict_last python3 -P .ci/diag_pdl.py ...: the projections' L2 prefetch (l2=MB) marks its lines
  evict-last (createpolicy + cp.async.bulk.prefetch.L2's cache hint), for the whole process (run it in its own
  process, with its own TRITON_CACHE_DIR: the kernel's cache key does not see the patch; results/h200/speed/
  cd7df9a-l2hint)
python3 -P .ci/diag_pdl.py --flags FILE [--shape S]: the tNxK= flags of a tiles file (bench.gemv --write-configs)
  for the shape's weights, joined by "+" (a setting's tail), run nothing
python3 -P .ci/diag_pdl.py --env DIR SETTING: write the environment that SETTING runs under to DIR/env.sh (export
  lines; its tiles as DIR/tiles.json), print that path, run nothing (the device scripts run a bench under it)
"""
import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from bloomery_cli.bench.chain import measure_variant
from bloomery_cli.bench.dflash2 import copy_bandwidth
from bloomery_cli.bench.shapes import SHAPES, random_pair, read_per_step
from bloomery_gates.kernels.families.qwen3.model import FastQwen3Target
from bloomery_gates.kernels.triton import gemv, pdl

GATE_UP = {"24576x4096": [128, 128, 4, 4, 1]}


@triton.jit
def _prefetch_last(ptrs, nbytes):
    """``pdl.prefetch_rows``, the prefetched lines marked evict-last in L2."""
    tl.inline_asm_elementwise("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                              "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; } // $0",
                              "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)


if os.environ.get("DIAG_L2_HINT"):
    if os.environ["DIAG_L2_HINT"] != "evict_last":
        raise SystemExit(f"DIAG_L2_HINT={os.environ['DIAG_L2_HINT']!r}: expected evict_last")
    pdl.prefetch_rows = _prefetch_last


def _tiles_flag(f: str) -> bool:
    return f.startswith("t") and "=" in f


def environment(setting: str, folder: Path) -> dict[str, str | None]:
    """A SETTING's environment: BLOOMERY_PDL, and BLOOMERY_GEMV_CONFIGS (its tiles written to folder/tiles.json, or
    None: unset)."""
    flags = setting.split("+")
    tiles = dict(GATE_UP) if "gu" in flags else {}
    for f in flags:
        if _tiles_flag(f):
            shape, _, spec = f[1:].partition("=")
            tiles[shape] = [int(v) for v in spec.split("x")]
    pdl = [f for f in flags if f not in ("off", "gu") and not _tiles_flag(f)]
    cfg = None
    if tiles:
        cfg = folder / "tiles.json"
        cfg.write_text(json.dumps(tiles))
    return {"BLOOMERY_PDL": ",".join(pdl) or "off", "BLOOMERY_GEMV_CONFIGS": str(cfg) if cfg else None}


def tile_flags(configs: Path, shape: str) -> str:
    """The tNxK= flags (``environment``'s spelling) of a tiles file's entries (``bloomery_cli.bench.gemv
    --write-configs``) for the weights of ``shape``; entries left to cuBLAS (null) are left out."""
    from bloomery_cli.bench.gemv import SHAPES as GEMV_SHAPES
    from bloomery_cli.bench.gemv import WIDE

    mine = {f"{n}x{k}" for n, k, *_ in GEMV_SHAPES.get(shape, []) + WIDE.get(shape, [])}
    tiles = json.loads(configs.read_text())
    return "+".join(f"t{w}=" + "x".join(map(str, c)) for w, c in tiles.items() if c and w in mine)


def write_env(setting: str, folder: Path) -> Path:
    """``environment`` as folder/env.sh (export / unset lines)."""
    env = environment(setting, folder)
    out = folder / "env.sh"
    out.write_text("".join(f"export {k}={v}\n" if v is not None else f"unset {k}\n" for k, v in env.items()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--env", type=Path, default=None, help="write the one SETTING's environment there, run nothing")
    ap.add_argument("--flags", type=Path, default=None, help="print a tiles file's flags for --shape, run nothing")
    ap.add_argument("settings", nargs="*", default=["off", "on+early", "on+early+l2=4", "on+early+l2=12",
                                                    "on+early+l2=24", "on+early+gu", "on+early+gu+l2=12", "off"])
    a = ap.parse_args()
    if a.flags is not None:
        print(tile_flags(a.flags, a.shape))
        return 0
    if a.env is not None:
        if len(a.settings) != 1:
            ap.error("--env takes exactly one SETTING")
        print(write_env(a.settings[0], a.env))
        return 0
    dev, dt = torch.device("cuda"), torch.bfloat16
    bw = copy_bandwidth(dev)
    tspec, _ = random_pair(SHAPES[a.shape], dev, dt)
    read = read_per_step(tspec)
    prompt = torch.randint(0, tspec.vocab_size, (a.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"diag_pdl shape={a.shape} n={a.n} copy_GBps={bw / 1e9:.0f} read_per_step={read} "
          f"roofline_read_tok_s={bw / read:.1f}", flush=True)
    base = None
    bad = 0
    for s in a.settings:
        env = environment(s, Path(tempfile.mkdtemp()))
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tiles = env["BLOOMERY_GEMV_CONFIGS"] is not None
        gemv._measured.cache_clear()
        try:
            target = FastQwen3Target(tspec, dev, dt, a.prompt_len + a.n + 64, max_width=16, graphs=True)
            target.prefill([1, 2, 3])
            target.capture([1])
            m = measure_variant(target, prompt, a.n, iters=20)
        except Exception as e:  # noqa: BLE001  (a setting that does not run is reported, the others go on)
            print(f"pdl={s} error {type(e).__name__}: {str(e)[:300]}", flush=True)
            bad += 1
            continue
        base = m.ids if base is None else base
        same = m.ids == base
        bad += int(not ((same or tiles) and m.chain_ids_as_plain))    # tiles may reorder a sum: ids reported only
        print(f"pdl={s} {m.line(read, bw)} plain_ids_same_as_first={same}", flush=True)
        del target
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
