"""The qwen38 fixtures: the target (``qwen38_target``), its MTP head and a DFlash drafter distilled from it.

    python -m bloomery_cli.families.qwen38.fixture_drafts --out fixtures --device cpu     # ~8-12 min on 2 CPU cores
    python -m bloomery_cli.families.qwen38.fixture_drafts --out fixtures --device cuda

Same corpus and tokenizer as the qwen3 fixtures (``<out>/tokenizer.json`` must exist: the qwen3 build writes
it). Both drafts are distilled from the frozen, bf16-rounded target on a pool of rows that are a real training
window of P tokens followed by the target's greedy continuation (the regime the gates draft in):

MTP (``mtp.*`` inside the target's files): chained training-time test. Step 1 reads (tok_q, h_{q-1}), the
target's post-final-norm rows; step s > 1 reads (tok_q, g of step s-1 at q-1) and attends to the real rows
up to its chain's anchor and to the chain's earlier rows, exactly the keys the engine's store holds
(``kernels.drafts.mtp.forward_train``). Every step's label at q is the target's argmax at q; loss
sum_s 0.8^(s-1) CE_s / Z. DFlash (``qwen38-tiny-dflash-b8``): ``fixturegen.train.train_draft`` unchanged, with
the qwen38 forward; target_layer_ids (0, 1, 2) (three of the four layers: Gated DeltaNet outputs).

Writes qwen38-tiny/ (HF, mtp.* inside, mtp_num_hidden_layers 1), qwen38-tiny.gguf (arch qwen35, blk.4.* +
blk.4.nextn.*, block_count 5, nextn_predict_layers 1, +1 baked into the norms) and qwen38-tiny-dflash-b8/,
reads them back, and adds their entries to MANIFEST.json (the qwen3 entries untouched).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.kernels.drafts.dflash import forward_train as dflash_forward
from bloomery_gates.kernels.drafts.mtp import forward_train as mtp_forward
from bloomery_gates.kernels.families.qwen38.model import forward_train as qwen38_forward
from bloomery_gates.kernels.families.qwen38.model import norm_gain
from bloomery_gates.kernels.ops.norm import rms_norm

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_draft
from ...fixturegen.family_kit import token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.train import (
    DraftShape,
    Reporter,
    Schedule,
    TrainConfig,
    TrainLog,
    _autocast,
    _optimizer,
    descend,
    eval_draft,
    greedy_pool,
    init_draft,
    round_bf16,
    train_draft,
)
from ...fixturegen.train_dflash2 import target_shape_of
from .fixture import Qwen38Shape, init_qwen38, train_qwen38_target, write_qwen38_target
from .reader import baked_plus_one

TARGET, GGUF, DFLASH = "qwen38-tiny", "qwen38-tiny.gguf", "qwen38-tiny-dflash-b8"
MAX_TOTAL_BYTES = MAX_FIXTURE_BYTES


@dataclass
class Qwen38DraftsConfig:
    seed: int = 1234
    target_steps: int = 600
    target_batch: int = 16
    seq: int = 128
    pool_size: int = 96                     # greedy rows (the costly part on a CPU: one forward per new token)
    pool_prefixes: tuple[int, ...] = (64,)
    greedy_repeat: int = 8                  # draft rows = the greedy rows x repeat + real training windows
    real_rows: int = 2048
    mtp: TrainConfig = field(default_factory=lambda: TrainConfig(steps=300, batch=16, seq=128, warmup=30, log_every=50))
    mtp_chain: int = 3
    dflash: TrainConfig = field(default_factory=lambda: TrainConfig(steps=900, batch=16, seq=128, warmup=50,
                                                                     log_every=100))
    dflash_layers: int = 2
    dflash_layer_ids: tuple[int, ...] = (0, 1, 2)
    anchors_per_row: int = 8
    eval_rows: int = 16
    eval_windows: int = 64
    quick: bool = False

    @classmethod
    def for_device(cls, device: str, quick: bool, seed: int = 1234) -> Qwen38DraftsConfig:
        if quick:
            small = TrainConfig(steps=4, batch=4, seq=64, warmup=2, log_every=2)
            return cls(seed=seed, target_steps=4, target_batch=4, seq=64, pool_size=8, pool_prefixes=(32,),
                       real_rows=8, mtp=small, dflash=small, anchors_per_row=4, eval_rows=4, eval_windows=4,
                       quick=True)
        if device.startswith("cuda"):
            big = TrainConfig(steps=2000, batch=64, seq=256, warmup=100, log_every=100)
            return cls(seed=seed, target_steps=3000, target_batch=64, seq=256, pool_size=2048,
                       pool_prefixes=(32, 64, 96, 128), greedy_repeat=2, real_rows=8192, mtp=big,
                       dflash=replace(big, steps=3000), anchors_per_row=16, eval_rows=256, eval_windows=512)
        return cls(seed=seed)


def _tforward(tspec):
    """fixturegen.train's (params, spec, ids) forward signature over the qwen38 engine's forward."""
    return lambda params, _spec, ids: qwen38_forward(params, tspec, ids)


def init_mtp(shape: Qwen38Shape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """mtp.* float32 tensors: fc normal(0, std), zero-centred norms 0, the layer as the trunk initialises one."""
    one = init_qwen38(replace(shape, layer_types=("full_attention",)), seed, std)
    gen = torch.Generator().manual_seed(seed + 1)
    H = shape.hidden_size
    p = {k.replace("model.layers.0.", "mtp.layers.0.", 1): v for k, v in one.items() if k.startswith("model.layers.0.")}
    p.update({"mtp.fc.weight": torch.randn(H, 2 * H, generator=gen) * std, "mtp.norm.weight": torch.zeros(H),
              "mtp.pre_fc_norm_embedding.weight": torch.zeros(H), "mtp.pre_fc_norm_hidden.weight": torch.zeros(H)})
    return p


def _mtp_losses(mp: dict, tq: dict, tspec, ids: torch.Tensor, chain: int, dev) -> tuple[list, torch.Tensor]:
    """Per chain step s: (logits of rows q >= s [N, T-s, V], labels = the target's argmax at q [N, T-s])."""
    with torch.no_grad(), _autocast(dev):
        tlogits, hidden = qwen38_forward(tq, tspec, ids)
    lab = tlogits.float().argmax(-1)
    final = rms_norm(hidden[-1], norm_gain(tq["model.norm.weight"]), tspec.layer.rms_eps)
    with _autocast(dev):
        outs = mtp_forward({**mp, "model.embed_tokens.weight": tq["model.embed_tokens.weight"]}, tspec, final, ids,
                           chain)
    return [o[:, s:].float() for s, o in enumerate(outs)], lab


def train_mtp(mp: dict, tq: dict, tspec, pool: torch.Tensor, cfg: TrainConfig, chain: int, dev, rep: Reporter
              ) -> TrainLog:
    for p in mp.values():
        p.requires_grad_(True)
    opt, sched = _optimizer(mp, cfg, dev), Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen = torch.Generator().manual_seed(cfg.seed)
    wstep = [0.8 ** s / sum(0.8 ** j for j in range(chain)) for s in range(chain)]
    log = TrainLog()
    rep.start("mtp", cfg.steps)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        ids = pool[torch.randint(0, pool.shape[0], (cfg.batch,), generator=gen).to(pool.device)]
        outs, lab = _mtp_losses(mp, tq, tspec, ids, chain, dev)
        loss = sum(w * F.cross_entropy(o.reshape(-1, o.shape[-1]), lab[:, s + 1:].reshape(-1))
                   for s, (w, o) in enumerate(zip(wstep, outs, strict=True)))
        log.losses.append(descend(opt, loss, mp, cfg.clip))
        rep.step(step + 1, cfg.steps, {"loss": log.losses[-1]})
    log.seconds = time.perf_counter() - t0
    rep.done()
    for p in mp.values():
        p.requires_grad_(False)
    return log


@torch.no_grad()
def eval_mtp(mp: dict, tq: dict, tspec, rows: torch.Tensor, chain: int, first_anchor: int, dev,
             batch: int = 16) -> dict:
    """Float32: CE and top-1 agreement with the target's argmax per chain step (rows q >= s), and the
    teacher-forced acceptance 1 + leading agreements of the chain anchored at every a >= first_anchor
    (what a greedy verify keeps on rows that are the target's own greedy continuation)."""
    ce, agree, count = (torch.zeros(chain, dtype=torch.float64) for _ in range(3))
    acc, chains = 0.0, 0
    for b0 in range(0, rows.shape[0], batch):
        ids = rows[b0:b0 + batch]
        outs, lab = _mtp_losses(mp, tq, tspec, ids, chain, dev)
        hits = []
        for s, o in enumerate(outs):
            y = lab[:, s + 1:]
            ce[s] += float(F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1), reduction="sum"))
            agree[s] += float((o.argmax(-1) == y).sum())
            count[s] += y.numel()
            hits.append((o.argmax(-1) == y)[:, first_anchor - 1:ids.shape[1] - chain])   # chain at a: index a-1
        lead = torch.stack(hits, -1).int().cumprod(-1).sum(-1)                    # [N, anchors]
        acc += float((1 + lead).sum())
        chains += lead.numel()
    return {"ce_per_step": [round(float(x), 4) for x in ce / count], "chains": chains,
            "top1_agreement_per_step": [round(float(x), 4) for x in agree / count],
            "mean_accept_len_tf": acc / max(1, chains), "width": chain}


