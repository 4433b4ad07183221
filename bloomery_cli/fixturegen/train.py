"""Training the fixture target (next-token CE) and distilling its DFlash draft (torch, CPU or CUDA).

The forwards are the device engine's differentiable ones (``kernels.families.qwen3.model.forward_train``
and ``kernels.drafts.dflash.forward_train``), so the fixtures are trained by the very math the gates
run; ``build`` passes them in (tests may pass stand-ins).

Target: random ``seq``-token windows of the training token stream (documents joined by
``<|endoftext|>``), AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine
to 10 %, grad-clip 1.0, bf16 autocast on CUDA, fp32 master weights; stored rounded to bf16.

Draft: distilled from the frozen, bf16-rounded target. Each training row is a ``seq``-token sequence
whose first ``P`` tokens are a real corpus window and whose rest is the target's own greedy
continuation (a pool generated once, the same regime the gates draft in). Anchors s are drawn
uniformly in [1, seq-B]; the label of block row i (1..B-1) is the target's argmax at s+i-1 on that
sequence (teacher-forced distillation; on the greedy part this is exactly the token the verify will
want). Loss: CE with weights exp(-(i-1)/gamma), gamma = B/2, normalised (DFlash's early-position
emphasis).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.spec import DFlashSpec, LayerShape, ModelSpec

TargetForward = Callable[[Mapping[str, torch.Tensor], ModelSpec, torch.Tensor],
                         tuple[torch.Tensor, list[torch.Tensor]]]
DraftForward = Callable[..., torch.Tensor]


# ---------------------------------------------------------------------------------------------- shapes

@dataclass(frozen=True)
class TargetShape:
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    vocab_size: int = 4096
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position: int = 1024

    def layer(self) -> LayerShape:
        return LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                          self.intermediate_size, self.rms_eps, self.rope_theta)


@dataclass(frozen=True)
class DraftShape:
    num_layers: int = 1
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = (1, 2, 4)
    mask_token_id: int = 1


def target_spec(shape: TargetShape, params: Mapping[str, torch.Tensor],
                source: Path = Path("fixtures/qwen3-tiny")) -> ModelSpec:
    return ModelSpec(family="qwen3", source=source, source_format="hf", layer=shape.layer(),
                     num_layers=shape.num_layers, vocab_size=shape.vocab_size, tie_word_embeddings=True,
                     max_position=shape.max_position, tensors=params)


def draft_spec(shape: TargetShape, dshape: DraftShape, dparams: Mapping[str, torch.Tensor],
               source: Path = Path("fixtures/qwen3-tiny-dflash-b8")) -> DFlashSpec:
    return DFlashSpec(kind="dflash", source=source, layer=shape.layer(), num_layers=dshape.num_layers,
                      block_size=dshape.block_size, mask_token_id=dshape.mask_token_id,
                      target_layer_ids=tuple(dshape.target_layer_ids), vocab_size=shape.vocab_size,
                      tensors=dparams)


# ---------------------------------------------------------------------------------------------- init

def _layer_params(prefix: str, s: TargetShape, gen: torch.Generator, std: float) -> dict[str, torch.Tensor]:
    H, d, I = s.hidden_size, s.head_dim, s.intermediate_size

    def r(*shape):
        return torch.randn(*shape, generator=gen) * std

    return {
        prefix + "input_layernorm.weight": torch.ones(H),
        prefix + "self_attn.q_proj.weight": r(s.num_heads * d, H),
        prefix + "self_attn.k_proj.weight": r(s.num_kv_heads * d, H),
        prefix + "self_attn.v_proj.weight": r(s.num_kv_heads * d, H),
        prefix + "self_attn.o_proj.weight": r(H, s.num_heads * d),
        prefix + "self_attn.q_norm.weight": torch.ones(d),
        prefix + "self_attn.k_norm.weight": torch.ones(d),
        prefix + "post_attention_layernorm.weight": torch.ones(H),
        prefix + "mlp.gate_proj.weight": r(I, H),
        prefix + "mlp.up_proj.weight": r(I, H),
        prefix + "mlp.down_proj.weight": r(H, I),
    }


def init_target(shape: TargetShape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """HF-named float32 CPU tensors: normal(0, std) matrices, norms ones (tied: no lm_head)."""
    gen = torch.Generator().manual_seed(seed)
    p = {"model.embed_tokens.weight": torch.randn(shape.vocab_size, shape.hidden_size, generator=gen) * std}
    for i in range(shape.num_layers):
        p.update(_layer_params(f"model.layers.{i}.", shape, gen, std))
    p["model.norm.weight"] = torch.ones(shape.hidden_size)
    return p


def init_draft(shape: TargetShape, dshape: DraftShape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """z-lab-named float32 CPU tensors."""
    gen = torch.Generator().manual_seed(seed)
    H = shape.hidden_size
    n = len(dshape.target_layer_ids)
    p = {"fc.weight": torch.randn(H, n * H, generator=gen) * std, "hidden_norm.weight": torch.ones(H)}
    for i in range(dshape.num_layers):
        p.update(_layer_params(f"layers.{i}.", shape, gen, std))
    p["norm.weight"] = torch.ones(H)
    return p


def round_bf16(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU bf16 copies (what is stored)."""
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in params.items()}


