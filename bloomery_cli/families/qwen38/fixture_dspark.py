"""The qwen38 DSpark fixture: a DSpark drafter distilled from the frozen qwen38 target, written in the
speculators layout (``speculators_model_type`` "dspark"), for the gate qwen38-dspark.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen38.fixture_dspark --out fixtures --device cpu   # ~4-6 min

Needs the qwen38 build first (``fixturegen.qwen38_drafts``). Trained as the qwen3 DSpark fixture
(``train_dspark.train_dspark``: anchor-first rows labelled with the target's argmax, teacher-forced Markov
inputs, CE with position weights + 0.5 BCE for the confidence head) with the qwen38 forward, on the rows and
budget of the qwen38 DFlash fixture (``qwen38_dflash2._rows``: the same corpus, tokenizer, target and seeds;
steps, batch, lr, warmup and anchors per row from the qwen38-tiny-dflash-b8 MANIFEST entry), so qwen38-dflash
and qwen38-dspark compare on equal training. Shape: 2 layers, B = 7 (7 drafts, 8 verify rows), Markov rank 32,
confidence head, target_layer_ids (-1, 1, 2): the embedding output and two Gated DeltaNet outputs, which the
speculators file spells aux_hidden_state_layer_ids [0, 2, 3] (index 0 is the embedding output).

Writes qwen38-tiny-dspark-b7-speculators/ (config.json + model.safetensors, bf16), reads it back through the
harness's speculators reader (tensors equal to the trained ones), and adds its files and model entry to
MANIFEST.json (every other entry untouched).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.install import clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.speculators_layout import MAX_TOTAL_BYTES, speculators_config
from ...fixturegen.train_dspark import DSparkShape, dspark_config, train_dspark
from .fixture_dflash2 import _rows, draft_setup
from .fixture_drafts import DFLASH, TARGET

DSPARK = "qwen38-tiny-dspark-b7-speculators"
SEED_OFFSET = 13                     # qwen38_drafts uses seed + 0..11, qwen38_dflash2 + 12
SHAPE = DSparkShape(num_layers=2, block_size=7, target_layer_ids=(-1, 1, 2), markov_rank=32, confidence=True)


def write(out_dir: Path, stored: dict[str, torch.Tensor], dspec, target) -> list[Path]:
    """The speculators layout: config.json (as ``speculators_layout`` converts) + model.safetensors (bf16)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = speculators_config("dspark", dspark_config(target, dspec), dspec, target, f"fixtures/{TARGET}",
                             verifier_arch="Qwen3_5ForCausalLM")
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    write_safetensors(out_dir / "model.safetensors", stored)
    return [out_dir / "config.json", out_dir / "model.safetensors"]


def build_qwen38_dspark(out_dir: Path, device: str = "cpu", progress=None, steps: int | None = None) -> Manifest:
    """Train the qwen38 DSpark drafter with the qwen38 DFlash fixture's rows and budget; write and register it.
    ``steps`` overrides the budget (a pipeline check only; the manifest records it)."""

    from ...loading import load_dspark

    t_start, out_dir, dev = time.perf_counter(), Path(out_dir), torch.device(device)
    st = draft_setup(out_dir, dev, steps)
    cfg, budget, tok, spec, tq, tspec, fwd = st.cfg, st.budget, st.tok, st.spec, st.tq, st.tspec, st.fwd

    shape = replace(SHAPE, mask_token_id=tok.token_to_id(tokenizer_train.MASK))
    seed = cfg.seed + SEED_OFFSET
    with _determinism(cfg.seed):
        data = _rows(cfg, tok, tq, tspec, fwd, dev)
        print(f"rows: {data['rows'].shape[0]} x {data['rows'].shape[1]} (greedy rows {data['pool_seconds']} s), "
              f"{time.perf_counter() - t_start:.0f} s so far", file=sys.stderr, flush=True)
        stored, dspec, stats = train_dspark(
            tq, tspec, data["rows"], dev, budget["steps"], seed, progress, shape=shape, batch=budget["batch"],
            seq=data["rows"].shape[1], anchors_per_row=budget["anchors_per_row"], lr=budget["lr"],
            warmup=budget["warmup"], eval_rows=data["held_rows"], eval_first_anchor=data["first_anchor"],
            target_forward=fwd)

    work = fresh_work(out_dir, "qwen38-dspark")
    files = write(work / DSPARK, stored, dspec, spec)
    for f in files:
        os.chmod(f, 0o644)
    back = load_dspark(work / DSPARK, spec)
    if set(back.tensors) != set(stored) or any(not torch.equal(back.tensors[k], v) for k, v in stored.items()):
        raise RuntimeError(f"{DSPARK} does not read back equal to the trained weights")
    if back.target_layer_ids != shape.target_layer_ids:
        raise RuntimeError(f"{DSPARK} reads back target_layer_ids {back.target_layer_ids}, not "
                           f"{shape.target_layer_ids}")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen38.fixture_dspark", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "qwen38_dspark" else f"build_qwen38_dspark({out_dir}, {device})",
               "builder": "bloomery_cli.families.qwen38.fixture_dspark", "seed": seed, "versions": _versions(),
               **_device_info(dev), "threads": torch.get_num_threads(),
               "seconds": round(time.perf_counter() - t_start, 1)}
    cfgj = json.loads((work / DSPARK / "config.json").read_text())
    entry = {"files": [f"{DSPARK}/model.safetensors", f"{DSPARK}/config.json"], "kind": "dspark",
             "layout": "speculators", "architecture": cfgj["architectures"][0], "target": TARGET,
             "num_layers": shape.num_layers, "block_size": shape.block_size,
             "target_layer_ids": list(shape.target_layer_ids),
             "aux_hidden_state_layer_ids": cfgj["aux_hidden_state_layer_ids"],
             "parameters": sum(v.numel() for v in stored.values()),
             **{k: v for k, v in stats.items() if k not in ("shape", "training")},
             "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in stats["shape"].items()},
             "training": {**stats["training"], **budget, "seed": seed,
                          "budget_from": f"MANIFEST models[{DFLASH!r}].training", "rows": data["note"],
                          "pool_seconds": data["pool_seconds"]},
             "made_by": made_by}
    man = install_model(work, out_dir, DSPARK, files, entry, MAX_TOTAL_BYTES)
    clean_work(work)
    verified(out_dir, "qwen38 DSpark build")
    ev = stats.get("eval", {})
    print(f"{DSPARK}: {stats['training']['seconds']} s training, final loss {stats['final_train_loss']}, held-out "
          f"greedy tf accept {ev.get('mean_accept_len_tf')}; fixtures total {man.total_bytes} bytes, "
          f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.families.qwen38.fixture_dspark",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="override the budget (pipeline check, not for use)")
    a = ap.parse_args(argv)
    build_qwen38_dspark(a.out, a.device, steps=a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
