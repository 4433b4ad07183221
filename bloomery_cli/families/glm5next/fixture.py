"""The glm5next fixture: a tiny trained GLM-5.3-layout target (HF ``glm5_next`` text model) with its NextN layer.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.glm5next.fixture --out fixtures   # ~8-15 min, 1 busy core

Same corpus and tokenizer as the other fixtures (``<out>/tokenizer.json`` must exist). Shape: docs/FAMILIES_MOE.md
4.3's tiny config at hidden 32 (section 9.2 says 64): layers [KDA, MLA full, MLA shared, KDA], mlp [dense,
sparse x3], 4 mHC streams, k-pool 2 and top-4 tokens, 8 experts top-2 in 2 groups of which 1 is kept, routed scale
2.5, 1 shared expert, at the tokenizer's vocabulary; plus one NextN block ``model.layers.4.*``
(num_nextn_predict_layers 1).

Target: the indexers seeded random (``random_indexers``: no gradient reaches them), then next-token CE on random
windows of the training stream through transformers' own ``Glm5NextTextModel``
(float32, eager; its last hidden state is rms(mean of the streams, model.norm)), the head tied to the embedding
(the fixtures' store, then 32 MiB with about 1 MB free: hidden 32, tied, keeps the folder near 0.6 MB), AdamW as the
other fixtures; the router bias ``e_score_correction_bias`` follows DeepSeek-V3's auxiliary-loss-free balancing rule
after every step (b_e += gamma sign(mean load - load_e)), so it is trained and acts on the choice only.

NextN (frozen trunk): the block of ``kernels.families.glm5next.mtp.block`` (the engine's own math, run without a
store: differentiable), warm-started from the trunk's layer 1 (its MLA, indexer, MoE and norms), fed the trunk's
post-norm rows; its row r reads (token r+1, h_r) and is labelled with the target's argmax at r+1 (its prediction of
token r+2); rows: the target's greedy continuations of training windows and random training windows.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bloomery_gates.kernels.families.glm5next.mtp import N, block

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.family_kit import check_readback, fit, fixture_main, load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.train import Reporter, TrainConfig, round_bf16, sample_windows

NAME = "glm5next-tiny"
H, L = 32, 4


def hf_config(vocab: int, eot: int) -> dict[str, Any]:
    """config.json: the HF glm5_next text config's keys (docs/FAMILIES_MOE.md 4.3, tiny)."""
    return {
        "model_type": "glm5_next", "architectures": ["Glm5NextTextModel"], "vocab_size": vocab, "hidden_size": H,
        "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 64,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": True,
        "layer_types": ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "q_lora_rank": 24, "kv_lora_rank": 16,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "qk_rope_head_dim": 0, "index_topk": 4, "index_head_dim": 16,
        "index_n_heads": 8, "index_kpool": 2, "index_kpool_always_select_tail": True,
        "indexer_types": ["full", "full", "shared", "full"], "linear_head_dim": 16, "linear_num_heads": 4,
        "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 32, "routed_scaling_factor": 2.5, "n_group": 2,
        "topk_group": 1, "norm_topk_prob": True, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "pad_token_id": 0,
        "eos_token_id": eot, "bos_token_id": eot}


@dataclass
class Glm5NextConfig:
    seed: int = 1234
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=900, batch=8, seq=96, warmup=50,
                                                                     log_every=50))
    bias_rate: float = 1e-3
    pool_size: int = 32
    prefix: int = 32
    seq: int = 96
    real_rows: int = 256
    nextn: TrainConfig = field(default_factory=lambda: TrainConfig(steps=200, batch=8, seq=96, warmup=20,
                                                                    log_every=50))
    eval_windows: int = 16

    @classmethod
    def quick(cls) -> Glm5NextConfig:
        small = TrainConfig(steps=3, batch=2, seq=32, warmup=1, log_every=1)
        return cls(target=small, pool_size=2, prefix=16, seq=32, real_rows=2, nextn=small, eval_windows=2)


def build_hf(cfg: dict[str, Any]) -> torch.nn.Module:
    from ...oracle.hf import _transformers

    tf = _transformers()
    c = tf.Glm5NextTextConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    c._attn_implementation, c._experts_implementation = "eager", "eager"
    return tf.Glm5NextTextModel(c).float()