def _readback(work: Path, t_bf16: dict, m_bf16: dict, d_bf16: dict) -> None:
    """Re-read every file through the harness's own readers and compare with what was trained."""
    from ...loading import load_dflash, load_mtp, load_target

    for src in (work / TARGET, work / GGUF):
        spec = load_target(src)
        mtp = load_mtp(src, spec)
        for name, want in [*t_bf16.items(), *m_bf16.items()]:
            got = (mtp.tensors if name.startswith("mtp.") else spec.tensors)[name].float()
            inexact = src.suffix == ".gguf" and (baked_plus_one(name) or name.endswith("A_log"))  # +1, -exp
            if not torch.allclose(got, want.float(), rtol=0.0, atol=2.0 ** -22 if inexact else 0.0):
                raise RuntimeError(f"{src}: {name} does not read back equal to the trained weights")
    d = load_dflash(work / DFLASH, load_target(work / TARGET))
    if any(not torch.equal(d.tensors[k].float(), v.float()) for k, v in d_bf16.items()):
        raise RuntimeError(f"{DFLASH} does not read back equal to the trained weights")


def _install(work: Path, out: Path, files: list[Path], models: dict, made_by: dict) -> Manifest:
    """Move this build's entries into ``out`` and add them to its manifest (other entries untouched)."""
    mine = (TARGET, GGUF, DFLASH)
    fresh = not (out / "MANIFEST.json").is_file()
    man = Manifest() if fresh else Manifest.read(out)
    if fresh:                                      # a new folder: the shared tokenizer and prompts join it
        man.add_files(out, [p for p in (out / "tokenizer.json", out / "prompts.jsonl") if p.is_file()])
    man.files = {k: v for k, v in man.files.items() if k.split("/")[0] not in mine}
    for name in mine:
        dst = out / name
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink(missing_ok=True)
        os.replace(work / name, dst)
    man.add_files(out, [out / f.relative_to(work) for f in files])
    if man.stored_bytes > MAX_TOTAL_BYTES:
        raise RuntimeError(f"fixtures store {man.stored_bytes} distinct bytes, over the {MAX_TOTAL_BYTES} limit")
    man.models.update({k: {**v, "made_by": made_by} for k, v in models.items()})
    man.write(out)
    return man


