"""The qwen38 DFlash2 fixture: a DFlash2 drafter distilled from the frozen qwen38 fixture target.

    OMP_NUM_THREADS=2 python -m bloomery_cli.families.qwen38.fixture_dflash2 --out fixtures --device cpu   # ~6-10 min

Needs the qwen38 build first (``fixturegen.qwen38_drafts``: qwen38-tiny/ and qwen38-tiny-dflash-b8/ with their
MANIFEST entries). Same rows and budget as that build's DFlash drafter, so the gates qwen38-dflash and
qwen38-dflash2 compare at the same block size: the rows are rebuilt from the same corpus, tokenizer, target
and seeds (``Qwen38DraftsConfig`` of the recorded device / quick / seed: the greedy pool x repeat + the real
training windows), and the depth, target_layer_ids, steps, batch, lr, warmup and anchors per row are read from
the qwen38-tiny-dflash-b8 MANIFEST entry. Training is ``train_dflash2`` (DFlash objective + selector CE over
teacher-forced predecessors; conv identity at init) with the qwen38 forward; selector shape as the qwen3
DFlash2 fixture (T = 2, g = 16, r = 32, K = 8).

Writes qwen38-tiny-dflash2-b8/ (config.json + model.safetensors, bf16), reads it back through the harness's
reader, and adds its files and model entry to MANIFEST.json (every other entry untouched).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.kernels.families.qwen38.model import forward_train as qwen38_forward

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.family_kit import token_stream
from ...fixturegen.install import clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.train import greedy_pool
from ...fixturegen.train_dflash2 import DFlash2Shape, eval_walk, target_shape_of, train_dflash2, write_dflash2
from .fixture_drafts import DFLASH, MAX_TOTAL_BYTES, TARGET, Qwen38DraftsConfig

DFLASH2 = "qwen38-tiny-dflash2-b8"
SEED_OFFSET = 12                     # qwen38_drafts uses seed + 0..11


def _target(out_dir: Path):
    """The fixture target as the build trained it: bf16 weights in float32, the trunk only (no mtp.*)."""
    from ...loading import load_target

    spec = load_target(out_dir / TARGET)
    if spec.family != "qwen38":
        raise RuntimeError(f"{out_dir / TARGET}: a {spec.family} target, expected qwen38")
    return spec


def _rows(cfg: Qwen38DraftsConfig, tok, tq: dict, tspec, fwd, dev: torch.device) -> dict:
    """qwen38_drafts' draft rows, held-out greedy rows and real held-out windows, same seeds."""
    corp = corpus_mod.load_corpus()
    train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
    tshape = target_shape_of(tspec)
    t0 = time.perf_counter()
    pool = greedy_pool(tq, tshape, train.to(dev), cfg.pool_size, cfg.seq, cfg.pool_prefixes, fwd, dev,
                       torch.Generator().manual_seed(cfg.seed + 3), batch=128)
    pfx = cfg.pool_prefixes[0]
    held_rows = greedy_pool(tq, tshape, held.to(dev), cfg.eval_rows, cfg.seq, (pfx,), fwd, dev,
                            torch.Generator().manual_seed(cfg.seed + 6), batch=128)
    pool_s = time.perf_counter() - t0
    starts = torch.randint(0, train.numel() - cfg.seq, (cfg.real_rows,),
                           generator=torch.Generator().manual_seed(cfg.seed + 7))
    rows = torch.cat([pool.repeat(cfg.greedy_repeat, 1), train[starts[:, None] + torch.arange(cfg.seq)].to(dev)])
    n_real = min(cfg.eval_windows, (held.numel() - 1) // cfg.seq)
    return {"rows": rows, "held_rows": held_rows, "real_rows": held[: n_real * cfg.seq].view(n_real, cfg.seq).to(dev),
            "first_anchor": pfx, "pool_seconds": round(pool_s, 1),
            "note": f"{cfg.pool_size} greedy rows of {cfg.seq} (a real training window of P in "
                    f"{list(cfg.pool_prefixes)} tokens + the target's greedy continuation) x {cfg.greedy_repeat}, "
                    f"and {cfg.real_rows} random {cfg.seq}-token training windows (qwen38_drafts' rows, same seeds)"}


@dataclass
class DraftSetup:
    """What a qwen38 drafter build takes from the qwen38 DFlash fixture: its MANIFEST entry (``dentry``), the
    config it was built with, its training budget, the tokenizer, the target (``tq`` f32 on the device, ``tspec``
    over them, ``fwd`` its differentiable forward in the trainers' signature)."""

    dentry: dict
    cfg: Qwen38DraftsConfig
    budget: dict
    tok: Any
    spec: Any
    tq: dict
    tspec: Any
    fwd: Callable


def draft_setup(out_dir: Path, dev: torch.device, steps: int | None = None) -> DraftSetup:
    """The shared start of the qwen38 DFlash2 and DSpark builds (``steps`` overrides the budget's)."""
    from tokenizers import Tokenizer

    man = Manifest.read(out_dir)
    if DFLASH not in man.models or TARGET not in man.models:
        raise RuntimeError(f"{out_dir}/MANIFEST.json has no {TARGET} / {DFLASH} entry: run "
                           "`python -m bloomery_cli.families.qwen38.fixture_drafts` first")
    dentry = man.models[DFLASH]
    made = dentry.get("made_by", {})
    cfg = Qwen38DraftsConfig.for_device(str(made.get("device", "cpu")), bool(made.get("quick", False)),
                                        int(made.get("seed", 1234)))
    tr = dentry["training"]
    budget = {"steps": int(steps or tr["steps"]), "batch": int(tr["batch"]), "lr": float(tr["lr"]),
              "warmup": int(tr["warmup"]), "anchors_per_row": int(tr["anchors_per_row"])}
    spec = _target(out_dir)
    tq = {k: spec.tensors[k].to(dev, torch.float32) for k in spec.tensors if not k.startswith("mtp.")}
    tspec = replace(spec, tensors=tq)

    def fwd(params, _spec, ids):                    # the spec handed in is the qwen3 form of the shape
        return qwen38_forward(params, tspec, ids)

    return DraftSetup(dentry, cfg, budget, Tokenizer.from_file(str(out_dir / "tokenizer.json")), spec, tq, tspec,
                      fwd)


def build_qwen38_dflash2(out_dir: Path, device: str = "cpu", progress=None, steps: int | None = None) -> Manifest:
    """Train the qwen38 DFlash2 drafter with the qwen38 DFlash fixture's rows and budget; write and register it.
    ``steps`` overrides the budget (a pipeline check only; the manifest records it)."""

    from ...loading import load_dflash2

    t_start, out_dir, dev = time.perf_counter(), Path(out_dir), torch.device(device)
    st = draft_setup(out_dir, dev, steps)
    dentry, cfg, budget, tok, spec, tq, tspec, fwd = (st.dentry, st.cfg, st.budget, st.tok, st.spec, st.tq,
                                                      st.tspec, st.fwd)

    shape = DFlash2Shape(num_layers=int(dentry["num_layers"]), block_size=int(dentry["block_size"]),
                         target_layer_ids=tuple(dentry["target_layer_ids"]),
                         mask_token_id=tok.token_to_id(tokenizer_train.MASK))
    seed = cfg.seed + SEED_OFFSET
    with _determinism(cfg.seed):
        data = _rows(cfg, tok, tq, tspec, fwd, dev)
        print(f"rows: {data['rows'].shape[0]} x {data['rows'].shape[1]} (greedy rows {data['pool_seconds']} s), "
              f"{time.perf_counter() - t_start:.0f} s so far", file=sys.stderr, flush=True)
        stored, dspec, stats = train_dflash2(
            tq, tspec, data["rows"], dev, budget["steps"], seed, progress, dshape=shape, batch=budget["batch"],
            seq=data["rows"].shape[1], anchors_per_row=budget["anchors_per_row"], lr=budget["lr"],
            warmup=budget["warmup"], eval_rows=data["held_rows"], eval_first_anchor=data["first_anchor"],
            target_forward=fwd)
        dq = {k: v.to(dev, torch.float32) for k, v in stored.items()}
        real_walk = eval_walk(dq, replace(dspec, tensors=dq), tq, tspec, data["real_rows"], fwd, first_anchor=1)

    work = fresh_work(out_dir, "qwen38-dflash2")
    files = write_dflash2(work / DFLASH2, spec, dspec)
    for f in files:
        os.chmod(f, 0o644)
    back = load_dflash2(work / DFLASH2, spec)
    if any(not torch.equal(back.tensors[k].float(), v.float()) for k, v in stored.items()):
        raise RuntimeError(f"{DFLASH2} does not read back equal to the trained weights")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen38.fixture_dflash2", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "qwen38_dflash2" else f"build_qwen38_dflash2({out_dir}, {device})",
               "builder": "bloomery_cli.families.qwen38.fixture_dflash2", "seed": seed, "versions": _versions(),
               **_device_info(dev), "threads": torch.get_num_threads(),
               "seconds": round(time.perf_counter() - t_start, 1)}
    stats = {k: v for k, v in stats.items() if k != "loss_curve"} | {"loss_curve": stats["loss_curve"]}
    entry = {"files": [f"{DFLASH2}/model.safetensors", f"{DFLASH2}/config.json"], "kind": "dflash2",
             "architecture": "DFlash2DraftModel", "target": TARGET, "num_layers": shape.num_layers,
             "block_size": shape.block_size, "target_layer_ids": list(shape.target_layer_ids),
             "parameters": sum(v.numel() for v in stored.values()),
             "training": {**budget, "seed": seed, "budget_from": f"MANIFEST models[{DFLASH!r}].training",
                          "rows": data["note"], "pool_seconds": data["pool_seconds"]},
             **stats, "held_out_real_walk": real_walk,
             "compare": {"dflash_held_out_greedy_accept_tf":
                         dentry.get("held_out_greedy", {}).get("mean_accept_len_tf"),
                         "dflash2_walk_held_out_greedy_accept_tf": stats["eval_walk"]["walk_mean_accept_len_tf"],
                         "dflash_held_out_real_accept_tf": dentry.get("held_out_real", {}).get("mean_accept_len_tf"),
                         "dflash2_walk_held_out_real_accept_tf": real_walk["walk_mean_accept_len_tf"]},
             "made_by": made_by}
    man = install_model(work, out_dir, DFLASH2, files, entry, MAX_TOTAL_BYTES)
    clean_work(work)
    verified(out_dir, "qwen38 DFlash2 build")
    walk = stats["eval_walk"]["walk_mean_accept_len_tf"]
    print(f"{DFLASH2}: {stats['seconds']} s training, tf accept (held-out greedy) argmax "
          f"{stats['eval_backbone']['mean_accept_len_tf']:.3f}, walk {walk:.3f}"
          f" (dflash {entry['compare']['dflash_held_out_greedy_accept_tf']}); real walk "
          f"{real_walk['walk_mean_accept_len_tf']:.3f} (dflash {entry['compare']['dflash_held_out_real_accept_tf']}); "
          f"fixtures total {man.total_bytes} bytes, {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.families.qwen38.fixture_dflash2",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="override the budget (pipeline check, not for use)")
    a = ap.parse_args(argv)
    build_qwen38_dflash2(a.out, a.device, steps=a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