class _Loads:
    """Forward hooks on every sparse layer's router: the picks per expert of the last forward."""

    def __init__(self, model: torch.nn.Module, experts: int):
        self.loads: dict[int, torch.Tensor] = {}
        self.handles = []
        for i, layer in enumerate(model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                self.handles.append(gate.register_forward_hook(
                    lambda m, a, out, i=i: self.loads.__setitem__(i, torch.bincount(out[2].reshape(-1),
                                                                                    minlength=experts))))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def random_indexers(model: torch.nn.Module, seed: int) -> None:
    """Seeded random weights for every indexer (no gradient reaches them: the choice is a top-k), so the trunk trains
    around a generic choice: HF's init leaves the scores relu-zero for most pools, and a choice among exact ties is
    the tie rule's, not the model's (ours takes the lower pool, torch.topk any)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.layers:
            idx = getattr(layer.self_attn, "indexer", None)
            for name, p in ([] if idx is None else idx.named_parameters()):
                r = torch.randn(p.shape, generator=g)
                if name.startswith("k_norm"):
                    p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * r)
                elif name.endswith("ape"):
                    p.copy_(0.3 * r)
                else:
                    p.copy_(r * p.shape[-1] ** -0.5)


def train_target(cfg_json: dict, stream: torch.Tensor, cfg: Glm5NextConfig, rep: Reporter
                 ) -> tuple[dict, dict, torch.nn.Module, torch.Tensor]:
    tc = replace(cfg.target, seed=cfg.seed + 1)
    torch.manual_seed(cfg.seed)
    model = build_hf(cfg_json).train()
    random_indexers(model, cfg.seed + 2)
    v = cfg_json["vocab_size"]
    head = model.embed_tokens.weight                                     # tied (tie_word_embeddings)
    params = {"model." + n: p for n, p in model.named_parameters()}
    loads = _Loads(model, cfg_json["n_routed_experts"])

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        w = sample_windows(stream, tc.batch, tc.seq + 1, gen)
        hidden = model(input_ids=w[:, :-1], use_cache=False).last_hidden_state
        return F.cross_entropy((hidden @ head.T).reshape(-1, v), w[:, 1:].reshape(-1))

    @torch.no_grad()
    def balance() -> None:                     # the auxiliary-loss-free router-bias rule, after each update
        for i, load in loads.loads.items():
            b = model.layers[i].mlp.gate.e_score_correction_bias
            b += cfg.bias_rate * torch.sign(load.float().mean() - load.float())

    seconds, last = fit(params, tc, "glm5next target", rep, loss_of, balance)
    loads.close()
    model.eval()
    state = {"model." + n: t for n, t in model.state_dict().items()}
    stats = {**asdict(tc), "bias_rate": cfg.bias_rate, "seconds": seconds, "train_ce_last50": last,
             "objective": "next-token CE on random windows through transformers' Glm5NextTextModel (float32, eager); "
                          "router bias by the auxiliary-loss-free balancing rule (gamma = bias_rate)"}
    return round_bf16(state), stats, model, head


def load_bf16(model: torch.nn.Module, tq: dict) -> torch.Tensor:
    """Put the stored (bf16-rounded) weights back into the model; return the head (the tied embedding)."""
    model.load_state_dict({n[len("model."):]: t.float() for n, t in tq.items() if n.startswith("model.")})
    return tq["model.embed_tokens.weight"].float()


@torch.no_grad()
def final_and_argmax(model: torch.nn.Module, head: torch.Tensor, ids: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    final = model(input_ids=ids, use_cache=False).last_hidden_state
    return final, (final @ head.T).argmax(-1)


@torch.no_grad()
def held_out(model, head, held: torch.Tensor, seq: int, windows: int, experts: int) -> dict:
    n = min(windows, (held.numel() - 1) // seq)
    rows = held[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :])]
    loads = _Loads(model, experts)
    final = model(input_ids=rows[:, :-1], use_cache=False).last_hidden_state
    loads.close()
    logits = final @ head.T
    ce = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))
    spread = {f"layer {i}": v.tolist() for i, v in sorted(loads.loads.items())}
    return {"ce": round(ce, 4), "top1": round(float((logits.argmax(-1) == rows[:, 1:]).float().mean()), 4),
            "tokens": n * seq, "expert_load": spread,
            "experts_used": {k: sum(1 for x in v if x) for k, v in spread.items()}}


def greedy_rows(model, head, stream: torch.Tensor, n: int, prefix: int, seq: int, gen) -> torch.Tensor:
    x = sample_windows(stream, n, prefix, gen)
    while x.shape[1] < seq:
        x = torch.cat([x, final_and_argmax(model, head, x)[1][:, -1:]], 1)
    return x


def init_nextn(tq: dict, seed: int) -> dict[str, torch.Tensor]:
    """The NextN block's tensors (kernel names ``nextn.*``): layer 1's MLA, indexer, MoE and norms as a warm start,
    enorm / hnorm / shared_head.norm ones and model.norm's gain, eh_proj random."""
    g = torch.Generator().manual_seed(seed)
    src = "model.layers.1."
    out = {N + n[len(src):]: t.float().clone() for n, t in tq.items()
           if n.startswith(src) and "_hc." not in n}
    out |= {N + "enorm.weight": torch.ones(H), N + "hnorm.weight": torch.ones(H),
            N + "eh_proj.weight": torch.randn(H, 2 * H, generator=g) * (2 * H) ** -0.5,
            N + "shared_head.norm.weight": tq["model.norm.weight"].float().clone()}
    return out


def nextn_logits(mp: dict, spec, head: torch.Tensor, emb: torch.Tensor, final: torch.Tensor,
                 ids: torch.Tensor) -> torch.Tensor:
    """Teacher-forced NextN logits [N, T-1, V]: row r reads (E(ids[r+1]), final[r])."""
    e = F.embedding(ids[:, 1:], emb)
    out = [block(mp, spec, e[i], final[i, :-1], None, spec.dsa.select_tail)[1] for i in range(ids.shape[0])]
    return torch.stack(out) @ head.T


def train_nextn(mp: dict, spec, model, head, emb, rows: torch.Tensor, cfg: TrainConfig, rep: Reporter) -> dict:
    train = {k: v.requires_grad_(k.split(".")[-1] != "e_score_correction_bias") for k, v in mp.items()}
    trainable = {k: v for k, v in train.items() if v.requires_grad}

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        ids = rows[torch.randint(0, rows.shape[0], (cfg.batch,), generator=gen)]
        final, lab = final_and_argmax(model, head, ids)
        logits = nextn_logits(mp, spec, head, emb, final, ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1))

    seconds, last = fit(trainable, cfg, "glm5next nextn", rep, loss_of)
    for p in mp.values():
        p.requires_grad_(False)
    return {**asdict(cfg), "seconds": seconds, "train_loss_last50": last}


