"""The deepseek41 fixture: ``ds41-tiny/ds41-tiny.gguf``, a tiny trained DeepSeek V4.1 target in the seed engine's
GGUF layout (``fixture_gguf``; docs/V41.md).

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek41.fixture --out fixtures

Same corpus and tokenizer as the other fixtures (``<out>/tokenizer.json``, its real 4096-token vocabulary, written
into the file as ``tokenizer.ggml.*``). No outside model implements V4.1, so the target is trained through this
repo's own engine (``kernels.families.deepseek41.model.Deepseek41Target`` in float32, autograd through its lagged
mixes, Sinkhorn, window attention and routed MoE): next-token CE on random windows of the training stream, AdamW as
the other fixtures (``family_kit.fit``). The router bias ``e_score_correction_bias`` is a seeded N(0, 0.1) draw,
fixed (as deepseek4's fixture keeps HF's buffer); everything else is trained. Stored as the GGUF writes it
(matrices BF16; norms, sinks, hc mixes and the bias F32), read back exactly through ``reader_gguf``.

Shape: hidden 64, 5 layers (window 16): [window-only, a gated ratio-2 source with its index keys and indexer query, a
reader of all three, a reader with its own query, an ungated ratio-1 source] (indexer 16 heads x 8, top-4), 4 heads
x 32 over one K = V head, rope 8, q latent 24, 2 output groups x 16, 6 experts x 24 top-2 x1.5 with a shared expert,
4 streams, untied head. At the gates' prompts (40..64 tokens) the window drops keys and both choices are sparse
(ratio 2: 20..32 entries, ratio 1: 40..64, top-4). One engram site, on layer 1 (the seed's served sites are 1 and 14),
2 heads per order up to 3-grams, rows of 16, the hash constants ``fixture_gguf.engram_hash`` makes.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.spec import Deepseek41Spec

from ...fixturegen import corpus as corpus_mod
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.family_kit import check_readback, fit, fixture_main, load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.train import Reporter, TrainConfig, sample_windows
from .fixture_gguf import F32_SUFFIXES, Dims, tiny_tensors, write_deepseek41_gguf

NAME = "ds41-tiny"
FILE = NAME + ".gguf"
FIXED = ("e_score_correction_bias",)          # seeded, not trained


def dims(vocab: int) -> Dims:
    """``fixture_gguf.STREAMS``' layer plan (every stream kind) at the fixture's width; 6 experts of 24 (the 2 MB
    cap); an indexer of 16 heads x 8, as deepseek4's fixture (with 2 heads the ReLU scores of many entries are
    exactly 0 or nearly, ties at the top-k boundary that a bf16 run breaks otherwise than the reference)."""
    return Dims(h=64, v=vocab, layers=5, window=16, experts=6, ff=24, ratios=(0, 2, 2, 2, 1),
                parts=("", "ckq", "", "q", "ckq"), index_heads=16, index_dim=8, engram_layers=(1,))


@dataclass
class DS41Config:
    seed: int = 4141
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=400, batch=4, seq=96, warmup=40,
                                                                     log_every=50))

    @classmethod
    def quick(cls) -> DS41Config:
        return cls(target=TrainConfig(steps=3, batch=2, seq=32, warmup=1, log_every=1))


def spec_of(d: Dims, tensors: dict[str, torch.Tensor], work: Path) -> Deepseek41Spec:
    """The spec ``reader_gguf`` reads from the file ``fixture_gguf`` writes for ``d`` (so the training runs the
    engine on the shape the fixture's reader will hand out), over the in-memory ``tensors``."""
    from .reader_gguf import deepseek41_from_gguf

    probe = write_deepseek41_gguf(work / "shape-probe.gguf", tensors, d)
    spec = deepseek41_from_gguf(probe)
    probe.unlink()
    return replace(spec, tensors=tensors, source=Path("<training>"))


def init(d: Dims, seed: int) -> dict[str, torch.Tensor]:
    """tiny_tensors' draw at gain 1 (the matrices at 1/sqrt(fan-in)), the router bias N(0, 0.1)."""
    t = tiny_tensors(d, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for n in [n for n in t if n.endswith(FIXED)]:
        t[n] = 0.1 * torch.randn(t[n].shape, generator=g)
    return t


def window_loss(spec: Deepseek41Spec, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token CE of windows rows [B, seq + 1] through a fresh float32 engine per window."""
    from bloomery_gates.kernels.families.deepseek41.model import Deepseek41Target

    loss = 0.0
    for r in rows:
        eng = Deepseek41Target(spec, "cpu", torch.float32, r.numel())
        logits = eng.prefill(r[:-1].tolist(), logits=True).logits
        loss = loss + F.cross_entropy(logits.float(), r[1:])
    return loss / len(rows)


def train(spec: Deepseek41Spec, stream: torch.Tensor, cfg: TrainConfig, rep: Reporter) -> dict:
    params = {n: t.requires_grad_(True) for n, t in spec.tensors.items() if not n.endswith(FIXED)}

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        return window_loss(spec, sample_windows(stream, cfg.batch, cfg.seq + 1, gen))

    seconds, last = fit(params, cfg, "deepseek41 target", rep, loss_of)
    for t in params.values():
        t.requires_grad_(False)
    return {**asdict(cfg), "seconds": seconds, "train_ce_last50": last,
            "objective": "next-token CE through kernels.families.deepseek41 (float32, autograd); the router bias a "
                         "seeded draw, fixed"}


@torch.no_grad()
def held_out_ce(spec: Deepseek41Spec, held: torch.Tensor, seq: int, windows: int = 8) -> dict:
    n = min(windows, (held.numel() - 1) // seq)
    rows = held[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :])]
    ce = float(window_loss(spec, rows))
    return {"ce": round(ce, 4), "tokens": n * seq}


def stored(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the GGUF holds, as the reader hands it back: F32 names exact, matrices through bf16."""
    return {n: (t.float() if n.endswith(F32_SUFFIXES) or t.ndim < 2 else t.to(torch.bfloat16).float()).detach()
            for n, t in tensors.items()}


def build_ds41(out_dir: Path, quick: bool = False, progress=None, config: DS41Config | None = None):
    from tokenizers import Tokenizer

    from .reader_gguf import deepseek41_from_gguf

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (DS41Config.quick() if quick else DS41Config())
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.target.log_every)
    d = dims(tok.get_vocab_size())
    work = fresh_work(out_dir, "ds41")
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train_s, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        spec = spec_of(d, init(d, cfg.seed), work)
        tstats = train(spec, train_s, replace(cfg.target, seed=cfg.seed + 2), rep)
        weights = stored(spec.tensors)
        tstats["held_out"] = held_out_ce(replace(spec, tensors=weights), held, cfg.target.seq)
        rep.log(f"deepseek41 target: {tstats['seconds']} s, held-out {tstats['held_out']}")
    (work / NAME).mkdir()
    path = write_deepseek41_gguf(work / NAME / FILE, weights, d, tok=Tokenizer.from_str(tjson))
    os.chmod(path, 0o644)
    back = deepseek41_from_gguf(path)
    check_readback(path, weights, lambda name: back.tensors[name])
    made_by = {"command": " ".join(["python -m bloomery_cli.families.deepseek41.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "fixture" else f"build_ds41({out_dir}, quick={quick})",
               "builder": "bloomery_cli.families.deepseek41.fixture", "quick": quick, "seed": cfg.seed,
               "versions": _versions(), **_device_info(torch.device("cpu")),
               "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{NAME}/{FILE}"],
             "architecture": "deepseek41 GGUF in the seed engine's V4.1 layout (docs/V41.md): lagged HC mixes, "
                             "LastMix, no q head norm; window-only layers, no engram site",
             "shape": asdict(d), "parameters": sum(v.numel() for v in weights.values()), "training": tstats,
             "made_by": made_by}
    man = install_model(work, out_dir, NAME, [work / NAME / FILE], entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    rep.log(f"{NAME} written to {out_dir} (fixtures total {man.total_bytes} bytes)")
    return man


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.deepseek41.fixture", __doc__, build_ds41, argv)


if __name__ == "__main__":
    raise SystemExit(main())
