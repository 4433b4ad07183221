"""A DFlash drafter for the qwen35moe fixture (``qwen35moe-tiny-dflash-b8``), distilled from the trained target.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen35moe.fixture_dflash --out fixtures --device cpu

The qwen38 DFlash recipe (``qwen38_drafts``: ``train.train_draft`` unchanged, 2 layers, block 8, target_layer_ids
(0, 1, 2): three Gated DeltaNet outputs) on the frozen bf16 ``qwen35moe-tiny`` (read from ``<out>``, no retraining),
over greedy rows of the target (a real training window of P tokens + its greedy continuation) and real windows.
Writes ``<out>/qwen35moe-tiny-dflash-b8/`` (z-lab layout), reads it back, adds its MANIFEST.json entry.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from bloomery_gates.kernels.drafts.dflash import forward_train as dflash_forward
from bloomery_gates.kernels.families.qwen38.model import forward_train

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_draft
from ...fixturegen.family_kit import token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest
from ...fixturegen.train import (
    DraftShape,
    Reporter,
    TrainConfig,
    eval_draft,
    greedy_pool,
    init_draft,
    round_bf16,
    train_draft,
)
from ...fixturegen.train_dflash2 import target_shape_of

TARGET, DFLASH = "qwen35moe-tiny", "qwen35moe-tiny-dflash-b8"


def build(out: Path, device: str = "cpu", steps: int = 300, pool_size: int = 48, real_rows: int = 1024,
          seed: int = 1234, progress=None) -> Manifest:
    from tokenizers import Tokenizer

    from ...loading import load_dflash, load_target

    t_start, dev = time.perf_counter(), torch.device(device)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    spec = load_target(out / TARGET)
    tq = {n: spec.tensors[n].to(dev, torch.float32) for n in spec.tensors if not n.startswith("mtp.")}
    tspec = replace(spec, tensors=tq)
    tshape = target_shape_of(tspec)

    def fwd(params, _spec, ids):
        return forward_train(params, tspec, ids)

    rep = Reporter(progress, every=25)
    cfg = TrainConfig(steps=steps, batch=16, seq=128, warmup=max(1, steps // 10), log_every=25, seed=seed + 11)
    with _determinism(seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        pool = greedy_pool(tq, tshape, train.to(dev), pool_size, cfg.seq, (64,), fwd, dev,
                           torch.Generator().manual_seed(seed + 3), batch=64, reporter=rep)
        held_rows = greedy_pool(tq, tshape, held.to(dev), 16, cfg.seq, (64,), fwd, dev,
                                torch.Generator().manual_seed(seed + 6), batch=64)
        starts = torch.randint(0, train.numel() - cfg.seq, (real_rows,),
                               generator=torch.Generator().manual_seed(seed + 7))
        rows = torch.cat([pool.repeat(8, 1), train[starts[:, None] + torch.arange(cfg.seq)].to(dev)])
        dshape = DraftShape(2, 8, (0, 1, 2), tok.token_to_id(tokenizer_train.MASK))
        dp = {k: v.to(dev) for k, v in init_draft(tshape, dshape, seed + 10).items()}
        log = train_draft(dp, dshape, tq, tshape, rows, cfg, 8, fwd, dflash_forward, dev, rep)
        d_bf16 = round_bf16(dp)
        dq = {k: v.to(dev, torch.float32) for k, v in d_bf16.items()}
        greedy = eval_draft(dq, dshape, tq, tshape, held_rows, fwd, dflash_forward, first_anchor=64)
    work = fresh_work(out, "qwen35moe-dflash")
    files = write_draft(work / DFLASH, tshape, dshape, d_bf16)
    for f in files:
        os.chmod(f, 0o644)
    d = load_dflash(work / DFLASH, spec)
    if any(not torch.equal(d.tensors[k].float(), v.float()) for k, v in d_bf16.items()):
        raise RuntimeError(f"{DFLASH} does not read back equal to the trained weights")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen35moe.fixture_dflash", *sys.argv[1:]]),
               "builder": "bloomery_cli.families.qwen35moe.fixture_dflash", "seed": seed, "versions": _versions(),
               **_device_info(dev), "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{DFLASH}/model.safetensors", f"{DFLASH}/config.json"], "kind": "dflash",
             "architecture": "DFlashDraftModel", "target": TARGET, "num_layers": dshape.num_layers,
             "block_size": dshape.block_size, "target_layer_ids": list(dshape.target_layer_ids),
             "parameters": sum(v.numel() for v in d_bf16.values()),
             "training": {**asdict(cfg), "anchors_per_row": 8, "rows": f"{pool_size} greedy rows x 8 + {real_rows} "
                          "real windows"}, "final_train_loss": round(log.tail_mean(50), 4), "held_out_greedy": greedy,
             "seconds": round(log.seconds, 1), "made_by": made_by}
    man = install_model(work, out, DFLASH, files, entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    man = build(args.out, args.device, args.steps, progress=lambda *a: print(*a, flush=True))
    print(man.models[DFLASH]["held_out_greedy"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