def build_qwen38(out_dir: Path, device: str = "cpu", quick: bool = False, progress=None,
                 config: Qwen38DraftsConfig | None = None, tokenizer: Path | None = None) -> Manifest:
    """Train the qwen38 target, its MTP head and a DFlash drafter; write and register them in ``out_dir``."""
    from tokenizers import Tokenizer

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or Qwen38DraftsConfig.for_device(device, quick)
    dev = torch.device(device)
    tok_path = tokenizer or out_dir / "tokenizer.json"
    if not tok_path.is_file():
        raise FileNotFoundError(f"{tok_path}: missing; build the qwen3 fixtures first (same tokenizer)")
    tjson = tok_path.read_text()
    tok = Tokenizer.from_str(tjson)
    rep = Reporter(progress, every=cfg.mtp.log_every)
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        shape = Qwen38Shape(vocab_size=tok.get_vocab_size())
        t_bf16, _, tstats = train_qwen38_target(train, dev, cfg.target_steps, cfg.seed, progress, held=held,
                                                shape=shape, batch=cfg.target_batch, seq=cfg.seq,
                                                eval_windows=cfg.eval_windows)
        rep.log(f"qwen38 target: {tstats['train_seconds']} s, held-out {tstats.get('held_out')}")
        tq = {k: v.to(dev, torch.float32) for k, v in t_bf16.items()}
        tspec = shape.spec(tq)
        fwd = _tforward(tspec)
        tshape = target_shape_of(tspec)
        t0 = time.perf_counter()
        pool = greedy_pool(tq, tshape, train.to(dev), cfg.pool_size, cfg.seq, cfg.pool_prefixes, fwd, dev,
                           torch.Generator().manual_seed(cfg.seed + 3), batch=128, reporter=rep)
        pfx = cfg.pool_prefixes[0]
        held_rows = greedy_pool(tq, tshape, held.to(dev), cfg.eval_rows, cfg.seq, (pfx,), fwd, dev,
                                torch.Generator().manual_seed(cfg.seed + 6), batch=128)
        pool_s = time.perf_counter() - t0
        starts = torch.randint(0, train.numel() - cfg.seq, (cfg.real_rows,), generator=torch.Generator().manual_seed(
            cfg.seed + 7))
        rows = torch.cat([pool.repeat(cfg.greedy_repeat, 1), train[starts[:, None] + torch.arange(cfg.seq)].to(dev)])
        rep.log(f"draft rows: {pool.shape[0]} greedy x {cfg.greedy_repeat} + {cfg.real_rows} real windows "
                f"(greedy rows {pool_s:.0f} s)")
        n_real = min(cfg.eval_windows, (held.numel() - 1) // cfg.seq)
        real_rows = held[: n_real * cfg.seq].view(n_real, cfg.seq).to(dev)

        mp = {k: v.to(dev) for k, v in init_mtp(shape, cfg.seed + 8).items()}
        mcfg = replace(cfg.mtp, seed=cfg.seed + 9)
        mlog = train_mtp(mp, tq, tspec, rows, mcfg, cfg.mtp_chain, dev, rep)
        m_bf16 = round_bf16(mp)
        mq = {k: v.to(dev, torch.float32) for k, v in m_bf16.items()}
        mtp_greedy = eval_mtp(mq, tq, tspec, held_rows, cfg.mtp_chain, pfx, dev)
        mtp_real = eval_mtp(mq, tq, tspec, real_rows, cfg.mtp_chain, 1, dev)
        rep.log(f"mtp: train loss {mlog.tail_mean(50):.4f}, held-out greedy {mtp_greedy}, real {mtp_real}")

        dshape = DraftShape(cfg.dflash_layers, 8, cfg.dflash_layer_ids, tok.token_to_id(tokenizer_train.MASK))
        dp = {k: v.to(dev) for k, v in init_draft(tshape, dshape, cfg.seed + 10).items()}
        dcfg = replace(cfg.dflash, seed=cfg.seed + 11)
        dlog = train_draft(dp, dshape, tq, tshape, rows, dcfg, cfg.anchors_per_row, fwd, dflash_forward, dev, rep)
        d_bf16 = round_bf16(dp)
        dq = {k: v.to(dev, torch.float32) for k, v in d_bf16.items()}
        d_greedy = eval_draft(dq, dshape, tq, tshape, held_rows, fwd, dflash_forward, first_anchor=pfx)
        d_real = eval_draft(dq, dshape, tq, tshape, real_rows, fwd, dflash_forward, first_anchor=1)
        rep.log(f"dflash: train loss {dlog.tail_mean(50):.4f}, held-out greedy accept "
                f"{d_greedy['mean_accept_len_tf']:.3f}, real {d_real['mean_accept_len_tf']:.3f}")

    work = fresh_work(out_dir, "qwen38")
    files = write_qwen38_target(work / TARGET, t_bf16, tjson, shape=shape, extra=m_bf16,
                                extra_config={"mtp_num_hidden_layers": 1})
    files += write_draft(work / DFLASH, tshape, dshape, d_bf16)
    for f in files:
        os.chmod(f, 0o644)
    _readback(work, t_bf16, m_bf16, d_bf16)
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen38.fixture_drafts", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "qwen38_drafts" else f"build_qwen38({out_dir}, {device}, quick={quick})",
               "builder": "bloomery_cli.families.qwen38.fixture_drafts", "quick": cfg.quick, "seed": cfg.seed,
               "versions": _versions(), **_device_info(dev), "seconds": round(time.perf_counter() - t_start, 1)}
    pool_note = (f"{cfg.pool_size} greedy rows of {cfg.seq} (a real training window of P in {list(cfg.pool_prefixes)} "
                 f"tokens + the target's greedy continuation; {pool_s:.0f} s with the held-out rows) x "
                 f"{cfg.greedy_repeat}, and {cfg.real_rows} random {cfg.seq}-token training windows")
    models = {
        TARGET: {"files": [f"{TARGET}/model.safetensors", f"{TARGET}/config.json", GGUF],
                 "architecture": "Qwen3_5ForCausalLM (model_type qwen3_5_text; GGUF arch qwen35)",
                 "shape": asdict(shape), "parameters": tstats["params"], "training": tstats,
                 "held_out": tstats.get("held_out"), "final_train_loss": round(tstats["train_ce_last50"], 4)},
        f"{TARGET}/mtp": {"kind": "mtp", "tensors": "mtp.* in qwen38-tiny/model.safetensors; GGUF blk.4.* + "
                          "blk.4.nextn.*", "parameters": sum(v.numel() for v in m_bf16.values()),
                          "chain_steps_trained": cfg.mtp_chain, "training": {**asdict(mcfg), "rows": pool_note},
                          "final_train_loss": round(mlog.tail_mean(50), 4), "held_out_greedy": mtp_greedy,
                          "held_out_real": mtp_real, "seconds": round(mlog.seconds, 1)},
        DFLASH: {"files": [f"{DFLASH}/model.safetensors", f"{DFLASH}/config.json"], "kind": "dflash",
                 "architecture": "DFlashDraftModel", "target": TARGET, "num_layers": dshape.num_layers,
                 "block_size": dshape.block_size, "target_layer_ids": list(dshape.target_layer_ids),
                 "parameters": sum(v.numel() for v in d_bf16.values()),
                 "training": {**asdict(dcfg), "anchors_per_row": cfg.anchors_per_row, "rows": pool_note},
                 "final_train_loss": round(dlog.tail_mean(50), 4), "held_out_greedy": d_greedy,
                 "held_out_real": d_real, "seconds": round(dlog.seconds, 1)},
    }
    man = _install(work, out_dir, files, models, made_by)
    clean_work(work)
    verified(out_dir, "qwen38 build")
    rep.log(f"qwen38 fixtures written to {out_dir} (fixtures total {man.total_bytes} bytes) in "
            f"{time.perf_counter() - t_start:.0f} s")
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.families.qwen38.fixture_drafts",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a few steps only (pipeline check, not for use)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args(argv)
    build_qwen38(a.out, a.device, a.quick, config=Qwen38DraftsConfig.for_device(a.device, a.quick, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
