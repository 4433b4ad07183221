"""The mimo2 fixture: a tiny trained MiMo-V2-Flash-layout target with its 3 MTP layers distilled from it.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.mimo2.fixture --out fixtures --device cpu   # a few min, 2 cores

Same corpus and tokenizer as the qwen3 / qwen38 fixtures (``<out>/tokenizer.json`` must exist). Target: next-token
CE on random windows of the training stream through the engine's own differentiable forward
(``kernels.families.mimo2.model.forward_train``), AdamW as the other fixtures. The routed experts train through an eager
per-expert loop (``_eager_experts``, the same math as ``ops.moe.routed_experts``); the router bias
``e_score_correction_bias`` follows DeepSeek-V3's auxiliary-loss-free balancing rule after every step,
b_e += gamma * sign(mean load - load_e) per sparse layer, so it is trained, nonzero, and acts on the choice only
(the weights stay the unbiased sigmoid scores). The expert load on held-out windows goes to the manifest.

MTP (``model.mtp.layers.{0,1,2}.*`` inside the target's safetensors, as MiMo ships them): the chained teacher-forced
head of ``kernels.families.mimo2.mtp.forward_train`` in the checkpoint's own (HF / vLLM) post-norm convention; layer k's
row at q is labelled with the target's argmax at q; loss sum_k 0.8^k CE_k / Z; rows: real training windows of P
tokens + the target's greedy continuation, and random training windows (as the qwen38 MTP head).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.kernels.families.mimo2 import model as kfam
from bloomery_gates.kernels.families.mimo2.mtp import forward_train as mtp_forward
from bloomery_gates.kernels.ops.norm import rms_norm
from bloomery_gates.spec import Mimo2MTPSpec

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.family_kit import check_readback, fit, fixture_main, load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.train import Reporter, Schedule, TrainConfig, _optimizer, descend, round_bf16, sample_windows
from .fixture_shape import Mimo2Shape, hf_config, init_mimo2, init_mtp

NAME = "mimo2-tiny"


@dataclass
class Mimo2Config:
    seed: int = 1234
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=800, batch=16, seq=128, warmup=50,
                                                                     log_every=100))
    bias_rate: float = 1e-3                 # the balancing rule's gamma
    pool_size: int = 64
    prefix: int = 64
    greedy_repeat: int = 8
    real_rows: int = 1024
    mtp: TrainConfig = field(default_factory=lambda: TrainConfig(steps=300, batch=16, seq=128, warmup=30,
                                                                  log_every=50))
    eval_windows: int = 32

    @classmethod
    def quick(cls) -> Mimo2Config:
        small = TrainConfig(steps=4, batch=4, seq=64, warmup=2, log_every=2)
        return cls(target=small, pool_size=4, prefix=32, greedy_repeat=1, real_rows=4, mtp=small, eval_windows=4)


def _eager_experts(x: torch.Tensor, routing, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Training-time routed experts (per-expert loop, index_add): out_t = sum_j w_tj expert_{ids_tj}(x_t)."""
    out = torch.zeros_like(x)
    f = down.shape[-1]
    for e in range(gate_up.shape[0]):
        rows, slots = torch.nonzero(routing.ids == e, as_tuple=True)
        if len(rows) == 0:
            continue
        gu = x[rows] @ gate_up[e].T
        y = (F.silu(gu[:, :f]) * gu[:, f:]) @ down[e].T
        out = out.index_add(0, rows, y * routing.weights[rows, slots, None].to(y.dtype))
    return out


class _Training:
    """Swaps the engine's gather-based experts for the eager loop and records each sparse layer's routing."""

    def __init__(self):
        self.loads: dict[int, torch.Tensor] = {}

    def __enter__(self):
        self.saved = kfam.routed_experts
        kfam.routed_experts = _eager_experts
        self.saved_route = kfam.route

        def route(spec, t, p, x):                    # spec: the layer's MoEShape (ffn.route)
            r = self.saved_route(spec, t, p, x)
            layer = int(p.split(".")[2])
            self.loads[layer] = torch.bincount(r.ids.reshape(-1), minlength=spec.num_experts)
            return r
        kfam.route = route
        return self

    def __exit__(self, *exc):
        kfam.routed_experts, kfam.route = self.saved, self.saved_route


