"""Distilling an EAGLE-3 head from a frozen qwen3 target (training-time test), and writing it in the speculators
``eagle3`` layout.

Rows: sequences of the target's own regime (a real prefix + the target's greedy continuation, and real
windows). The frozen target runs once over every row (``precompute``): its aux rows (taps at the aux ids,
concatenated, [N, T, n*H]) and its argmax per position (the label: the token a greedy verify wants next).

Draft vocabulary (speculators' ``build_vocab_mappings_from_distribution`` rule on the labels): the Vd most
frequent target argmax ids over the training rows (ties to the lower id), sorted; d2t = chosen - arange(Vd),
t2d marks them. A label outside the draft vocabulary is left out of the loss (the head cannot propose it).

Objective (speculators' ttt steps, ``kernels.drafts.eagle3.forward_train``): step 1 reads (tok_q, u_{q-1}),
step s > 1 reads (tok_q, the draft's own chain hidden of step s-1 at q-1) over the chain mask; step s at q is
labelled with the target's argmax at q. loss = sum_s w_s CE_s, w_s = 0.8^(s-1) normalised. AdamW + warmup /
cosine, clip 1.0 (``train.descend``). Init: matrices normal(0, 0.02), norms ones, lm_head = the target's
head rows of the draft vocabulary (speculators loads it from the verifier), trained here too.
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
from safetensors.torch import save_file

from bloomery_gates.spec import Eagle3Spec, ModelSpec

from .train import Reporter, Schedule, TrainConfig, _optimizer, descend, round_bf16

IGNORE = -100


@dataclass(frozen=True)
class Eagle3Shape:
    aux_layer_ids: tuple[int, ...] = (2, 3, 5)   # taps entering layers 2, 3, 5: the DFlash fixtures' features
    draft_vocab_size: int = 2048
    steps: int = 3                               # ttt steps = the chain length K it is trained (and written) for
    step_decay: float = 0.8


def eagle3_spec(target: ModelSpec, shape: Eagle3Shape, params: Mapping[str, torch.Tensor], d2t: torch.Tensor | None,
                source: Path = Path("memory")) -> Eagle3Spec:
    return Eagle3Spec("eagle3", source, target.layer, True, tuple(shape.aux_layer_ids), shape.draft_vocab_size,
                      target.vocab_size, False, False, shape.steps, params, d2t)


def draft_vocab(labels: torch.Tensor, size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [size] int64, t2d [vocab] bool) from the label counts: the ``size`` most frequent ids, sorted."""
    counts = torch.bincount(labels.reshape(-1).cpu(), minlength=vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    chosen = torch.tensor(sorted(order), dtype=torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(size), t2d


def init_eagle3(target: ModelSpec, target_params: Mapping[str, torch.Tensor], shape: Eagle3Shape, d2t: torch.Tensor,
                seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """speculators-named float32 CPU tensors (a Qwen3 draft layer: q/k norms)."""
    gen = torch.Generator().manual_seed(seed)
    s = target.layer
    H, d, I = s.hidden_size, s.head_dim, s.intermediate_size

    def r(*dims):
        return torch.randn(*dims, generator=gen) * std

    a = "layers.0.self_attn."
    head = target_params["model.embed_tokens.weight" if target.tie_word_embeddings else "lm_head.weight"]
    chosen = torch.arange(shape.draft_vocab_size) + d2t
    return {"fc.weight": r(H, len(shape.aux_layer_ids) * H), "layers.0.hidden_norm.weight": torch.ones(H),
            "layers.0.input_layernorm.weight": torch.ones(H), a + "q_proj.weight": r(s.num_heads * d, 2 * H),
            a + "k_proj.weight": r(s.num_kv_heads * d, 2 * H), a + "v_proj.weight": r(s.num_kv_heads * d, 2 * H),
            a + "o_proj.weight": r(H, s.num_heads * d), a + "q_norm.weight": torch.ones(d),
            a + "k_norm.weight": torch.ones(d), "layers.0.post_attention_layernorm.weight": torch.ones(H),
            "layers.0.mlp.gate_proj.weight": r(I, H), "layers.0.mlp.up_proj.weight": r(I, H),
            "layers.0.mlp.down_proj.weight": r(H, I), "norm.weight": torch.ones(H),
            "lm_head.weight": head.detach().float().cpu()[chosen].clone()}


@torch.no_grad()
def precompute(tparams: Mapping[str, torch.Tensor], tspec: ModelSpec, rows: torch.Tensor, aux: tuple[int, ...],
               batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux rows [N, T, n*H] float32, target argmax labels [N, T]) of the frozen target over ``rows``."""
    from bloomery_gates.kernels.families.qwen3.model import forward_train

    feats, labels = [], []
    for b0 in range(0, rows.shape[0], batch):
        logits, hidden = forward_train(tparams, tspec, rows[b0:b0 + batch])
        feats.append(torch.cat([hidden[l] for l in aux], dim=-1).float())
        labels.append(logits.float().argmax(-1))
    return torch.cat(feats), torch.cat(labels)


def _losses(dparams: dict, dspec: Eagle3Spec, embed: torch.Tensor, ids: torch.Tensor, aux: torch.Tensor,
            lab_draft: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per step s (0-based): (logits of rows q >= s+1 [N, T-1-s, Vd], their draft-vocab labels [N, T-1-s])."""
    from bloomery_gates.kernels.drafts.eagle3 import forward_train

    n = len(dspec.aux_layer_ids)
    taps = {l: x for l, x in zip(dspec.aux_layer_ids, aux.chunk(n, dim=-1), strict=True)}
    outs = forward_train({**dparams, "model.embed_tokens.weight": embed}, dspec, taps, ids, dspec.speculative_tokens)
    return [o[:, s:] for s, o in enumerate(outs)], [lab_draft[:, s + 1:] for s in range(len(outs))]


def train_eagle3(tparams: Mapping[str, torch.Tensor], tspec: ModelSpec, rows: torch.Tensor, cfg: TrainConfig,
                 shape: Eagle3Shape, device: torch.device, progress=None, eval_rows: torch.Tensor | None = None,
                 eval_first_anchor: int = 1) -> tuple[dict[str, torch.Tensor], Eagle3Spec, dict[str, Any]]:
    """Distil the head on ``rows`` [N, T]. Returns (the bf16 CPU tensors to store, their spec, stats)."""
    t0 = time.perf_counter()
    aux, labels = precompute(tparams, tspec, rows, shape.aux_layer_ids)
    d2t, t2d = draft_vocab(labels[:, 1:], shape.draft_vocab_size, tspec.vocab_size)
    to_draft = torch.full((tspec.vocab_size,), IGNORE, dtype=torch.long)
    to_draft[torch.arange(shape.draft_vocab_size) + d2t] = torch.arange(shape.draft_vocab_size)
    lab_draft = to_draft.to(device)[labels]
    coverage = float((lab_draft[:, 1:] != IGNORE).float().mean())
    dparams = {k: v.to(device).requires_grad_(True) for k, v in init_eagle3(tspec, tparams, shape, d2t,
                                                                             cfg.seed).items()}
    dspec = eagle3_spec(tspec, shape, dparams, d2t)
    embed = tparams["model.embed_tokens.weight"]
    opt, sched = _optimizer(dparams, cfg, device), Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    w = [shape.step_decay ** s for s in range(shape.steps)]
    w = [x / sum(w) for x in w]
    rep = Reporter(progress, every=cfg.log_every)
    losses: list[float] = []
    rep.start("eagle3", cfg.steps)
    t1 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        pick = torch.randint(0, rows.shape[0], (cfg.batch,), generator=gen).to(device)
        outs, labs = _losses(dparams, dspec, embed, rows[pick], aux[pick], lab_draft[pick])
        loss = sum(ws * F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1), ignore_index=IGNORE)
                   for ws, o, y in zip(w, outs, labs, strict=True))
        losses.append(descend(opt, loss, dparams, cfg.clip))
        rep.step(step + 1, cfg.steps, {"loss": losses[-1], "lr": f"{sched(step):.2e}"})
    rep.done()
    stored = round_bf16(dparams)
    tail = losses[-50:]
    stats: dict[str, Any] = {
        "shape": asdict(shape), "training": {**asdict(cfg), "seconds": round(time.perf_counter() - t1, 1),
                                             "precompute_seconds": round(t1 - t0, 1), "rows": list(rows.shape)},
        "draft_vocab_label_coverage": round(coverage, 4), "final_train_loss": round(sum(tail) / len(tail), 4),
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 30)]]}
    if eval_rows is not None:
        widened = {k: v.to(device, torch.float32) for k, v in stored.items()}
        stats["eval"] = eval_eagle3(widened, eagle3_spec(tspec, shape, widened, d2t), tparams, tspec, eval_rows,
                                    eval_first_anchor)
    return stored, eagle3_spec(tspec, shape, stored, d2t), {**stats, "t2d_count": int(t2d.sum())}