# ---------------------------------------------------------------------------------------------- report

class Reporter:
    """Prints a loss line every ``every`` steps; drives a rich ``Progress`` (has ``add_task``) or calls
    a plain callable ``progress(stage, step, total, info)`` when given one."""

    def __init__(self, progress=None, every: int = 100, quiet: bool = False):
        self.progress, self.every, self.quiet = progress, max(1, every), quiet
        self._task = None

    def log(self, msg: str) -> None:
        if self.quiet:
            return
        console = getattr(self.progress, "console", None)
        if console is not None and hasattr(console, "print"):
            console.print(msg, markup=False, highlight=False)
        else:
            print(msg, flush=True)

    def start(self, stage: str, total: int) -> None:
        self._stage = stage
        if self.progress is not None and hasattr(self.progress, "add_task"):
            self._task = self.progress.add_task(stage, total=total)

    def step(self, i: int, total: int, info: dict) -> None:
        if self._task is not None:
            self.progress.update(self._task, completed=i)
        elif callable(self.progress):
            self.progress(self._stage, i, total, info)
        if i % self.every == 0 or i == total:
            self.log(f"[{self._stage}] step {i}/{total} " + " ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items()))

    def done(self) -> None:
        if self._task is not None:
            self.progress.update(self._task, visible=False)
            self._task = None


# ---------------------------------------------------------------------------------------------- train

@dataclass
class Schedule:
    steps: int
    lr: float = 3e-3
    warmup: int = 100
    min_ratio: float = 0.1

    def __call__(self, step: int) -> float:             # step 0-based
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@dataclass
class TrainConfig:
    steps: int
    batch: int
    seq: int
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 100
    clip: float = 1.0
    seed: int = 0
    log_every: int = 100


@dataclass
class TrainLog:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def tail_mean(self, n: int = 100) -> float:
        tail = self.losses[-n:]
        return float(sum(tail) / max(1, len(tail)))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _optimizer(params: dict[str, torch.Tensor], cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in params.values() if p.ndim >= 2]
    other = [p for p in params.values() if p.ndim < 2]
    kw = {"fused": True} if device.type == "cuda" else {"foreach": False}
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def descend(opt: torch.optim.Optimizer, loss: torch.Tensor, params: Mapping[str, torch.Tensor], clip: float) -> float:
    """One optimiser step on ``loss`` with the gradient norm clipped at ``clip``; returns the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
    opt.step()
    return float(loss.detach())


def sample_windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows [n, length] of a 1-D token stream (starts drawn on the CPU generator)."""
    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen)
    idx = starts[:, None] + torch.arange(length)[None, :]
    return stream[idx.to(stream.device)]


def train_target(params: dict[str, torch.Tensor], shape: TargetShape, stream: torch.Tensor, cfg: TrainConfig,
                 forward: TargetForward, device: torch.device, reporter: Reporter) -> TrainLog:
    """Trains ``params`` (float32 leaves on ``device``) in place on next-token CE."""
    for p in params.values():
        p.requires_grad_(True)
    spec = target_spec(shape, params)
    opt = _optimizer(params, cfg, device)
    sched = Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen = torch.Generator().manual_seed(cfg.seed)
    log = TrainLog()
    reporter.start("target", cfg.steps)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        w = sample_windows(stream, cfg.batch, cfg.seq + 1, gen)
        with _autocast(device):
            logits, _ = forward(params, spec, w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1))
        log.losses.append(descend(opt, loss, params, cfg.clip))
        reporter.step(step + 1, cfg.steps, {"loss": log.losses[-1], "lr": f"{sched(step):.2e}"})
    log.seconds = time.perf_counter() - t0
    reporter.done()
    for p in params.values():
        p.requires_grad_(False)
    return log