def train_target(shape: Mimo2Shape, stream: torch.Tensor, cfg: Mimo2Config, rep: Reporter) -> tuple[dict, dict]:
    tc = replace(cfg.target, seed=cfg.seed + 1)
    params = {k: v.requires_grad_(k.split(".")[-1] != "e_score_correction_bias")
              for k, v in init_mimo2(shape, cfg.seed).items()}
    spec = shape.spec(params, mtp_layers=0)
    trainable = {k: v for k, v in params.items() if v.requires_grad}
    opt, sched = _optimizer(trainable, tc, torch.device("cpu")), Schedule(tc.steps, tc.lr, tc.warmup)
    gen, losses = torch.Generator().manual_seed(tc.seed), []
    rep.start("mimo2 target", tc.steps)
    t0 = time.perf_counter()
    with _Training() as tr:
        for step in range(tc.steps):
            for g in opt.param_groups:
                g["lr"] = sched(step)
            w = sample_windows(stream, tc.batch, tc.seq + 1, gen)
            logits, _ = kfam.forward_train(params, spec, w[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1))
            losses.append(descend(opt, loss, trainable, tc.clip))
            with torch.no_grad():                    # auxiliary-loss-free balancing of the choice bias
                for l, load in tr.loads.items():
                    b = params[f"model.layers.{l}.mlp.gate.e_score_correction_bias"]
                    b += cfg.bias_rate * torch.sign(load.float().mean() - load.float())
            rep.step(step + 1, tc.steps, {"loss": losses[-1]})
    rep.done()
    stats = {**asdict(tc), "bias_rate": cfg.bias_rate, "seconds": round(time.perf_counter() - t0, 1),
             "train_ce_last50": round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4),
             "objective": "next-token CE on random windows of the training stream; router bias by the "
                          "auxiliary-loss-free balancing rule (sign of load deviation, gamma = bias_rate)"}
    return round_bf16(params), stats


@torch.no_grad()
def held_out(tq: dict, shape: Mimo2Shape, held: torch.Tensor, seq: int, windows: int) -> dict:
    """CE / top-1 of the stored weights and each sparse layer's expert load (picks per expert) on held-out windows."""
    spec = shape.spec(tq, mtp_layers=0)
    n = min(windows, (held.numel() - 1) // seq)
    rows = held[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :])]
    with _Training() as tr:
        logits, _ = kfam.forward_train(tq, spec, rows[:, :-1])
    ce = float(F.cross_entropy(logits.reshape(-1, shape.vocab_size), rows[:, 1:].reshape(-1)))
    loads = {f"layer {l}": v.tolist() for l, v in sorted(tr.loads.items())}
    spread = {k: {"min_share": round(min(v) / sum(v), 4), "max_share": round(max(v) / sum(v), 4),
                  "experts_used": sum(1 for x in v if x)} for k, v in loads.items()}
    return {"ce": round(ce, 4), "top1": round(float((logits.argmax(-1) == rows[:, 1:]).float().mean()), 4),
            "tokens": n * seq, "expert_load": loads, "expert_load_spread": spread}


def mtp_spec(shape: Mimo2Shape, tspec, tensors: dict) -> Mimo2MTPSpec:
    return Mimo2MTPSpec("mimo2-mtp", tspec.source, "hf", tspec.mimo.swa, shape.hidden_size, shape.intermediate_size,
                        shape.rms_eps, shape.value_scale, shape.mtp_layers, shape.vocab_size, tensors)


