"""The qwen3 EAGLE-3 fixture: an EAGLE-3 head distilled from the frozen qwen3 fixture target (speculators layout).

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen3.fixture_eagle3 --out fixtures --device cpu  # a few minutes

Needs the qwen3 build first (``fixturegen.build``: tokenizer.json, qwen3-tiny/). Same corpus and tokenizer.
Rows (``Eagle3BuildConfig``): ``greedy_rows`` held-in prefixes of ``prefix`` real training tokens followed by
the target's own greedy continuation to ``seq`` tokens (the regime the gate drafts in; decoded with the f32
device engine, one row at a time with its KV cache), plus ``real_rows`` random training windows; the held-out
rows for the evaluation are made the same way from the held-out files. Training: ``train_eagle3``
(training-time test over 3 chained steps, draft vocabulary 2048 of the target's 4096 ids by label frequency,
d2t / t2d). Writes qwen3-tiny-eagle3/ (config.json + model.safetensors), reads it back through the harness's
reader, and adds its files and model entry to MANIFEST.json (every other entry untouched).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ...fixturegen import corpus as corpus_mod
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.family_kit import token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.train import TrainConfig, sample_windows
from ...fixturegen.train_eagle3 import Eagle3Shape, train_eagle3, write_eagle3

EAGLE3 = "qwen3-tiny-eagle3"
TARGET = "qwen3-tiny"
MAX_TOTAL_BYTES = MAX_FIXTURE_BYTES
SEED_OFFSET = 20                     # the qwen3 build uses seed + 0..9


@dataclass
class Eagle3BuildConfig:
    seed: int = 1234
    seq: int = 128
    prefix: int = 64
    greedy_rows: int = 160
    real_rows: int = 480
    eval_rows: int = 32
    shape: Eagle3Shape = field(default_factory=Eagle3Shape)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=500, batch=16, seq=128, lr=3e-3,
                                                                    warmup=50, log_every=50))


@torch.no_grad()
def greedy_rows(spec, stream: torch.Tensor, n: int, seq: int, prefix: int, gen: torch.Generator,
                device: torch.device) -> torch.Tensor:
    """[n, seq]: a real window of ``prefix`` tokens, then the target's greedy continuation (f32 engine, cached)."""
    from bloomery_gates.kernels.families.qwen3.model import Qwen3Target

    engine = Qwen3Target(spec, device, torch.float32, seq + 1)
    out = []
    for row in sample_windows(stream, n, prefix, gen).tolist():
        ids = list(row)
        nxt = engine.prefill(ids).argmax[-1]
        while len(ids) < seq:
            ids.append(nxt)
            v = engine.verify([nxt])
            engine.commit(1)
            nxt = v.argmax[0]
        out.append(ids)
    return torch.tensor(out, dtype=torch.long, device=device)


def build_qwen3_eagle3(out_dir: Path, device: str = "cpu", config: Eagle3BuildConfig | None = None,
                       progress=None) -> Manifest:
    """Train the EAGLE-3 head on the qwen3 fixture target; write and register it in ``out_dir``."""
    from tokenizers import Tokenizer

    from ...loading import load_eagle3, load_target

    t_start, out_dir, dev = time.perf_counter(), Path(out_dir), torch.device(device)
    cfg = config or Eagle3BuildConfig()
    if TARGET not in Manifest.read(out_dir).models:
        raise RuntimeError(f"{out_dir}/MANIFEST.json has no {TARGET} entry: build the qwen3 fixtures first")
    spec = load_target(out_dir / TARGET)
    tq = {k: spec.tensors[k].to(dev, torch.float32) for k in spec.tensors}
    tspec = replace(spec, tensors=tq)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    seed = cfg.seed + SEED_OFFSET
    with _determinism(seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        t0 = time.perf_counter()
        greedy = greedy_rows(tspec, train, cfg.greedy_rows, cfg.seq, cfg.prefix, torch.Generator().manual_seed(seed),
                             dev)
        held_rows = greedy_rows(tspec, held, cfg.eval_rows, cfg.seq, cfg.prefix,
                                torch.Generator().manual_seed(seed + 1), dev)
        real = sample_windows(train, cfg.real_rows, cfg.seq, torch.Generator().manual_seed(seed + 2)).to(dev)
        rows_s = time.perf_counter() - t0
        print(f"rows: {cfg.greedy_rows} greedy + {cfg.real_rows} real of {cfg.seq} ({rows_s:.0f} s)", file=sys.stderr)
        stored, dspec, stats = train_eagle3(tq, tspec, torch.cat([greedy, real]), replace(cfg.train, seed=seed + 3),
                                            cfg.shape, dev, progress, eval_rows=held_rows, eval_first_anchor=cfg.prefix)

    work = fresh_work(out_dir, "qwen3-eagle3")
    files = write_eagle3(work / EAGLE3, stored, dspec, spec)
    for f in files:
        os.chmod(f, 0o644)
    back = load_eagle3(work / EAGLE3, spec)
    if any(not torch.equal(back.tensors[k], v) for k, v in stored.items()) or not torch.equal(back.d2t, dspec.d2t):
        raise RuntimeError(f"{EAGLE3} does not read back equal to the trained weights")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen3.fixture_eagle3", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "qwen3_eagle3" else f"build_qwen3_eagle3({out_dir}, {device})",
               "builder": "bloomery_cli.families.qwen3.fixture_eagle3", "seed": seed, "versions": _versions(),
               **_device_info(dev), "threads": torch.get_num_threads(),
               "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{EAGLE3}/model.safetensors", f"{EAGLE3}/config.json"], "kind": "eagle3",
             "architecture": "Eagle3Speculator (speculators_model_type eagle3)", "target": TARGET,
             "layer": "qwen3 (q/k norms)", "aux_layer_ids": list(dspec.aux_layer_ids),
             "draft_vocab_size": dspec.draft_vocab_size, "speculative_tokens": dspec.speculative_tokens,
             "parameters": sum(v.numel() for v in stored.values()),
             "rows": f"{cfg.greedy_rows} training prefixes of {cfg.prefix} tokens + the target's greedy "
                     f"continuation to {cfg.seq}, and {cfg.real_rows} random {cfg.seq}-token training windows "
                     f"({rows_s:.0f} s); eval: {cfg.eval_rows} held-out prefixes + greedy continuation, chains "
                     f"anchored from {cfg.prefix}",
             "config": {k: v for k, v in asdict(cfg).items() if k not in ("shape", "train")},
             **stats, "made_by": made_by}
    man = install_model(work, out_dir, EAGLE3, files, entry, MAX_TOTAL_BYTES)
    clean_work(work)
    verified(out_dir, "EAGLE-3 build")
    print(f"{EAGLE3}: {stats['training']['seconds']} s training, eval {stats.get('eval')}, fixtures total "
          f"{man.total_bytes} bytes, {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.families.qwen3.fixture_eagle3",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="override the training steps (pipeline check)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args(argv)
    cfg = Eagle3BuildConfig(seed=a.seed)
    if a.steps is not None:
        cfg.train = replace(cfg.train, steps=a.steps)
    build_qwen3_eagle3(a.out, a.device, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