@torch.no_grad()
def eval_nextn(mp: dict, spec, model, head, emb, rows: torch.Tensor) -> dict:
    final, lab = final_and_argmax(model, head, rows)
    hit = nextn_logits(mp, spec, head, emb, final, rows).argmax(-1) == lab[:, 1:]
    return {"top1_agreement": round(float(hit.float().mean()), 4), "rows": int(hit.numel())}


def _spec_for(cfg_json: dict, tensors: dict):
    """A Glm5NextSpec of the numbers in ``cfg_json`` over in-memory tensors (the reader's own parse)."""
    from bloomery_cli.formats.config import Cfg
    from bloomery_gates.spec import Glm5NextSpec

    from .reader import read_shapes

    f = read_shapes(Cfg(cfg_json, Path("<glm5next fixture>"), ""))
    return Glm5NextSpec(family="glm5next", source=Path("."), source_format="hf", vocab_size=cfg_json["vocab_size"],
                        tie_word_embeddings=False, max_position=2048, tensors=tensors, **f)


def build_glm5next(out_dir: Path, quick: bool = False, progress=None, config: Glm5NextConfig | None = None):

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (Glm5NextConfig.quick() if quick else Glm5NextConfig())
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.target.log_every)
    eot = tok.token_to_id(tokenizer_train.EOT)
    cfg_json = hf_config(tok.get_vocab_size(), eot)
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        t_bf16, tstats, model, _ = train_target(cfg_json, train, cfg, rep)
        head = load_bf16(model, t_bf16)
        tstats["held_out"] = held_out(model, head, held, cfg.target.seq, cfg.eval_windows,
                                      cfg_json["n_routed_experts"])
        rep.log(f"glm5next target: {tstats['seconds']} s, held-out {tstats['held_out']}")
        for p in model.parameters():
            p.requires_grad_(False)
        pool = greedy_rows(model, head, train, cfg.pool_size, cfg.prefix, cfg.seq,
                           torch.Generator().manual_seed(cfg.seed + 3))
        held_pool = greedy_rows(model, head, held, 8, cfg.prefix, cfg.seq, torch.Generator().manual_seed(cfg.seed + 6))
        starts = torch.randint(0, train.numel() - cfg.seq, (cfg.real_rows,),
                               generator=torch.Generator().manual_seed(cfg.seed + 7))
        rows = torch.cat([pool.repeat(4, 1), train[starts[:, None] + torch.arange(cfg.seq)]])
        spec = _spec_for(cfg_json, {})
        emb = t_bf16["model.embed_tokens.weight"].float()
        mp = init_nextn(t_bf16, cfg.seed + 8)
        nstats = train_nextn(mp, spec, model, head, emb, rows, replace(cfg.nextn, seed=cfg.seed + 9), rep)
        n_bf16 = round_bf16(mp)
        nq = {k: v.float() for k, v in n_bf16.items()}
        nstats["held_out_greedy"] = eval_nextn(nq, spec, model, head, emb, held_pool)
        rep.log(f"glm5next nextn: {nstats}")
    nextn = {f"model.layers.{L}." + k[len(N):]: v for k, v in n_bf16.items()}

    work = fresh_work(out_dir, "glm5next")
    d = work / NAME
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    write_safetensors(d / "model.safetensors", {**t_bf16, **nextn})
    (d / "tokenizer.json").write_text(tjson)
    files = [d / "config.json", d / "model.safetensors", d / "tokenizer.json"]
    for f in files:
        os.chmod(f, 0o644)
    _readback(d, {**t_bf16, **nextn})
    made_by = {"command": " ".join(["python -m bloomery_cli.families.glm5next.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "fixture" else f"build_glm5next({out_dir}, quick={quick})",
               "builder": "bloomery_cli.families.glm5next.fixture", "quick": quick, "seed": cfg.seed,
               "versions": _versions(), **_device_info(torch.device("cpu")),
               "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{NAME}/{f.name}" for f in files],
             "architecture": "Glm5NextTextModel (model_type glm5_next, the text model; NextN block model.layers.4.*)",
             "shape": {k: v for k, v in cfg_json.items() if k not in ("architectures",)},
             "parameters": sum(v.numel() for v in t_bf16.values()), "training": tstats,
             "nextn": {"tensors": f"model.layers.{L}.* in {NAME}/model.safetensors", "layers": 1,
                       "hidden": "post: rms(mean of the streams, model.norm)",
                       "parameters": sum(v.numel() for v in n_bf16.values()),
                       "rows": f"{cfg.pool_size} greedy rows (P {cfg.prefix} + the target's greedy continuation to "
                               f"{cfg.seq}) x 4 and {cfg.real_rows} random {cfg.seq}-token windows", **nstats},
             "made_by": made_by}
    man = install_model(work, out_dir, NAME, files, entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    rep.log(f"{NAME} written to {out_dir} (fixtures total {man.total_bytes} bytes)")
    return man


def _readback(d: Path, want: dict) -> None:
    from ...loading import load_target
    from .reader_mtp import glm5next_nextn_from_file

    spec = load_target(d)
    glm5next_nextn_from_file(d, spec)
    check_readback(d, want, lambda name: spec.tensors[name])


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.glm5next.fixture", __doc__, build_glm5next, argv)


if __name__ == "__main__":
    raise SystemExit(main())