def _labels_and_hidden(tq: dict, tspec, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits, hidden = kfam.forward_train(tq, tspec, ids)
    return logits.argmax(-1), rms_norm(hidden[-1], tq["model.norm.weight"], tspec.layer.rms_eps)


def mtp_losses(mp: dict, tq: dict, shape: Mimo2Shape, tspec, ids: torch.Tensor) -> tuple[list, list]:
    """Per layer k: (logits [N, R_k, V], labels [N, R_k] = the target's argmax at q = k+1..)."""
    lab, final = _labels_and_hidden(tq, tspec, ids)
    full = {**mp, "model.embed_tokens.weight": tq["model.embed_tokens.weight"], "lm_head.weight": tq["lm_head.weight"]}
    outs = mtp_forward(full, mtp_spec(shape, tspec, mp), tspec, final, ids)
    return outs, [lab[:, k + 1:k + 1 + o.shape[1]] for k, o in enumerate(outs)]


def train_mtp(mp: dict, tq: dict, shape: Mimo2Shape, tspec, rows: torch.Tensor, cfg: TrainConfig, rep: Reporter
              ) -> dict:
    for p in mp.values():
        p.requires_grad_(True)
    wk = [0.8 ** k / sum(0.8 ** j for j in range(shape.mtp_layers)) for k in range(shape.mtp_layers)]

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        ids = rows[torch.randint(0, rows.shape[0], (cfg.batch,), generator=gen)]
        outs, labs = mtp_losses(mp, tq, shape, tspec, ids)
        return sum(w * F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
                   for w, o, y in zip(wk, outs, labs, strict=True))

    with _Training():
        seconds, last = fit(mp, cfg, "mimo2 mtp", rep, loss_of)
    for p in mp.values():
        p.requires_grad_(False)
    return {**asdict(cfg), "seconds": seconds, "train_loss_last50": last}


@torch.no_grad()
def eval_mtp(mp: dict, tq: dict, shape: Mimo2Shape, tspec, rows: torch.Tensor, first: int) -> dict:
    """Per layer top-1 agreement with the target's argmax, and the teacher-forced acceptance of chains anchored at
    every a >= first (1 + the leading run of agreeing layers)."""
    with _Training():
        outs, labs = mtp_losses(mp, tq, shape, tspec, rows)
    k = len(outs)
    hits = [(o.argmax(-1) == y) for o, y in zip(outs, labs, strict=True)]     # layer j row i: position i+j+1
    t = rows.shape[1]
    anchors = range(first, t - k)                                             # chain at anchor a: layer j at a+j
    lead = torch.stack([torch.stack([hits[j][:, a - 1] for j in range(k)], -1) for a in anchors], 1)
    acc = float((1 + lead.int().cumprod(-1).sum(-1)).float().mean())
    return {"top1_agreement_per_layer": [round(float(h.float().mean()), 4) for h in hits],
            "mean_accept_len_tf": round(acc, 4), "chains": lead.shape[0] * lead.shape[1], "width": k}


def greedy_rows(tq: dict, tspec, stream: torch.Tensor, n: int, prefix: int, seq: int, gen) -> torch.Tensor:
    x = sample_windows(stream, n, prefix, gen)
    with _Training(), torch.no_grad():
        while x.shape[1] < seq:
            x = torch.cat([x, kfam.forward_train(tq, tspec, x)[0][:, -1].argmax(-1, keepdim=True)], 1)
    return x


def build_mimo2(out_dir: Path, quick: bool = False, progress=None, config: Mimo2Config | None = None):

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (Mimo2Config.quick() if quick else Mimo2Config())
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.target.log_every)
    shape = Mimo2Shape(vocab_size=tok.get_vocab_size())
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        t_bf16, tstats = train_target(shape, train, cfg, rep)
        tq = {k: v.float() for k, v in t_bf16.items()}
        tspec = shape.spec(tq, mtp_layers=0)
        tstats["held_out"] = held_out(tq, shape, held, cfg.target.seq, cfg.eval_windows)
        rep.log(f"mimo2 target: {tstats['seconds']} s, held-out {tstats['held_out']}")
        seq = cfg.mtp.seq
        pool = greedy_rows(tq, tspec, train, cfg.pool_size, cfg.prefix, seq,
                           torch.Generator().manual_seed(cfg.seed + 3))
        held_pool = greedy_rows(tq, tspec, held, 16, cfg.prefix, seq, torch.Generator().manual_seed(cfg.seed + 6))
        starts = torch.randint(0, train.numel() - seq, (cfg.real_rows,), generator=torch.Generator().manual_seed(
            cfg.seed + 7))
        rows = torch.cat([pool.repeat(cfg.greedy_repeat, 1), train[starts[:, None] + torch.arange(seq)]])
        mp = init_mtp(shape, cfg.seed + 8)
        mstats = train_mtp(mp, tq, shape, tspec, rows, replace(cfg.mtp, seed=cfg.seed + 9), rep)
        m_bf16 = round_bf16(mp)
        mq = {k: v.float() for k, v in m_bf16.items()}
        mstats["held_out_greedy"] = eval_mtp(mq, tq, shape, tspec, held_pool, cfg.prefix)
        rep.log(f"mimo2 mtp: {mstats}")
        options = option_report(tspec, held, rep)

    work = fresh_work(out_dir, "mimo2")
    d = work / NAME
    d.mkdir()
    eot = tok.token_to_id(tokenizer_train.EOT)
    (d / "config.json").write_text(json.dumps(hf_config(shape, eot), indent=2, sort_keys=True) + "\n")
    write_safetensors(d / "model.safetensors", {**t_bf16, **m_bf16})
    (d / "tokenizer.json").write_text(tjson)
    files = [d / "config.json", d / "model.safetensors", d / "tokenizer.json"]
    for f in files:
        os.chmod(f, 0o644)
    _readback(d, {**t_bf16, **m_bf16})
    made_by = {"command": " ".join(["python -m bloomery_cli.families.mimo2.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "mimo2" else f"build_mimo2({out_dir}, quick={quick})",
               "builder": "bloomery_cli.families.mimo2.fixture", "quick": quick, "seed": cfg.seed,
               "versions": _versions(),
               **_device_info(torch.device("cpu")), "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{NAME}/{f.name}" for f in files],
             "architecture": "MiMoV2FlashForCausalLM (model_type mimo_v2_flash; MiMo's own keys and transformers' "
                             "spelling both in config.json)", "shape": {k: v for k, v in asdict(shape).items()
                                                                        if k != "extra"},
             "parameters": sum(v.numel() for v in t_bf16.values()), "training": tstats,
             "mtp": {"tensors": "model.mtp.layers.{0,1,2}.* in mimo2-tiny/model.safetensors", "layers": 3,
                     "hidden": "post (HF MtpModel / vLLM)", "parameters": sum(v.numel() for v in m_bf16.values()),
                     "rows": f"{cfg.pool_size} greedy rows (P {cfg.prefix} + the target's greedy continuation to "
                             f"{seq}) x {cfg.greedy_repeat} and {cfg.real_rows} random {seq}-token windows",
                     **mstats},
             "options": options, "made_by": made_by}
    man = install_model(work, out_dir, NAME, files, entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    rep.log(f"{NAME} written to {out_dir} (fixtures total {man.total_bytes} bytes)")
    return man


def option_report(tspec, held: torch.Tensor, rep: Reporter, window: int = 64) -> dict:
    """Each configured option's effect on the trained target's float64 logits over a held-out window
    (``option_effects``): logged, and an option whose removal changes nothing is logged as such (it hides a path)."""
    from bloomery_gates.reference.families.mimo2.model import forward

    from ...fixturegen.option_effects import MIMO2_OPTIONS, inert

    effects = inert(tspec, held[:window].tolist(), MIMO2_OPTIONS, forward)
    for e in effects:
        rep.log(("INERT " if e.inert else "") + e.line())
    return {e.option: {"value": e.value, "removed": e.removed, "max_rel_change": e.effect, "inert": e.inert}
            for e in effects}


def _readback(d: Path, want: dict) -> None:
    from ...loading import load_mimo2_mtp, load_target

    spec = load_target(d)
    mtp = load_mimo2_mtp(d, spec)
    check_readback(d, want, lambda name: (mtp.tensors if name.startswith("model.mtp.") else spec.tensors)[name])


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.mimo2.fixture", __doc__, build_mimo2, argv)


if __name__ == "__main__":
    raise SystemExit(main())