@torch.no_grad()
def eval_target(params: Mapping[str, torch.Tensor], shape: TargetShape, stream: torch.Tensor, seq: int,
                forward: TargetForward, batch: int = 64, max_windows: int | None = None) -> dict:
    """Mean next-token CE and top-1 (float32, no autocast) over consecutive ``seq``-token windows of a
    1-D ``stream`` (each window also reads the token after it), or over the rows of a 2-D [n, seq+1]."""
    spec = target_spec(shape, params)
    if stream.ndim == 2:
        rows = stream
    else:
        n_all = (stream.numel() - 1) // seq
        starts = torch.arange(n_all) * seq
        rows = stream[(starts[:, None] + torch.arange(seq + 1)[None, :]).to(stream.device)]
    if max_windows is not None:
        rows = rows[:max_windows]
    total, count, correct = 0.0, 0, 0
    for b0 in range(0, rows.shape[0], batch):
        w = rows[b0:b0 + batch]
        logits, _ = forward(params, spec, w[:, :-1])
        logits = logits.float()
        total += float(F.cross_entropy(logits.reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1), reduction="sum"))
        correct += int((logits.argmax(-1) == w[:, 1:]).sum())
        count += w[:, 1:].numel()
    ce = total / max(1, count)
    return {"ce": ce, "ppl": math.exp(ce), "top1": correct / max(1, count), "tokens": count}


