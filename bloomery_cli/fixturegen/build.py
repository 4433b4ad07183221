"""Build the trained fixtures: tokenizer, held-out prompts, Qwen3 target (HF + GGUF), DFlash draft, manifest.

    python -m bloomery_cli.fixturegen.build --out fixtures --device cuda          # the real build (GPU)
    python -m bloomery_cli.fixturegen.build --out /tmp/fx --device cpu --quick    # pipeline check

Everything is seeded; on the same Python (same stdlib corpus), torch version and device type the files
come out byte-identical (checked: two H200 builds, identical hashes). The build happens in
``<out>/../.fixtures-work/<name>`` and only replaces the entries it makes in ``out`` once everything was
written and read back (safetensors, GGUF and tokenizer re-read and compared exactly).

Outputs (names the gates use): tokenizer.json, prompts.jsonl, qwen3-tiny/ (HF), qwen3-tiny.gguf,
qwen3-tiny-dflash-b8/ (z-lab DFlash, 2 layers, block 8, target_layer_ids [1, 2, 4]), MANIFEST.json.
On an H200 the full build takes about 5 minutes (target 3000 steps ~2 min, greedy pool ~45 s, draft
3000 steps ~1.8 min).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import corpus as corpus_mod
from . import export_gguf, export_hf, tokenizer_train
from .draft_context import DraftContext, ExtraDrafter
from .extra_drafters import DEFAULT
from .install import check_readback, install, keep_other_entries
from .layout import DRAFT_DIR, PROMPTS, TARGET_DIR, TARGET_GGUF, TOKENIZER
from .manifest import Manifest
from .manifest import verify as verify_manifest
from .train import (
    DraftShape,
    Reporter,
    TargetShape,
    TrainConfig,
    eval_draft,
    eval_target,
    greedy_pool,
    init_draft,
    init_target,
    round_bf16,
    train_draft,
    train_target,
)

ENTRIES = (TOKENIZER, PROMPTS, TARGET_DIR, TARGET_GGUF, DRAFT_DIR)
MAX_TOTAL_BYTES = 12 * 1024 * 1024


@dataclass
class BuildConfig:
    seed: int = 1234
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=3000, batch=64, seq=256, lr=3e-3,
                                                                     warmup=100, log_every=100))
    draft: TrainConfig = field(default_factory=lambda: TrainConfig(steps=2000, batch=64, seq=256, lr=3e-3,
                                                                    warmup=100, log_every=100))
    draft_layers: int = 2                       # 2 beat 1 clearly on greedy acceptance (3.26 vs 2.16, H200 trial)
    anchors_per_row: int = 16
    pool_size: int = 8192                       # greedy-continuation rows for the draft
    pool_prefixes: tuple[int, ...] = (32, 64, 96, 128)
    eval_windows: int | None = None             # None: all held-out windows
    eval_train_windows: int = 256
    greedy_eval_rows: int = 256
    greedy_eval_prefix: int = 64
    n_prompts: int = 8
    quick: bool = False

    @classmethod
    def quick_config(cls, seed: int = 1234) -> BuildConfig:
        return cls(seed=seed,
                   target=TrainConfig(steps=30, batch=8, seq=128, lr=3e-3, warmup=5, log_every=10),
                   draft=TrainConfig(steps=20, batch=8, seq=128, lr=3e-3, warmup=5, log_every=10),
                   anchors_per_row=8, pool_size=16, pool_prefixes=(32, 64), eval_windows=8,
                   eval_train_windows=8, greedy_eval_rows=8, greedy_eval_prefix=32, quick=True)


# ---------------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _determinism(seed: int):
    """Seeds everything and switches torch to deterministic kernels for the build, then puts the
    process-wide torch settings back as they were (the CLI and tests share the process)."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled())
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_cudnn_sdp(False)         # their SDPA backwards are non-deterministic
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark = saved[2]
        torch.backends.cuda.matmul.allow_tf32 = saved[3]
        torch.backends.cudnn.allow_tf32 = saved[4]
        torch.backends.cuda.enable_cudnn_sdp(saved[5])
        torch.backends.cuda.enable_mem_efficient_sdp(saved[6])


def _stream(docs: list[list[int]], eot: int) -> torch.Tensor:
    """Documents joined as doc EOT doc EOT ..."""
    flat: list[int] = []
    for d in docs:
        flat.extend(d)
        flat.append(eot)
    return torch.tensor(flat, dtype=torch.long)


_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]", re.M)


