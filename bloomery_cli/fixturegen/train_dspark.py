"""Distilling the fixture's DSpark drafter from the frozen qwen3 target, and writing it (DeepSpec layout).

Same regime as the DFlash fixture (``train.train_draft``): rows of the target's greedy continuation
pool, anchors s uniform in [1, T-B], the frozen target's taps as context, AdamW + warmup/cosine,
grad-clip 1.0, bf16 autocast on CUDA. DSpark is anchor-first, so block row k = 0..B-1 is labelled
with the target's argmax at s+k (the token at s+k+1), and the Markov inputs are teacher-forced:
prev_0 = x_s, prev_k = label_{k-1} (what a greedy verify accepts). Loss per block:

    CE = sum_k w_k CE(logits_k, label_k),      w_k = exp(-k / gamma) normalised, gamma = (B+1)/2
    BCE = mean_k BCE(conf_logit_k, [argmax logits_k == label_k])      (target detached)
    loss = CE + conf_weight * BCE

Initialisation: the DFlash set as ``train.init_draft`` (normal(0, 0.02), norms ones), markov_w1
normal(0, 0.02), markov_w2 zeros (training starts at the plain backbone), confidence head zeros.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DSparkSpec, ModelSpec

from .export_hf import target_config, write_safetensors
from .train import (
    DraftShape,
    Reporter,
    Schedule,
    TargetShape,
    TrainConfig,
    _anchor_labels,
    _autocast,
    _optimizer,
    descend,
    init_draft,
    position_weights,
    round_bf16,
    sample_windows,
)

DSPARK_DIR = "qwen3-tiny-dspark-b7"


@dataclass(frozen=True)
class DSparkShape:
    num_layers: int = 1                    # the DFlash fixture's depth
    block_size: int = 7                    # DeepSpec's B (B drafts, B+1 verify rows)
    target_layer_ids: tuple[int, ...] = (1, 2, 4)
    mask_token_id: int = 1
    markov_rank: int = 32
    confidence: bool = True


def target_shape(spec: ModelSpec) -> TargetShape:
    s = spec.layer
    return TargetShape(s.hidden_size, spec.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
                       spec.vocab_size, s.rms_eps, s.rope_theta, spec.max_position)


def dspark_spec(target: ModelSpec, d: DSparkShape, params: Mapping[str, torch.Tensor],
                source: Path = Path("fixtures") / DSPARK_DIR) -> DSparkSpec:
    return DSparkSpec(kind="dspark", source=source, layer=target.layer, num_layers=d.num_layers,
                      block_size=d.block_size, mask_token_id=d.mask_token_id,
                      target_layer_ids=tuple(d.target_layer_ids), vocab_size=target.vocab_size,
                      markov_rank=d.markov_rank, markov_head_type="vanilla", confidence=d.confidence,
                      tensors=params)


def init_dspark(target: ModelSpec, d: DSparkShape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """DeepSpec-named float32 CPU tensors (no embed/head copies: the target's are used)."""
    p = init_draft(target_shape(target), DraftShape(d.num_layers, d.block_size, d.target_layer_ids, d.mask_token_id),
                   seed, std)
    gen = torch.Generator().manual_seed(seed + 1)
    V, H, r = target.vocab_size, target.hidden_size, d.markov_rank
    if r:
        p["markov_head.markov_w1.weight"] = torch.randn(V, r, generator=gen) * std
        p["markov_head.markov_w2.weight"] = torch.zeros(V, r)
    if d.confidence:
        p["confidence_head.proj.weight"] = torch.zeros(1, H + r)
        p["confidence_head.proj.bias"] = torch.zeros(1)
    return p


def _rows(tokens: torch.Tensor, n: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """n training rows: random rows of a 2-D pool [N, T], or random seq-windows of a 1-D stream."""
    if tokens.ndim == 2:
        return tokens[torch.randint(0, tokens.shape[0], (n,), generator=gen).to(tokens.device)]
    return sample_windows(tokens, n, seq, gen)


def train_dspark(target_params: Mapping[str, torch.Tensor], target_spec: ModelSpec, tokens: torch.Tensor,
                 device: str | torch.device, steps: int, seed: int, progress=None, *,
                 shape: DSparkShape = DSparkShape(), batch: int = 64, seq: int = 256, anchors_per_row: int = 16,
                 lr: float = 3e-3, warmup: int = 100, conf_weight: float = 0.5, log_every: int = 100,
                 eval_rows: torch.Tensor | None = None, eval_first_anchor: int = 1,
                 quiet: bool = False, target_forward=None
                 ) -> tuple[dict[str, torch.Tensor], DSparkSpec, dict[str, Any]]:
    """Distil a DSpark drafter from the frozen target on ``tokens`` (the greedy pool [N, T], or a 1-D stream).

    Returns (the bf16-rounded CPU tensors to store, their DSparkSpec, stats). ``eval_rows`` [M, T] (e.g.
    held-out greedy rows) adds ``stats["eval"]`` from ``eval_dspark`` on the stored weights.
    ``target_forward(params, spec, ids) -> (logits, hidden)`` is the target's differentiable forward (default:
    the qwen3 family's; the qwen38 build passes its own).
    """
    from bloomery_gates.kernels.drafts.dspark import forward_train as dforward
    from bloomery_gates.kernels.families.qwen3.model import forward_train as qwen3_forward

    tforward = target_forward or qwen3_forward

    dev = torch.device(device)
    tparams = {k: v.to(dev, torch.float32) for k, v in target_params.items()}
    tspec = ModelSpec(target_spec.family, target_spec.source, target_spec.source_format, target_spec.layer,
                      target_spec.num_layers, target_spec.vocab_size, target_spec.tie_word_embeddings,
                      target_spec.max_position, tparams)
    dparams = {k: v.to(dev).requires_grad_(True) for k, v in init_dspark(target_spec, shape, seed).items()}
    dspec = dspark_spec(target_spec, shape, dparams)
    cfg = TrainConfig(steps=steps, batch=batch, seq=seq, lr=lr, warmup=warmup, seed=seed + 1, log_every=log_every)
    opt, sched = _optimizer(dparams, cfg, dev), Schedule(steps, lr, warmup)
    gen = torch.Generator().manual_seed(cfg.seed)
    b = shape.block_size
    wpos = position_weights(b + 1, dev)                   # B weights, gamma = (B+1)/2
    tokens = tokens.to(dev)
    rep = Reporter(progress, every=log_every, quiet=quiet)
    losses, ces, bces = [], [], []
    rep.start("dspark", steps)
    t0 = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        ids = _rows(tokens, batch, seq, gen)
        anchors = torch.randint(1, ids.shape[1] - b + 1, (batch, anchors_per_row), generator=gen).to(dev)
        with torch.no_grad(), _autocast(dev):
            tlogits, hidden = tforward(tparams, tspec, ids)
        labels = _anchor_labels(tlogits.float(), anchors, b + 1)                          # [N, A, B]: s .. s+B-1
        prev = torch.cat([torch.gather(ids, 1, anchors)[..., None], labels[..., :-1]], dim=-1)
        with _autocast(dev):
            logits, z = dforward(dparams, dspec, tparams, tspec, [h.detach() for h in hidden], ids, anchors, prev)
        ce = F.cross_entropy(logits.float().reshape(-1, target_spec.vocab_size), labels.reshape(-1), reduction="none")
        ce = (ce.view(*labels.shape) * wpos).sum(-1).mean()
        loss = ce
        if z is not None:
            hit = (logits.detach().argmax(-1) == labels).float()
            bce = F.binary_cross_entropy_with_logits(z.float(), hit)
            loss = ce + conf_weight * bce
            bces.append(float(bce.detach()))
        losses.append(descend(opt, loss, dparams, cfg.clip))
        ces.append(float(ce.detach()))
        rep.step(step + 1, steps, {"loss": losses[-1], "ce": ces[-1], "lr": f"{sched(step):.2e}"})
    seconds = time.perf_counter() - t0
    rep.done()
    stored = round_bf16(dparams)
    tail = lambda xs: round(sum(xs[-100:]) / max(1, len(xs[-100:])), 4)  # noqa: E731
    stats: dict[str, Any] = {
        "shape": asdict(shape), "training": {**asdict(cfg), "anchors_per_row": anchors_per_row,
                                             "conf_weight": conf_weight, "seconds": round(seconds, 1)},
        "final_train_loss": tail(losses), "final_ce": tail(ces), "final_bce": tail(bces) if bces else None,
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 30)]],
    }
    if eval_rows is not None:
        widened = {k: v.to(dev, torch.float32) for k, v in stored.items()}
        stats["eval"] = eval_dspark(widened, dspark_spec(target_spec, shape, widened), tparams, tspec,
                                    eval_rows.to(dev), first_anchor=eval_first_anchor, target_forward=tforward)
    return stored, dspark_spec(target_spec, shape, stored), stats


