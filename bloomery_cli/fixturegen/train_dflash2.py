"""Distilling the fixture's DFlash2 draft from the frozen target, and writing it in the HF layout.

Data and schedule are DFlash's (``fixturegen.train``): rows are a real window followed by the target's
greedy continuation (``greedy_pool``), anchors s uniform in [1, seq-B], the label of slot j (1..B-1) is
the target's argmax at s+j-1. The objective is the method's two terms:

    L = sum_j w_j CE(l_j, y_j)                                      DFlash objective, w_j = exp(-(j-1)/(B/2)) / Z
      + lambda * sum_j w_j CE(S_j[pred_j, :], index of y_j in C_j)   selector CE, teacher-forced predecessors

with pred_1 = the anchor x_s, pred_j = y_{j-1}; C_j = top-K of l_j (detached) with y_j forced in as the K-th
candidate when absent; S_j[pred, c] = U_j[c] + sum_r A[pred, r] g_j[r] Bs[C_j[c], r] (U_j not detached).

Init: the DFlash backbone as ``init_draft``; conv = identity (base_kernel[:, 0] = 1, base_kernel[:, t>0] = 0,
kernel_projection = 0), so the untrained draft is exactly DFlash; selector matrices normal(0, std).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DFlash2Spec, ModelSpec

from .export_hf import _json, draft_config, write_safetensors
from .train import (
    DraftShape,
    Reporter,
    Schedule,
    TargetShape,
    TrainConfig,
    TrainLog,
    _anchor_labels,
    _autocast,
    _optimizer,
    descend,
    eval_draft,
    greedy_pool,
    init_draft,
    position_weights,
    round_bf16,
)

ARCHITECTURE = "DFlash2DraftModel"
SELECTOR = "candidate_selector."


@dataclass(frozen=True)
class DFlash2Shape:
    """The fixture's draft: DFlash's (B = 8, layers (1, 2, 4)) plus T = 2, g = 16 (G = 8 at H = 128), r = 32, K = 8."""

    num_layers: int = 1
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = (1, 2, 4)
    mask_token_id: int = 1
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 32
    selector_top_k: int = 8
    output_multiplier: float = 1.0

    def dflash(self) -> DraftShape:
        return DraftShape(self.num_layers, self.block_size, tuple(self.target_layer_ids), self.mask_token_id)


def target_shape_of(spec: ModelSpec) -> TargetShape:
    s = spec.layer
    return TargetShape(s.hidden_size, spec.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
                       spec.vocab_size, s.rms_eps, s.rope_theta, spec.max_position)


def init_dflash2(shape: TargetShape, d: DFlash2Shape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """float32 CPU tensors under DFlash2's names; the conv starts as the identity."""
    p = init_draft(shape, d.dflash(), seed, std)
    gen = torch.Generator().manual_seed(seed + 1)
    H, T, G = shape.hidden_size, d.conv_kernel_size, shape.hidden_size // d.conv_group_size
    for i in range(d.num_layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, T, H)
            base[:, 0] = 1.0
            p[f"layers.{i}.{conv}.base_kernel"] = base
            p[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(2 * T * G, H)
    p[SELECTOR + "hidden_projection.weight"] = torch.randn(d.selector_rank, H, generator=gen) * std
    p[SELECTOR + "predecessor_codebook"] = torch.randn(shape.vocab_size, d.selector_rank, generator=gen) * std
    p[SELECTOR + "successor_codebook"] = torch.randn(shape.vocab_size, d.selector_rank, generator=gen) * std
    return p


def dflash2_spec(shape: TargetShape, d: DFlash2Shape, params: Mapping[str, torch.Tensor],
                 source: Path = Path("fixtures/qwen3-tiny-dflash2-b8")) -> DFlash2Spec:
    return DFlash2Spec(kind="dflash2", source=source, layer=shape.layer(), num_layers=d.num_layers,
                       block_size=d.block_size, mask_token_id=d.mask_token_id,
                       target_layer_ids=tuple(d.target_layer_ids), vocab_size=shape.vocab_size,
                       conv_kernel_size=d.conv_kernel_size, conv_group_size=d.conv_group_size,
                       selector_rank=d.selector_rank, selector_top_k=d.selector_top_k, tensors=params,
                       output_multiplier=d.output_multiplier)


def dflash2_config(shape: TargetShape, dspec: DFlash2Spec) -> dict:
    """config.json: DFlash's layout with architectures DFlash2DraftModel and the DFlash2 keys in dflash_config."""
    d = DraftShape(dspec.num_layers, dspec.block_size, tuple(dspec.target_layer_ids), dspec.mask_token_id)
    cfg = draft_config(shape, d)
    cfg["architectures"] = [ARCHITECTURE]
    cfg["auto_map"] = {"AutoModel": "dflash2.DFlash2DraftModel"}
    cfg["dflash_config"].update(
        block_size=dspec.block_size, conv_kernel_size=dspec.conv_kernel_size, conv_group_size=dspec.conv_group_size,
        selector_rank=dspec.selector_rank, selector_top_k=dspec.selector_top_k,
        output_multiplier=dspec.output_multiplier, input_embedding_scale=dspec.input_embedding_scale)
    if dspec.final_logit_softcapping is not None:
        cfg["dflash_config"]["final_logit_softcapping"] = dspec.final_logit_softcapping
    return cfg


def write_dflash2(out_dir: Path, target_spec: ModelSpec, dspec: DFlash2Spec) -> list[Path]:
    """config.json + model.safetensors (bf16) in ``out_dir``; returns the two paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(_json(dflash2_config(target_shape_of(target_spec), dspec)))
    write_safetensors(out / "model.safetensors", dspec.tensors)
    return [out / "config.json", out / "model.safetensors"]


@torch.no_grad()
def eval_walk(dparams, dspec: DFlash2Spec, tparams, tspec: ModelSpec, seqs: torch.Tensor, tforward,
              first_anchor: int = 1, batch: int = 32) -> dict:
    """Float32 teacher-forced metrics of the walked path (inference rule) on rows ``seqs`` [N, T], anchors
    every B from ``first_anchor``: per-slot agreement with the target's argmax and 1 + E[leading agreements]."""
    from bloomery_gates.kernels.drafts.dflash2 import forward_train
    from bloomery_gates.kernels.ops.selector import select

    b = dspec.block_size
    grid = torch.arange(first_anchor, seqs.shape[1] - b + 1, b, device=seqs.device)
    agree, accept, blocks = torch.zeros(b - 1, dtype=torch.float64), 0.0, 0
    for b0 in range(0, seqs.shape[0], batch):
        ids = seqs[b0:b0 + batch]
        anchors = grid[None, :].expand(ids.shape[0], -1).contiguous()
        tlogits, hidden = tforward(tparams, tspec, ids)
        labels = _anchor_labels(tlogits.float(), anchors, b)
        out = forward_train(dparams, dspec, tparams, tspec, hidden, ids, anchors)
        sel = select(out.logits, out.g, torch.gather(ids, 1, anchors), dparams[SELECTOR + "predecessor_codebook"],
                     dparams[SELECTOR + "successor_codebook"], dspec.selector_top_k)
        hit = sel.ids == labels
        agree += hit.reshape(-1, b - 1).sum(0).double().cpu()
        accept += float((1 + hit.int().cumprod(-1).sum(-1)).sum())
        blocks += hit.shape[0] * hit.shape[1]
    return {"blocks": blocks, "walk_agreement_per_position": [round(x, 4) for x in (agree / max(1, blocks)).tolist()],
            "walk_mean_accept_len_tf": accept / max(1, blocks)}


def train_dflash2(target_params: Mapping[str, torch.Tensor], target_spec: ModelSpec, tokens: torch.Tensor,
                  device: str | torch.device, steps: int = 3000, seed: int = 1234, progress=None, *,
                  dshape: DFlash2Shape | None = None, batch: int = 64, seq: int = 256, anchors_per_row: int = 16,
                  lr: float = 3e-3, warmup: int = 100, selector_weight: float = 1.0, pool_size: int = 8192,
                  pool_prefixes: tuple[int, ...] = (32, 64, 96, 128), eval_rows: torch.Tensor | None = None,
                  eval_first_anchor: int | None = None, target_forward=None,
                  quiet: bool = False) -> tuple[dict[str, torch.Tensor], DFlash2Spec, dict]:
    """Distil a DFlash2 draft from the frozen target. ``tokens``: a 1-D training stream (a greedy pool of
    ``pool_size`` rows of ``seq`` tokens is made from it) or a 2-D [n, seq] pool used as is.
    Returns (bf16 CPU params, the spec over them, stats: losses, timings, held-out metrics on ``eval_rows``
    [n, T] (default: 64 pool rows) for the backbone argmax and the walked path, anchors every B from
    ``eval_first_anchor`` (default: 1 on ``eval_rows``, the shortest pool prefix on pool rows)).
    ``target_forward``: (params, spec, ids) -> (logits, hidden), the frozen target's differentiable forward
    (default: the qwen3 family's; a qwen38 target passes a closure over its own spec, as the spec handed in by
    ``greedy_pool`` / ``eval_draft`` is the qwen3 form of the target's shape)."""
    from bloomery_gates.kernels.drafts.dflash2 import forward_train
    from bloomery_gates.kernels.families.qwen3.model import forward_train as qwen3_forward

    tforward = target_forward or qwen3_forward

    dev = torch.device(device)
    d = dshape or DFlash2Shape()
    shape = target_shape_of(target_spec)
    tq = {k: v.to(dev, torch.float32) for k, v in target_params.items()}
    tspec = replace(target_spec, tensors=tq)
    rep = Reporter(progress, every=100, quiet=quiet)
    gen = torch.Generator().manual_seed(seed)
    if tokens.ndim == 1:
        pool = greedy_pool(tq, shape, tokens.to(dev), pool_size, seq, pool_prefixes, tforward, dev, gen, reporter=rep)
    else:
        pool = tokens.to(dev)
    b = d.block_size
    cfg = TrainConfig(steps=steps, batch=batch, seq=pool.shape[1], lr=lr, warmup=min(warmup, max(1, steps // 10)),
                      seed=seed)
    dparams = {k: v.to(dev).requires_grad_(True) for k, v in init_dflash2(shape, d, seed).items()}
    dspec = dflash2_spec(shape, d, dparams)
    opt, sched, wpos = _optimizer(dparams, cfg, dev), Schedule(cfg.steps, cfg.lr, cfg.warmup), position_weights(b, dev)
    log, ce_log, sel_log = TrainLog(), [], []
    rep.start("dflash2 draft", steps)
    t0 = time.perf_counter()
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = sched(step)
        ids = pool[torch.randint(0, pool.shape[0], (batch,), generator=gen).to(dev)]
        anchors = torch.randint(1, ids.shape[1] - b + 1, (batch, anchors_per_row), generator=gen).to(dev)
        with torch.no_grad(), _autocast(dev):
            tlogits, hidden = tforward(tq, tspec, ids)
        labels = _anchor_labels(tlogits, anchors, b)
        with _autocast(dev):
            out = forward_train(dparams, dspec, tq, tspec, [h.detach() for h in hidden], ids, anchors, labels)
        ce = F.cross_entropy(out.logits.float().reshape(-1, shape.vocab_size), labels.reshape(-1), reduction="none")
        sel = F.cross_entropy(out.scores.float().reshape(-1, d.selector_top_k), out.target.reshape(-1),
                              reduction="none")
        ce = (ce.view(labels.shape) * wpos).sum(-1).mean()
        sel = (sel.view(labels.shape) * wpos).sum(-1).mean()
        loss = ce + selector_weight * sel
        log.losses.append(descend(opt, loss, dparams, cfg.clip))
        ce_log.append(float(ce.detach()))
        sel_log.append(float(sel.detach()))
        rep.step(step + 1, steps, {"loss": log.losses[-1], "ce": ce_log[-1], "selector": sel_log[-1]})
    log.seconds = time.perf_counter() - t0
    rep.done()
    stored = round_bf16(dparams)
    dq = {k: v.to(dev, torch.float32) for k, v in stored.items()}
    qspec = dflash2_spec(shape, d, dq)
    rows = (eval_rows if eval_rows is not None else pool[:64]).to(dev)
    first = eval_first_anchor or (1 if eval_rows is not None else min(pool_prefixes))

    def backbone(dp, _spec, tp, _ts, hidden, ids, anchors):     # the real target spec: its family's final norm
        return forward_train(dp, qspec, tp, tspec, hidden, ids, anchors).logits

    with torch.no_grad():
        backbone_eval = eval_draft(dq, d.dflash(), tq, shape, rows, tforward, backbone, first_anchor=first)
        walk_eval = eval_walk(dq, qspec, tq, tspec, rows, tforward, first_anchor=first)
    tail = min(100, len(log.losses))
    stats = {"shape": asdict(d), "steps": steps, "batch": batch, "anchors_per_row": anchors_per_row, "lr": lr,
             "selector_weight": selector_weight, "seconds": round(log.seconds, 1),
             "final_train_loss": round(log.tail_mean(tail), 4),
             "final_ce": round(sum(ce_log[-tail:]) / max(1, tail), 4),
             "final_selector_ce": round(sum(sel_log[-tail:]) / max(1, tail), 4),
             "loss_curve": [round(x, 4) for x in log.losses[:: max(1, len(log.losses) // 30)]],
             "eval_backbone": backbone_eval, "eval_walk": walk_eval}
    rep.log(f"dflash2: loss {stats['final_train_loss']:.4f} (ce {stats['final_ce']:.4f}, selector "
            f"{stats['final_selector_ce']:.4f}); tf accept len argmax {backbone_eval['mean_accept_len_tf']:.3f}, "
            f"walk {walk_eval['walk_mean_accept_len_tf']:.3f}")
    return stored, dflash2_spec(shape, d, stored), stats
