"""What every family's fixture builder (``bloomery_cli/families/<family>/fixture*.py``) does alike: the repo
tokenizer read from the fixtures folder, the corpus as one token stream, the training loop, the command line, and
the read-back of the written checkpoint against the trained weights."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from . import tokenizer_train
from .train import Reporter, Schedule, TrainConfig, _optimizer, descend


def load_tokenizer(out_dir: Path):
    """(tokenizer, its JSON text, the end-of-text id) from ``out_dir/tokenizer.json`` (the qwen3 build writes it)."""
    from tokenizers import Tokenizer

    tok_path = Path(out_dir) / "tokenizer.json"
    if not tok_path.is_file():
        raise FileNotFoundError(f"{tok_path}: missing; build the qwen3 fixtures first (same tokenizer)")
    tjson = tok_path.read_text()
    tok = Tokenizer.from_str(tjson)
    return tok, tjson, tok.token_to_id(tokenizer_train.EOT)


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """The texts encoded and joined, each followed by the end-of-text id: [N] int64."""
    eot = tok.token_to_id(tokenizer_train.EOT)
    return torch.tensor([i for d in tokenizer_train.encode_docs(tok, texts) for i in (*d, eot)], dtype=torch.long)


def check_readback(d: Path, want: Mapping[str, torch.Tensor], read: Callable[[str], torch.Tensor]) -> None:
    """Every trained tensor ``want[name]`` equals ``read(name)``, the tensor the family's readers give for it."""
    for name, w in want.items():
        got = read(name)
        if not torch.equal(got, w if w.is_floating_point() else w.to(got.dtype)):
            raise RuntimeError(f"{d}: {name} does not read back equal to the trained weights")


def fixture_main(module: str, doc: str | None, build: Callable[[Path, bool], object],
                 argv: list[str] | None = None) -> int:
    """``python -m <module> [--out fixtures] [--quick]``: run ``build(out, quick)``."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--quick", action="store_true", help="a few steps only (pipeline check, not for use)")
    a = ap.parse_args(argv)
    build(a.out, a.quick)
    return 0


def fit(params: Mapping[str, torch.Tensor], cfg: TrainConfig, label: str, rep: Reporter,
        loss_of: Callable[[torch.Generator], torch.Tensor], after_step: Callable[[], None] | None = None
        ) -> tuple[float, float]:
    """``cfg.steps`` AdamW steps on ``params`` (``fixturegen.train``'s optimizer, warmup schedule and clipping):
    each step's loss is ``loss_of(gen)``, gen the step sampler seeded with ``cfg.seed`` (the batches it draws);
    ``after_step`` runs after each update (e.g. a router-bias rule). Returns (seconds, mean loss of the last 50)."""
    opt, sched = _optimizer(dict(params), cfg, torch.device("cpu")), Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen, losses = torch.Generator().manual_seed(cfg.seed), []
    rep.start(label, cfg.steps)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        losses.append(descend(opt, loss_of(gen), params, cfg.clip))
        if after_step is not None:
            after_step()
        rep.step(step + 1, cfg.steps, {"loss": losses[-1]})
    rep.done()
    return round(time.perf_counter() - t0, 1), round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4)