def pick_prompts(corp: corpus_mod.Corpus, tok, n: int, seed: int, lo: int = 32, hi: int = 64) -> list[dict]:
    """n prompts of lo..hi tokens, each from a different held-out file, each starting at a def/class line
    and ending at a line end where possible; ASCII only and stable under re-encoding."""
    named = [r for r in corp.held_out if any(r.startswith(x) if x.endswith("/") else r == x
                                             for x in corpus_mod.HELD_OUT_NAMED)]
    order = named + [r for r in corp.held_out if r not in named]
    rng = random.Random(seed)
    out: list[dict] = []
    for rel in order:
        if len(out) >= n:
            break
        text = corp.texts[rel]
        starts = [m.start() for m in _DEF.finditer(text)]
        rng.shuffle(starts)
        for st in starts[:20]:
            chunk = text[st:st + 1200]
            if not chunk.isascii():
                continue
            ids = tok.encode(chunk, add_special_tokens=False).ids
            if len(ids) < hi:
                continue
            ends = [k for k in range(hi, lo - 1, -1) if tok.decode(ids[:k]).endswith("\n")]
            k = ends[0] if ends else (lo + hi) // 2
            ptext = tok.decode(ids[:k])
            if tok.encode(ptext, add_special_tokens=False).ids != ids[:k]:
                continue
            out.append({"id": f"p{len(out)}", "source": rel, "line": text.count("\n", 0, st) + 1,
                        "n_tokens": k, "text": ptext, "ids": ids[:k]})
            break
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} prompts found in the held-out files, wanted {n}")
    return out


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import gguf
    import safetensors
    import tokenizers

    try:
        gguf_v = version("gguf")
    except PackageNotFoundError:
        gguf_v = getattr(gguf, "__version__", "?")
    return {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__, "gguf": gguf_v,
            "platform": platform.platform()}


def _device_info(device: torch.device) -> dict:
    d = {"device": str(device)}
    if device.type == "cuda":
        d["device_name"] = torch.cuda.get_device_name(device)
        d["cuda"] = torch.version.cuda
        d["autocast"] = "bfloat16"
    else:
        d["device_name"] = platform.processor() or platform.machine()
        d["autocast"] = "none (float32)"
    return d


def _nparams(p) -> int:
    return int(sum(v.numel() for v in p.values()))


EXTRA_DRAFTERS: list[ExtraDrafter] = []  # more drafters to run after the DFlash draft (tests add here)


def _default_extras() -> list[ExtraDrafter]:
    """DSpark and DFlash2 (fixturegen/extra_drafters.py), then anything registered in EXTRA_DRAFTERS."""
    return [*DEFAULT, *EXTRA_DRAFTERS]


# ---------------------------------------------------------------------------------------------- build

def derive_target_gguf(man: Manifest, work: Path) -> None:
    """The target's GGUF (written and read back above) is not stored: it is the HF target's weights again, made on
    demand by ``fixturegen.derived`` (listed under ``derived`` with its sha256, which the writer must reproduce)."""
    entry = man.files.pop(TARGET_GGUF)
    man.derived[TARGET_GGUF] = {**entry, "from": f"{TARGET_DIR}/model.safetensors + {TOKENIZER}",
                                "by": "bloomery_cli.fixturegen.derived (export_gguf.write_target_gguf)"}
    (work / TARGET_GGUF).unlink()


def build(out_dir: Path, device: str = "cuda", quick: bool = False, progress=None, *,
          config: BuildConfig | None = None, command: str | None = None,
          target_forward=None, draft_forward=None, quiet: bool = False,
          extra_drafters: list[ExtraDrafter] | None = None) -> Manifest:
    """Train and write every fixture into ``out_dir``; returns the manifest written there.

    ``target_forward`` / ``draft_forward`` default to the device engine's ``forward_train`` functions.
    ``extra_drafters`` (default: the ``EXTRA_DRAFTERS`` registry) run after the DFlash draft, each given a
    ``DraftContext``; their files and manifest entries join the build.
    """
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    cfg = config or (BuildConfig.quick_config() if quick else BuildConfig())
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda asked for but torch.cuda.is_available() is False; use --device cpu")
    dev = torch.device(device)
    if target_forward is None:
        from bloomery_gates.kernels.families.qwen3.model import forward_train as target_forward
    if draft_forward is None:
        from bloomery_gates.kernels.drafts.dflash import forward_train as draft_forward
    rep = Reporter(progress, every=cfg.target.log_every, quiet=quiet)
    with _determinism(cfg.seed):
        return _build(out_dir, device, dev, cfg, rep, command, target_forward, draft_forward, t_start,
                      list(_default_extras() if extra_drafters is None else extra_drafters), progress)


