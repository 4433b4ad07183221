"""What the ds4 and ds41 DSpark fixture builders (``deepseek4.fixture_dspark``, ``deepseek41.fixture_dspark``) do
alike: distil a DSpark draft from a frozen DSV4-style target, then install the written GGUF in the fixtures.

Data (``distill``): the target's greedy continuations (``fixture.greedy_rows``: a real ``prefix``-token prefix,
greedy to ``seq`` tokens, ``pool`` rows) and ``real`` corpus windows of ``seq`` tokens, each row's
(ids [T], features [T, n H], argmax [T]) from the frozen f32 engine's taps (``rows_data``).
Loss per block (``block_loss``; the dense DSpark fixture's, ``fixturegen.train_dspark``): A anchors s per row, row k
of the block labelled with the target's argmax at s+k (labels [A, B]), weights w_k = exp(-k / gamma) / sum,
gamma = (B + 1) / 2, Markov inputs teacher-forced (prev_0 = x_s, prev_k = label_{k-1}):
    loss = mean_rows( mean_A sum_k w_k CE(logits[a, k], labels[a, k]) + 0.5 BCE(z[a, k], [argmax == label]) )
Install (``publish``): the written file read back equal to the stored bf16 weights, the manifest entry, the cap.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...fixturegen import corpus as corpus_mod
from ...fixturegen.build import _determinism, _versions
from ...fixturegen.family_kit import check_readback, fit, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.train import Reporter, TrainConfig, round_bf16, sample_windows
from .fixture import greedy_rows

if TYPE_CHECKING:
    from bloomery_gates.spec import V4AttnShape


@dataclass(frozen=True)
class DSparkFixture:
    """The constants one DSpark fixture states (its manifest entry's names and shape)."""
    name: str                          # the manifest model name; the file is name + ".gguf"
    target: str                        # the target's fixture name
    module: str                        # the builder's module (the manifest's made_by command)
    label: str                         # the progress / verified label, e.g. "ds4 dspark"
    architecture: str
    stages: int
    block_size: int
    markov_rank: int
    target_ids: tuple[int, ...]        # DSpark config ids; dflash.target_layers = ids + 1

    @property
    def gguf(self) -> str:
        return self.name + ".gguf"


def stage_attn(a: V4AttnShape) -> V4AttnShape:
    """A DSpark stage's attention (``V4AttnShape``): the target's ``a`` shapes and window, window-only (no
    compressor, no indexer), one rope theta."""
    from bloomery_gates.spec import V4AttnShape

    return V4AttnShape(a.num_heads, a.head_dim, a.rope_dim, a.q_lora_rank, a.o_groups, a.o_lora_rank, a.window,
                       a.rope_theta, a.rope_theta, None, 0, 0, 0, 0, 0)


@dataclass
class DSparkFixtureConfig:
    """A DSpark fixture build's numbers: ``pool`` greedy rows (a real ``prefix``-token prefix continued to ``seq``)
    and ``real`` corpus windows of ``seq`` tokens, ``anchors`` blocks a row a step, the loop's ``train``."""
    seed: int
    pool: int
    real: int
    prefix: int
    seq: int
    anchors: int
    train: TrainConfig

    def quick(self) -> DSparkFixtureConfig:
        """The pipeline check (a few steps, not for use): this seed and prefix, tiny rows and loop."""
        return replace(self, pool=2, real=2, seq=40, anchors=2,
                       train=TrainConfig(steps=3, batch=2, seq=40, warmup=1, log_every=1))


@dataclass
class Distilled:
    """A distilled draft: its stored (bf16) weights, the train config used, and the run's numbers."""
    stored: dict[str, torch.Tensor]
    train: TrainConfig
    seconds: float
    loss_last50: float
    held_top1: float


@torch.no_grad()
def rows_data(eng, rows: torch.Tensor, layer_ids: tuple[int, ...]
              ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per row: (ids [T], features [T, n H], the target's argmax [T]) from the engine's f32 taps (their S hc
    streams: a deepseek41 tap's lag row dropped)."""
    from bloomery_gates.kernels.families.deepseek4.dspark import features, target_streams

    out = []
    for r in rows:
        p = eng.prefill(r.tolist())
        out.append((r, features(target_streams(p.taps.float(), eng.spec.hc.count), layer_ids),
                    torch.tensor(p.argmax)))
    return out


def block_loss(params: dict, spec, eng, data: list, pick: list[int], anchors: int, gen) -> tuple[torch.Tensor, float]:
    """(the loss above over the rows ``pick``, the block rows' top-1 against the labels)."""
    from bloomery_gates.kernels.families.deepseek4.dspark import forward_train

    b = spec.block_size
    gamma = (b + 1) / 2
    wk = torch.exp(-torch.arange(b) / gamma)
    wk = wk / wk.sum()
    loss, hits, n = 0.0, 0, 0
    for j in pick:
        ids, feats, lab = data[j]
        s = torch.randint(1, ids.shape[0] - b, (anchors,), generator=gen)
        labels = lab[s[:, None] + torch.arange(b)]                                          # [A, B]
        prev = torch.cat([ids[s][:, None], labels[:, :-1]], 1)
        logits, z = forward_train(params, spec, eng.embed.float(), eng.head.float(), feats, ids, s, prev)
        ce = (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
              .view(anchors, b) * wk).sum(-1).mean()
        hit = (logits.argmax(-1) == labels).float()
        loss = loss + ce + 0.5 * F.binary_cross_entropy_with_logits(z, hit)
        hits, n = hits + int(hit.sum()), n + hit.numel()
    return loss / len(pick), hits / n


def distill(fx: DSparkFixture, cfg: DSparkFixtureConfig, quick: bool, tok, rep: Reporter,
            make_engine: Callable[[], object], init_params: Callable[[int], dict[str, torch.Tensor]],
            spec) -> Distilled:
    """Train the draft (``init_params(seed)``, ``spec`` its shapes without tensors) on the frozen engine
    ``make_engine()`` under the build's determinism; held-out top-1 on the bf16-rounded weights."""
    with _determinism(cfg.seed):
        eng = make_engine()
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        pool = greedy_rows(eng, train, cfg.pool, cfg.prefix, cfg.seq, torch.Generator().manual_seed(cfg.seed))
        rows = torch.cat([pool,
                          sample_windows(train, cfg.real, cfg.seq, torch.Generator().manual_seed(cfg.seed + 1))])
        data = rows_data(eng, rows, fx.target_ids)
        held_data = rows_data(eng, greedy_rows(eng, held, 4 if not quick else 1, cfg.prefix, cfg.seq,
                                               torch.Generator().manual_seed(cfg.seed + 2)), fx.target_ids)
        params = init_params(cfg.seed + 3)
        for p in params.values():
            p.requires_grad_(True)
        tc = replace(cfg.train, seed=cfg.seed + 4)
        g_anchor = torch.Generator().manual_seed(cfg.seed + 5)

        def loss_of(gen: torch.Generator) -> torch.Tensor:
            pick = torch.randint(0, len(data), (tc.batch,), generator=gen).tolist()
            return block_loss(params, spec, eng, data, pick, cfg.anchors, g_anchor)[0]

        seconds, last = fit(params, tc, fx.label, rep, loss_of)
        stored = round_bf16(params)
        with torch.no_grad():
            top1 = block_loss({k: v.float() for k, v in stored.items()}, spec, eng, held_data,
                              list(range(len(held_data))), cfg.anchors, torch.Generator().manual_seed(7))[1]
    return Distilled(stored, tc, seconds, last, top1)


def publish(out_dir: Path, fx: DSparkFixture, d: Distilled, write: Callable[[Path], None],
            read_back: Callable[[Path], Mapping[str, torch.Tensor]], window: int, quick: bool, seed: int,
            t0: float, rep: Reporter, max_bytes: int | None = None) -> Path:
    """``write(tmp)``, the file (at most ``max_bytes``) read back equal to ``d.stored``, then moved to
    ``out_dir/fx.gguf`` and entered in the manifest (the fixtures cap checked); returns the path."""
    dst = out_dir / fx.gguf
    tmp = dst.with_name(dst.name + ".tmp")
    write(tmp)
    os.chmod(tmp, 0o644)
    if max_bytes is not None and tmp.stat().st_size > max_bytes:
        raise RuntimeError(f"{tmp}: {tmp.stat().st_size} bytes, over this draft's budget {max_bytes}")
    got = read_back(tmp)
    check_readback(tmp, {k: v.float() for k, v in d.stored.items()}, got.__getitem__)
    man = Manifest.read(out_dir)
    man.files.pop(fx.gguf, None)
    os.replace(tmp, dst)
    man.add_files(out_dir, [dst])
    if man.stored_bytes > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"fixtures would store {man.stored_bytes} bytes, over {MAX_FIXTURE_BYTES}")
    stats = {**asdict(d.train), "seconds": d.seconds, "train_loss_last50": d.loss_last50,
             "held_out_row_top1": round(d.held_top1, 4)}
    man.models[fx.name] = {
        "files": [fx.gguf], "architecture": fx.architecture,
        "target": fx.target, "shape": {"stages": fx.stages, "block_size": fx.block_size,
                                       "target_layers": [x + 1 for x in fx.target_ids],
                                       "markov_rank": fx.markov_rank, "confidence_head": True, "window": window},
        "parameters": sum(v.numel() for v in d.stored.values()), "training": stats,
        "made_by": {"command": f"OMP_NUM_THREADS=1 python -m {fx.module} " + " ".join(sys.argv[1:]),
                    "quick": quick, "seed": seed, "versions": _versions(),
                    "seconds": round(time.perf_counter() - t0, 1)}}
    man.write(out_dir)
    verified(out_dir, f"{fx.label} fixture")
    rep.log(f"{fx.gguf}: {dst.stat().st_size} bytes, {stats}")
    return dst