@torch.no_grad()
def eval_dspark(dparams: Mapping[str, torch.Tensor], dspec: DSparkSpec, tparams: Mapping[str, torch.Tensor],
                tspec: ModelSpec, seqs: torch.Tensor, first_anchor: int = 1, batch: int = 32,
                cuts: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7), target_forward=None) -> dict[str, Any]:
    """Float32 teacher-forced metrics on rows ``seqs`` [N, T], anchors every B+1 from ``first_anchor``:
    top-1 agreement per row k, and per confidence cut t the mean drafts proposed and the mean
    acceptance length 1 + min(leading agreements, drafts kept) (exact for a greedy verify on rows that
    are the target's own greedy continuation)."""
    from bloomery_gates.kernels.drafts.dspark import forward_train as dforward
    from bloomery_gates.kernels.families.qwen3.model import forward_train as qwen3_forward

    tforward = target_forward or qwen3_forward
    b = dspec.block_size
    grid = torch.arange(first_anchor, seqs.shape[1] - b + 1, b + 1, device=seqs.device)
    agree = torch.zeros(b, dtype=torch.float64)
    accept = {t: 0.0 for t in cuts}
    drafts = {t: 0.0 for t in cuts}
    blocks = 0
    for b0 in range(0, seqs.shape[0], batch):
        ids = seqs[b0:b0 + batch]
        anchors = grid[None, :].expand(ids.shape[0], -1).contiguous()
        tlogits, hidden = tforward(tparams, tspec, ids)
        labels = _anchor_labels(tlogits.float(), anchors, b + 1)
        prev = torch.cat([torch.gather(ids, 1, anchors)[..., None], labels[..., :-1]], dim=-1)
        logits, z = dforward(dparams, dspec, tparams, tspec, hidden, ids, anchors, prev)
        hit = logits.float().argmax(-1) == labels                                 # [N, A, B]
        agree += hit.reshape(-1, b).sum(0).double().cpu()
        lead = hit.int().cumprod(-1).sum(-1)
        for t in cuts:
            keep = torch.full_like(lead, b)
            if z is not None and t > 0:
                low = (torch.sigmoid(z.float()) < t).int()
                keep = torch.where(low.any(-1), low.argmax(-1), b).clamp(min=1)
            accept[t] += float((1 + torch.minimum(lead, keep)).sum())
            drafts[t] += float(keep.sum())
        blocks += hit.shape[0] * hit.shape[1]
    n = max(1, blocks)
    return {"blocks": blocks, "top1_agreement_per_position": [round(x, 4) for x in (agree / n).tolist()],
            "mean_accept_len_tf": {str(t): round(accept[t] / n, 4) for t in cuts},
            "mean_drafts": {str(t): round(drafts[t] / n, 4) for t in cuts}}