@torch.no_grad()
def eval_eagle3(dparams: Mapping[str, torch.Tensor], dspec: Eagle3Spec, tparams: Mapping[str, torch.Tensor],
                tspec: ModelSpec, rows: torch.Tensor, first_anchor: int, batch: int = 32) -> dict[str, Any]:
    """Float32 teacher-forced metrics on ``rows``: per step the agreement of the mapped draft argmax with the
    target's argmax, and the mean acceptance length 1 + leading agreements of the chain anchored at every
    a >= first_anchor (what a greedy verify keeps on rows that are the target's own greedy continuation)."""
    k = dspec.speculative_tokens
    agree, count = torch.zeros(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    acc, chains = 0.0, 0
    to_target = dspec.target_ids().to(rows.device)
    for b0 in range(0, rows.shape[0], batch):
        ids = rows[b0:b0 + batch]
        aux, labels = precompute(tparams, tspec, ids, dspec.aux_layer_ids)
        outs, _ = _losses(dict(dparams), dspec, tparams["model.embed_tokens.weight"], ids, aux, labels)
        hits = []
        for s, o in enumerate(outs):
            hit = to_target[o.argmax(-1)] == labels[:, s + 1:]
            agree[s] += float(hit.sum())
            count[s] += hit.numel()
            hits.append(hit[:, first_anchor - 1:ids.shape[1] - k])          # chain at a: row a-1 of step 1
        lead = torch.stack(hits, -1).int().cumprod(-1).sum(-1)
        acc += float((1 + lead).sum())
        chains += lead.numel()
    return {"top1_agreement_per_step": [round(float(x), 4) for x in agree / count], "chains": chains,
            "mean_accept_len_tf": round(acc / max(1, chains), 4), "width": k}


def eagle3_config(target: ModelSpec, dspec: Eagle3Spec) -> dict[str, Any]:
    """config.json as speculators' ``Eagle3SpeculatorConfig.save_pretrained`` writes it (no auto_map)."""
    s = dspec.layer
    tl = {"attention_bias": False, "attention_dropout": 0.0, "head_dim": s.head_dim, "hidden_act": "silu",
          "hidden_size": s.hidden_size, "initializer_range": 0.02, "intermediate_size": s.intermediate_size,
          "layer_types": ["full_attention"], "max_position_embeddings": target.max_position, "model_type": "qwen3",
          "num_attention_heads": s.num_heads, "num_hidden_layers": 1, "num_key_value_heads": s.num_kv_heads,
          "rms_norm_eps": s.rms_eps, "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
          "sliding_window": None, "tie_word_embeddings": target.tie_word_embeddings, "use_cache": True,
          "use_sliding_window": False, "vocab_size": target.vocab_size}
    return {"architectures": ["Eagle3Speculator"], "draft_vocab_size": dspec.draft_vocab_size,
            "eagle_aux_hidden_state_layer_ids": list(dspec.aux_layer_ids), "embed_requires_grad": False,
            "fc_norm": False, "norm_before_fc": False, "norm_before_residual": dspec.norm_before_residual,
            "norm_output": dspec.norm_output,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                                         "speculative_tokens": dspec.speculative_tokens,
                                                         "verifier_accept_k": 1}],
                                   "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": None}},
            "speculators_model_type": "eagle3", "target_hidden_size": None, "transformer_layer_config": tl}


def write_eagle3(out_dir: Path, stored: Mapping[str, torch.Tensor], dspec: Eagle3Spec,
                 target: ModelSpec) -> list[Path]:
    """config.json + model.safetensors (bf16 weights, d2t int64, t2d bool; no embed_tokens copy: the target's)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(eagle3_config(target, dspec), indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in stored.items()}
    if dspec.d2t is not None:
        t2d = torch.zeros(target.vocab_size, dtype=torch.bool)
        t2d[dspec.target_ids()] = True
        tensors.update(d2t=dspec.d2t.long().contiguous(), t2d=t2d)
    save_file(dict(sorted(tensors.items())), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return [out_dir / "config.json", out_dir / "model.safetensors"]