def _build(out_dir: Path, device: str, dev: torch.device, cfg: BuildConfig, rep: Reporter, command: str | None,
           target_forward, draft_forward, t_start: float, extras: list[ExtraDrafter], progress) -> Manifest:
    if command is None:
        if Path(sys.argv[0]).name == "bloomery":
            command = "bloomery " + " ".join(sys.argv[1:])
        else:
            command = (f"python -m bloomery_cli.fixturegen.build --out {out_dir} --device {device}"
                       + (" --quick" if cfg.quick else "") + f" --seed {cfg.seed}")

    # corpus + tokenizer ------------------------------------------------------------------------------
    corp = corpus_mod.load_corpus()
    rep.log(f"corpus: {len(corp.train)} train files, {len(corp.held_out)} held out, {corp.n_bytes} bytes, "
            f"sha256 {corp.sha256[:16]}")
    tok = tokenizer_train.train_tokenizer(corp.train_texts())
    eot = tok.token_to_id(tokenizer_train.EOT)
    mask = tok.token_to_id(tokenizer_train.MASK)
    train_stream = _stream(tokenizer_train.encode_docs(tok, corp.train_texts()), eot)
    held_stream = _stream(tokenizer_train.encode_docs(tok, corp.held_out_texts()), eot)
    rep.log(f"tokens: train {train_stream.numel()}, held-out {held_stream.numel()}")
    prompts = pick_prompts(corp, tok, cfg.n_prompts, cfg.seed)

    shape = TargetShape(vocab_size=tok.get_vocab_size())
    dshape = DraftShape(num_layers=cfg.draft_layers, block_size=8, target_layer_ids=(1, 2, 4), mask_token_id=mask)
    train_dev, held_dev = train_stream.to(dev), held_stream.to(dev)

    # target ------------------------------------------------------------------------------------------
    tcfg = replace(cfg.target, seed=cfg.seed + 1)
    tparams = {k: v.to(dev) for k, v in init_target(shape, cfg.seed).items()}
    tlog = train_target(tparams, shape, train_dev, tcfg, target_forward, dev, rep)
    t_bf16 = round_bf16(tparams)
    tq = {k: v.to(dev, torch.float32) for k, v in t_bf16.items()}        # the stored weights, widened
    gen = torch.Generator().manual_seed(cfg.seed + 5)
    tr_rows = torch.randint(0, train_stream.numel() - tcfg.seq - 1, (cfg.eval_train_windows,), generator=gen)
    tr_windows = torch.stack([train_stream[s:s + tcfg.seq + 1] for s in tr_rows.tolist()])
    target_train_eval = eval_target(tq, shape, tr_windows.to(dev), tcfg.seq, target_forward)
    target_held = eval_target(tq, shape, held_dev, tcfg.seq, target_forward, max_windows=cfg.eval_windows)
    rep.log(f"target: train CE {tlog.tail_mean():.4f} (last 100 steps), stored-weights train CE "
            f"{target_train_eval['ce']:.4f}, held-out CE {target_held['ce']:.4f} top1 {target_held['top1']:.3f}")

    # draft -------------------------------------------------------------------------------------------
    t_pool = time.perf_counter()
    pool = greedy_pool(tq, shape, train_dev, cfg.pool_size, cfg.draft.seq, cfg.pool_prefixes, target_forward, dev,
                       torch.Generator().manual_seed(cfg.seed + 3), reporter=rep)
    t_pool = time.perf_counter() - t_pool
    rep.log(f"greedy pool: {pool.shape[0]} rows of {pool.shape[1]} tokens in {t_pool:.1f} s")
    dcfg = replace(cfg.draft, seed=cfg.seed + 4)
    dparams = {k: v.to(dev) for k, v in init_draft(shape, dshape, cfg.seed + 2).items()}
    dlog = train_draft(dparams, dshape, tq, shape, pool, dcfg, cfg.anchors_per_row, target_forward, draft_forward,
                       dev, rep)
    d_bf16 = round_bf16(dparams)
    dq = {k: v.to(dev, torch.float32) for k, v in d_bf16.items()}
    n_real = (held_stream.numel() - 1) // dcfg.seq
    if cfg.eval_windows is not None:
        n_real = min(n_real, cfg.eval_windows)
    real_rows = held_dev[: n_real * dcfg.seq].view(n_real, dcfg.seq)
    draft_real = eval_draft(dq, dshape, tq, shape, real_rows, target_forward, draft_forward, first_anchor=1)
    greedy_rows = greedy_pool(tq, shape, held_dev, cfg.greedy_eval_rows, dcfg.seq, (cfg.greedy_eval_prefix,),
                              target_forward, dev, torch.Generator().manual_seed(cfg.seed + 6))
    draft_greedy = eval_draft(dq, dshape, tq, shape, greedy_rows, target_forward, draft_forward,
                              first_anchor=cfg.greedy_eval_prefix)
    rep.log(f"draft: train loss {dlog.tail_mean():.4f}, held-out block CE {draft_real['block_ce']:.4f}, "
            f"agreement {draft_real['top1_agreement_per_position']}, tf accept len (real) "
            f"{draft_real['mean_accept_len_tf']:.3f}, (greedy) {draft_greedy['mean_accept_len_tf']:.3f}")

    # write -------------------------------------------------------------------------------------------
    work = out_dir.resolve().parent / ".fixtures-work" / out_dir.resolve().name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tjson = tokenizer_train.tokenizer_json(tok)
    (work / TOKENIZER).write_text(tjson)
    with open(work / PROMPTS, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    files = [work / TOKENIZER, work / PROMPTS]
    files += export_hf.write_target(work / TARGET_DIR, shape, t_bf16, tjson)
    files.append(export_gguf.write_target_gguf(work / TARGET_GGUF, shape, t_bf16, tok))
    files += export_hf.write_draft(work / DRAFT_DIR, shape, dshape, d_bf16)
    check_readback(work, t_bf16, d_bf16, tok)
    extra_models: dict[str, dict] = {}
    if extras:
        from .train import target_spec as _tspec

        ctx = DraftContext(work=work, device=dev, quick=cfg.quick, seed=cfg.seed, target_params=tq,
                           target_spec=_tspec(shape, tq), target_shape=shape, train_stream=train_dev,
                           held_stream=held_dev, pool=pool, held_greedy=greedy_rows,
                           held_greedy_first_anchor=cfg.greedy_eval_prefix, draft=dcfg,
                           anchors_per_row=cfg.anchors_per_row, progress=progress, target_forward=target_forward)
        for fn in extras:
            name, extra_files, entry = fn(ctx)
            for f in extra_files:
                if not Path(f).resolve().is_relative_to(work.resolve()):
                    raise RuntimeError(f"extra drafter {name} wrote {f} outside the build folder {work}")
            files += [Path(f) for f in extra_files]
            extra_models[name] = entry
    for f in files:
        os.chmod(f, 0o644)                      # safetensors writes 0600

    man = Manifest()
    man.add_files(work, files)
    derive_target_gguf(man, work)
    if man.stored_bytes > MAX_TOTAL_BYTES:
        raise RuntimeError(f"fixtures store {man.stored_bytes} distinct bytes, over the {MAX_TOTAL_BYTES} limit")
    tc, dc = asdict(tcfg), asdict(dcfg)
    man.made_by = {
        "command": command, "builder": "bloomery_cli.fixturegen.build", "quick": cfg.quick,
        "seeds": {"base": cfg.seed, "target_init": cfg.seed, "target_data": tcfg.seed, "draft_init": cfg.seed + 2,
                  "greedy_pool": cfg.seed + 3, "draft_data": dcfg.seed, "eval_train_windows": cfg.seed + 5,
                  "greedy_eval": cfg.seed + 6, "prompts": cfg.seed},
        "versions": _versions(), **_device_info(dev),
        "deterministic": "torch.use_deterministic_algorithms(True, warn_only=True), CUBLAS_WORKSPACE_CONFIG, "
                         "no TF32; byte-identical on the same python/torch/device type",
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    man.corpus = {**corp.describe(), "train_tokens": int(train_stream.numel()),
                  "held_out_tokens": int(held_stream.numel()), "document_separator": tokenizer_train.EOT}
    man.tokenizer = {"file": TOKENIZER, "kind": "byte-level BPE (HF tokenizers), Qwen2 split regex + ByteLevel",
                     "vocab_size": tok.get_vocab_size(), "special_tokens": {tokenizer_train.EOT: eot,
                                                                            tokenizer_train.MASK: mask},
                     "min_frequency": 2, "trained_on": "the corpus training files",
                     "bytes_per_token_train": round(corp.n_bytes / max(1, train_stream.numel()), 3)}
    man.prompts = {"file": PROMPTS, "count": len(prompts), "from": "held-out files only, a def/class line "
                   "onward, 32..64 tokens, cut at a line end where possible",
                   "sources": [p["source"] for p in prompts]}
    sched = "linear warmup then cosine to 10% of lr; AdamW betas (0.9, 0.95), wd on matrices only, clip 1.0"
    man.models = {
        TARGET_DIR: {
            "files": [f"{TARGET_DIR}/model.safetensors", f"{TARGET_DIR}/config.json"],
            "architecture": "Qwen3ForCausalLM", "shape": asdict(shape), "parameters": _nparams(t_bf16),
            "stored": "bf16 (HF); GGUF: BF16 matrices, F32 norms, bit-identical values",
            "init": "normal(0, 0.02) matrices, ones for norms",
            "training": {**tc, "objective": "next-token CE on random windows of the training stream",
                         "schedule": sched, "tokens_seen": tcfg.steps * tcfg.batch * tcfg.seq,
                         "seconds": round(tlog.seconds, 1)},
            "final_train_loss": round(tlog.tail_mean(), 4),
            "loss_curve": [round(x, 4) for x in tlog.losses[:: max(1, len(tlog.losses) // 30)]],
            "train_eval_stored_weights": target_train_eval,
            "held_out": target_held,
        },
        DRAFT_DIR: {
            "files": [f"{DRAFT_DIR}/model.safetensors", f"{DRAFT_DIR}/config.json"],
            "architecture": "DFlashDraftModel", "target": TARGET_DIR, "parameters": _nparams(d_bf16),
            "num_layers": dshape.num_layers, "block_size": dshape.block_size,
            "mask_token_id": mask, "target_layer_ids": list(dshape.target_layer_ids),
            "init": "normal(0, 0.02) matrices, ones for norms",
            "training": {**dc, "objective": "distillation from the frozen bf16 target: label of block row i "
                         "(1..B-1) anchored at s = the target's argmax at s+i-1 (teacher forced); CE weighted "
                         "exp(-(i-1)/(B/2)), normalised", "schedule": sched,
                         "anchors_per_row": cfg.anchors_per_row,
                         "rows": f"{cfg.pool_size} sequences of {dcfg.seq} tokens: a real training window of "
                                 f"P in {list(cfg.pool_prefixes)} tokens + the target's greedy continuation",
                         "pool_seconds": round(t_pool, 1),
                         "seconds": round(dlog.seconds, 1)},
            "final_train_loss": round(dlog.tail_mean(), 4),
            "loss_curve": [round(x, 4) for x in dlog.losses[:: max(1, len(dlog.losses) // 30)]],
            "held_out_real": {**draft_real, "rows": f"{n_real} consecutive {dcfg.seq}-token held-out windows, "
                                                    "anchors every B from 1"},
            "held_out_greedy": {**draft_greedy, "rows": f"{cfg.greedy_eval_rows} held-out prefixes of "
                                f"{cfg.greedy_eval_prefix} tokens + the target's greedy continuation, anchors "
                                f"every B from {cfg.greedy_eval_prefix}; mean_accept_len_tf here is what a greedy "
                                "verify would accept"},
        },
    }
    man.models.update(extra_models)
    for line in keep_other_entries(man, out_dir):
        rep.log(line)
    man.write(work)
    install(work, out_dir)
    shutil.rmtree(work, ignore_errors=True)
    with contextlib.suppress(OSError):
        work.parent.rmdir()
    problems = verify_manifest(out_dir)
    if problems:
        raise RuntimeError("fixtures do not verify after the build: " + "; ".join(problems))
    rep.log(f"fixtures written to {out_dir} ({man.total_bytes} bytes) in {time.perf_counter() - t_start:.0f} s")
    return man


def verify(out_dir: Path) -> list[str]:
    return verify_manifest(Path(out_dir))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.fixturegen.build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny CPU-friendly build (pipeline check, not for use)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--draft-layers", type=int, default=None)
    ap.add_argument("--pool-size", type=int, default=None, help="greedy-continuation rows for the draft")
    ap.add_argument("--verify", action="store_true", help="only verify an existing build")
    a = ap.parse_args(argv)
    if a.verify:
        problems = verify(a.out)
        for p in problems:
            print(p)
        print("OK" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    cfg = BuildConfig.quick_config(a.seed) if a.quick else BuildConfig(seed=a.seed)
    if a.target_steps is not None:
        cfg.target = replace(cfg.target, steps=a.target_steps)
    if a.draft_steps is not None:
        cfg.draft = replace(cfg.draft, steps=a.draft_steps)
    if a.draft_layers is not None:
        cfg.draft_layers = a.draft_layers
    if a.pool_size is not None:
        cfg.pool_size = a.pool_size
    command = "python -m bloomery_cli.fixturegen.build " + " ".join(sys.argv[1:] if argv is None else argv)
    build(a.out, a.device, a.quick, config=cfg, command=command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