def dspark_config(target: ModelSpec, dspec: DSparkSpec) -> dict[str, Any]:
    """config.json in the DeepSpec layout: a Qwen3 config of the draft stack plus the DSpark keys."""
    cfg = target_config(target_shape(target))
    depth = dspec.num_layers
    cfg.update({
        "architectures": ["Qwen3DSparkModel"], "block_size": dspec.block_size,
        "target_layer_ids": list(dspec.target_layer_ids), "mask_token_id": dspec.mask_token_id,
        "markov_rank": dspec.markov_rank, "markov_head_type": dspec.markov_head_type,
        "enable_confidence_head": dspec.confidence, "layer_types": ["full_attention"] * depth,
        **({"confidence_head_with_markov": dspec.markov_rank > 0} if dspec.confidence else {}),
        "max_window_layers": depth, "num_hidden_layers": depth, "num_target_layers": target.num_layers,
        "tie_word_embeddings": False,
    })
    return cfg


def write_dspark(out_dir: Path, dparams: Mapping[str, torch.Tensor], dspec: DSparkSpec,
                 target: ModelSpec) -> list[Path]:
    """HF layout: config.json + model.safetensors (bf16, canonical DeepSpec names)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(dspark_config(target, dspec), indent=2, sort_keys=True) + "\n")
    write_safetensors(out_dir / "model.safetensors", dparams)
    return [out_dir / "config.json", out_dir / "model.safetensors"]