@torch.no_grad()
def greedy_pool(params: Mapping[str, torch.Tensor], shape: TargetShape, stream: torch.Tensor, n: int, seq: int,
                prefixes: tuple[int, ...], forward: TargetForward, device: torch.device, gen: torch.Generator,
                batch: int = 512, reporter: Reporter | None = None) -> torch.Tensor:
    """[n, seq] sequences: a real window of P tokens (P cycling over ``prefixes``) then the target's greedy
    continuation up to ``seq`` tokens. Plain full re-forward per token (no cache): small model, fine."""
    spec = target_spec(shape, params)
    out = []
    chunks = list(range(0, n, batch))
    if reporter is not None:
        reporter.start("greedy pool", len(chunks))
    for j, b0 in enumerate(chunks):
        m = min(batch, n - b0)
        p = prefixes[j % len(prefixes)]
        x = sample_windows(stream, m, p, gen)
        while x.shape[1] < seq:
            with _autocast(device):
                logits, _ = forward(params, spec, x)
            x = torch.cat([x, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
        out.append(x)
        if reporter is not None:
            reporter.step(j + 1, len(chunks), {"sequences": b0 + m})
    if reporter is not None:
        reporter.done()
    return torch.cat(out, 0)


def _anchor_labels(tlogits: torch.Tensor, anchors: torch.Tensor, b: int) -> torch.Tensor:
    """labels [N, A, B-1]: the target's argmax at s+i-1 for rows i = 1..B-1."""
    n, a = anchors.shape
    pos = anchors[..., None] + torch.arange(b - 1, device=anchors.device)               # s .. s+B-2
    return torch.gather(tlogits.argmax(-1), 1, pos.reshape(n, -1)).reshape(n, a, b - 1)


def position_weights(b: int, device, gamma: float | None = None) -> torch.Tensor:
    gamma = b / 2 if gamma is None else gamma
    w = torch.exp(-torch.arange(b - 1, dtype=torch.float32, device=device) / gamma)
    return w / w.sum()


def train_draft(dparams: dict[str, torch.Tensor], dshape: DraftShape, tparams: Mapping[str, torch.Tensor],
                shape: TargetShape, pool: torch.Tensor, cfg: TrainConfig, anchors_per_row: int,
                forward: TargetForward, dforward: DraftForward, device: torch.device,
                reporter: Reporter) -> TrainLog:
    """Distils ``dparams`` (float32 leaves on ``device``) from the frozen target on rows of ``pool``."""
    for p in dparams.values():
        p.requires_grad_(True)
    tspec = target_spec(shape, tparams)
    dspec = draft_spec(shape, dshape, dparams)
    b = dshape.block_size
    opt = _optimizer(dparams, cfg, device)
    sched = Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen = torch.Generator().manual_seed(cfg.seed)
    wpos = position_weights(b, device)
    log = TrainLog()
    reporter.start("draft", cfg.steps)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        rows = torch.randint(0, pool.shape[0], (cfg.batch,), generator=gen)
        ids = pool[rows.to(pool.device)]
        anchors = torch.randint(1, ids.shape[1] - b + 1, (cfg.batch, anchors_per_row), generator=gen).to(device)
        with torch.no_grad(), _autocast(device):
            tlogits, hidden = forward(tparams, tspec, ids)
        labels = _anchor_labels(tlogits, anchors, b)
        with _autocast(device):
            dlogits = dforward(dparams, dspec, tparams, tspec, [h.detach() for h in hidden], ids, anchors)
        ce = F.cross_entropy(dlogits.float().reshape(-1, shape.vocab_size), labels.reshape(-1), reduction="none")
        loss = (ce.view(*labels.shape) * wpos).sum(-1).mean()
        log.losses.append(descend(opt, loss, dparams, cfg.clip))
        reporter.step(step + 1, cfg.steps, {"loss": log.losses[-1], "lr": f"{sched(step):.2e}"})
    log.seconds = time.perf_counter() - t0
    reporter.done()
    for p in dparams.values():
        p.requires_grad_(False)
    return log


@torch.no_grad()
def eval_draft(dparams: Mapping[str, torch.Tensor], dshape: DraftShape, tparams: Mapping[str, torch.Tensor],
               shape: TargetShape, seqs: torch.Tensor, forward: TargetForward, dforward: DraftForward,
               first_anchor: int = 1, batch: int = 32) -> dict:
    """Float32 (no autocast) draft metrics on rows ``seqs`` [N, T], anchors every B positions from
    ``first_anchor``: block CE per row position i, top-1 agreement with the target's argmax per i, and
    the teacher-forced mean acceptance length 1 + E[leading agreements] (exact for greedy verify on
    rows that are the target's own greedy continuation)."""
    tspec = target_spec(shape, tparams)
    dspec = draft_spec(shape, dshape, dparams)
    b = dshape.block_size
    t = seqs.shape[1]
    grid = torch.arange(first_anchor, t - b + 1, b, device=seqs.device)
    ce_sum = torch.zeros(b - 1, dtype=torch.float64)
    agree = torch.zeros(b - 1, dtype=torch.float64)
    accept_sum, blocks = 0.0, 0
    for b0 in range(0, seqs.shape[0], batch):
        ids = seqs[b0:b0 + batch]
        anchors = grid[None, :].expand(ids.shape[0], -1).contiguous()
        tlogits, hidden = forward(tparams, tspec, ids)
        labels = _anchor_labels(tlogits.float(), anchors, b)
        dlogits = dforward(dparams, dspec, tparams, tspec, hidden, ids, anchors).float()
        ce = F.cross_entropy(dlogits.reshape(-1, shape.vocab_size), labels.reshape(-1), reduction="none")
        ce_sum += ce.view(-1, b - 1).sum(0).double().cpu()
        hit = dlogits.argmax(-1) == labels                                         # [N, A, B-1]
        agree += hit.reshape(-1, b - 1).sum(0).double().cpu()
        lead = hit.int().cumprod(-1).sum(-1)                                         # leading agreements
        accept_sum += float((1 + lead).sum())
        blocks += hit.shape[0] * hit.shape[1]
    ce_pos = (ce_sum / max(1, blocks)).tolist()
    return {
        "blocks": blocks,
        "block_ce": float(sum(ce_pos) / len(ce_pos)),
        "ce_per_position": [round(x, 4) for x in ce_pos],
        "top1_agreement_per_position": [round(x, 4) for x in (agree / max(1, blocks)).tolist()],
        "mean_accept_len_tf": accept_sum / max(1, blocks),
    }
