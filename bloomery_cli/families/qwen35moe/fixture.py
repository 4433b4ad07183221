"""The qwen35moe fixtures: a tiny trained Qwen3.5-MoE-style target and its MTP head (``qwen35moe-tiny``).

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen35moe.fixture --out fixtures --device cpu

The qwen38 fixture's recipe (``families.qwen38.fixture``, ``fixture_drafts``) with every FFN a mixture of experts:
same corpus and tokenizer, the same hybrid (3 Gated DeltaNet layers, then gated attention), E = 8 experts of width 64,
top-2, softmax router renormalised, one sigmoid-gated shared expert of width 128. The target trains on next-token CE
through the engine's differentiable forward (``kernels.families.qwen38.model.forward_train``: every expert on every
row, weighted by the router, ``ops.moe.routed_experts_dense``) plus a load-balancing loss (Switch / Qwen-MoE form,
coefficient ``aux``): E * sum_e f_e P_e per layer, f_e the share of (row, slot) picks on e and P_e the mean router
probability, so that the experts really route. The MTP head (``mtp.*``, one gated full-attention layer with the same
MoE FFN) is distilled from the frozen, bf16-rounded target exactly as the qwen38 head (``fixture_drafts.train_mtp``:
chained training-time test, 3 steps). The manifest records the expert load spread per layer (share of picks per expert
on held-out windows, min / max share and the normalised entropy) for the target and the MTP layer.

Writes ``qwen35moe-tiny/`` (config.json in ``Qwen3_5MoeForCausalLM``'s text-config layout, model_type
"qwen3_5_moe_text", mtp_num_hidden_layers 1; model.safetensors with fused experts as HF saves them; tokenizer files),
and ``qwen35moe-tiny.gguf`` (arch qwen35moe, ``write_gguf``), reads both back through the harness's readers, and adds
their entries to MANIFEST.json (others untouched). ``--gguf-only`` re-exports the GGUF from the trained HF files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bloomery_gates.kernels.families.ffn import record_routing
from bloomery_gates.kernels.families.qwen38.model import forward_train
from bloomery_gates.spec import HybridShape, LayerShape, MoEShape, Qwen35MoeSpec

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.family_kit import load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest, verified
from ...fixturegen.train import (
    Reporter,
    Schedule,
    TrainConfig,
    _autocast,
    _optimizer,
    descend,
    greedy_pool,
    round_bf16,
    sample_windows,
)
from ...fixturegen.train_dflash2 import target_shape_of
from ..qwen38.fixture import Qwen38Shape, hf_config, init_qwen38, write_qwen38_gguf, write_qwen38_target
from ..qwen38.fixture_drafts import eval_mtp, train_mtp

TARGET, GGUF = "qwen35moe-tiny", "qwen35moe-tiny.gguf"


@dataclass(frozen=True)
class Qwen35MoeShape(Qwen38Shape):
    """Qwen38Shape plus the MoE (``intermediate_size`` is the expert width here)."""

    intermediate_size: int = 64
    num_experts: int = 8
    top_k: int = 2
    shared_ff: int = 128

    @property
    def moe(self) -> MoEShape:
        return MoEShape(self.num_experts, self.top_k, self.intermediate_size, self.shared_ff, True, "softmax")

    def spec(self, params, source: Path = Path("fixtures/qwen35moe-tiny"), mtp_layers: int = 0) -> Qwen35MoeSpec:
        layer = LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size, self.rms_eps, self.rope_theta)
        hy = HybridShape(self.layer_types, self.partial_rotary_factor, int(self.head_dim * self.partial_rotary_factor),
                         self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                         self.linear_value_head_dim, self.linear_conv_kernel_dim, mtp_layers)
        return Qwen35MoeSpec(family="qwen35moe", source=source, source_format="hf", layer=layer,
                             num_layers=len(self.layer_types), vocab_size=self.vocab_size, tie_word_embeddings=True,
                             max_position=self.max_position, tensors=params, hybrid=hy, moe=self.moe)


@dataclass
class Qwen35MoeConfig:
    seed: int = 1234
    target_steps: int = 600
    batch: int = 16
    seq: int = 128
    lr: float = 3e-3
    aux: float = 0.01
    pool_size: int = 64
    pool_prefix: int = 64
    greedy_repeat: int = 8
    real_rows: int = 1024
    mtp: TrainConfig = field(default_factory=lambda: TrainConfig(steps=300, batch=16, seq=128, warmup=30, log_every=50))
    mtp_chain: int = 3
    eval_rows: int = 16
    eval_windows: int = 32
    quick: bool = False

    @classmethod
    def for_device(cls, device: str, quick: bool) -> Qwen35MoeConfig:
        if quick:
            return cls(target_steps=4, batch=4, seq=64, pool_size=4, pool_prefix=32, real_rows=8, eval_rows=4,
                       eval_windows=4, mtp=TrainConfig(steps=4, batch=4, seq=64, warmup=2, log_every=2), quick=True)
        return cls()


def moe_init(gen: torch.Generator, prefix: str, shape: Qwen35MoeShape, std: float = 0.02) -> dict[str, torch.Tensor]:
    """One layer's MoE FFN (HF names under ``prefix`` + "mlp."): normal(0, std) matrices, router included."""
    H, E, ff, sff, m = shape.hidden_size, shape.num_experts, shape.intermediate_size, shape.shared_ff, prefix + "mlp."

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen) * std

    return {m + "gate.weight": r(E, H), m + "experts.gate_up_proj": r(E, 2 * ff, H),
            m + "experts.down_proj": r(E, H, ff),
            m + "shared_expert.gate_proj.weight": r(sff, H), m + "shared_expert.up_proj.weight": r(sff, H),
            m + "shared_expert.down_proj.weight": r(H, sff), m + "shared_expert_gate.weight": r(1, H)}


def init_target(shape: Qwen35MoeShape, seed: int) -> dict[str, torch.Tensor]:
    """qwen38's initialisation with each dense MLP replaced by the MoE."""
    p = {k: v for k, v in init_qwen38(shape, seed).items() if ".mlp." not in k}
    gen = torch.Generator().manual_seed(seed + 50)
    for i in range(len(shape.layer_types)):
        p.update(moe_init(gen, f"model.layers.{i}.", shape))
    return p


def init_mtp(shape: Qwen35MoeShape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """mtp.*: fc normal(0, std), zero-centred norms 0, one full-attention layer with the MoE FFN."""
    one = init_target(replace(shape, layer_types=("full_attention",)), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    H = shape.hidden_size
    p = {k.replace("model.layers.0.", "mtp.layers.0.", 1): v for k, v in one.items() if k.startswith("model.layers.0.")}
    p.update({"mtp.fc.weight": torch.randn(H, 2 * H, generator=gen) * std, "mtp.norm.weight": torch.zeros(H),
              "mtp.pre_fc_norm_embedding.weight": torch.zeros(H), "mtp.pre_fc_norm_hidden.weight": torch.zeros(H)})
    return p


def balance_loss(rec: list, num_experts: int, top_k: int) -> torch.Tensor:
    """mean over the recorded layers of E * sum_e f_e P_e (f_e: share of picks, P_e: mean softmax probability)."""
    total = 0.0
    for _, r in rec:
        f = torch.bincount(r.ids.reshape(-1), minlength=num_experts).float() / r.ids.numel()
        total = total + num_experts * (f * torch.softmax(r.choice, -1).mean(0)).sum()
    return total / max(1, len(rec))


def train_target(tokens: torch.Tensor, shape: Qwen35MoeShape, cfg: Qwen35MoeConfig, dev: torch.device,
                 rep: Reporter) -> tuple[dict[str, torch.Tensor], dict]:
    tcfg = TrainConfig(steps=cfg.target_steps, batch=cfg.batch, seq=cfg.seq, lr=cfg.lr,
                       warmup=min(100, max(1, cfg.target_steps // 10)), seed=cfg.seed)
    params = {k: v.to(dev).requires_grad_(True) for k, v in init_target(shape, cfg.seed).items()}
    spec = shape.spec(params)
    opt, sched = _optimizer(params, tcfg, dev), Schedule(tcfg.steps, tcfg.lr, tcfg.warmup)
    gen, stream = torch.Generator().manual_seed(cfg.seed + 1), tokens.to(dev)
    ces, auxes = [], []
    rep.start("qwen35moe target", tcfg.steps)
    t0 = time.perf_counter()
    for step in range(tcfg.steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        w = sample_windows(stream, cfg.batch, cfg.seq + 1, gen)
        with _autocast(dev), record_routing() as rec:
            logits, _ = forward_train(params, spec, w[:, :-1])
        ce = F.cross_entropy(logits.float().reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1))
        aux = balance_loss(rec, shape.num_experts, shape.top_k)
        descend(opt, ce + cfg.aux * aux, params, tcfg.clip)
        ces.append(float(ce.detach()))
        auxes.append(float(aux.detach()))
        rep.step(step + 1, tcfg.steps, {"ce": ces[-1], "aux": auxes[-1]})
    rep.done()
    stats = {"steps": tcfg.steps, "batch": cfg.batch, "seq": cfg.seq, "lr": cfg.lr, "aux_coefficient": cfg.aux,
             "seed": cfg.seed, "device": str(dev), "train_seconds": round(time.perf_counter() - t0, 1),
             "train_ce_last50": sum(ces[-50:]) / max(1, len(ces[-50:])),
             "balance_loss_last50": sum(auxes[-50:]) / max(1, len(auxes[-50:]))}
    return round_bf16(params), stats


@torch.no_grad()
def evaluate(params: dict, shape: Qwen35MoeShape, stream: torch.Tensor, seq: int, windows: int,
             mparams: dict | None = None) -> dict:
    """Held-out CE / top-1 over consecutive windows, and the expert load spread per layer (target layers, and the MTP
    layer's step-1 rows when ``mparams`` is given): share of (row, slot) picks per expert, min / max share, and
    the normalised entropy -sum s log s / log E (1 = perfectly even)."""
    from bloomery_gates.kernels.drafts.mtp import forward_train as mtp_forward
    from bloomery_gates.kernels.families.qwen38.model import norm_gain
    from bloomery_gates.kernels.ops.norm import rms_norm

    spec = shape.spec(params)
    n = min(windows, (stream.numel() - 1) // seq)
    rows = stream[: n * seq + 1]
    x = torch.stack([rows[i * seq:(i + 1) * seq + 1] for i in range(n)])
    with record_routing() as rec:
        logits, hidden = forward_train(params, spec, x[:, :-1])
        if mparams is not None:
            final = rms_norm(hidden[-1], norm_gain(params["model.norm.weight"]), shape.rms_eps)
            mtp_forward({**mparams, "model.embed_tokens.weight": params["model.embed_tokens.weight"]}, spec, final,
                        x[:, :-1], 1)
    ce = float(F.cross_entropy(logits.float().reshape(-1, shape.vocab_size), x[:, 1:].reshape(-1)))
    load = {}
    for p, r in rec:
        counts = torch.bincount(r.ids.reshape(-1), minlength=shape.num_experts).double()
        share = counts / counts.sum()
        ent = float(-(share[share > 0] * share[share > 0].log()).sum() / math.log(shape.num_experts))
        load[p.rstrip(".")] = {"share": [round(float(s), 4) for s in share], "min_share": round(float(share.min()), 4),
                               "max_share": round(float(share.max()), 4), "entropy_norm": round(ent, 4)}
    return {"ce": ce, "ppl": math.exp(ce), "top1": float((logits.argmax(-1) == x[:, 1:]).float().mean()),
            "tokens": n * seq, "expert_load": load}


def moe_config(shape: Qwen35MoeShape, eot: int) -> dict:
    """config.json as transformers writes ``Qwen3_5MoeTextConfig`` (qwen38's keys, the MoE keys, no dense width)."""
    cfg = hf_config(shape, {"mtp_num_hidden_layers": 1}, eot)
    cfg.pop("intermediate_size")
    cfg.update({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
                "num_experts": shape.num_experts, "num_experts_per_tok": shape.top_k,
                "moe_intermediate_size": shape.intermediate_size, "shared_expert_intermediate_size": shape.shared_ff,
                "output_router_logits": False, "router_aux_loss_coef": 0.001})
    return cfg


def write_gguf(path: Path, shape: Qwen35MoeShape, tensors: dict, tok) -> Path:
    """The target and its MTP head as llama.cpp's converter writes a Qwen3.5-MoE checkpoint (arch qwen35moe,
    block_count L + 1, nextn_predict_layers 1, per-expert-style ffn_{gate,up}_exps, V heads tiled, +1 on the norms),
    read back through the harness's GGUF reader: every tensor equal to the HF one (exactly, or within 2^-22 where the
    converter's +1 / -exp transforms round)."""
    from ...loading import load_mtp, load_target
    from ..qwen38.reader import baked_plus_one

    write_qwen38_gguf(path, shape, tensors, tok, mtp_layers=1, name=TARGET, moe=shape.moe)
    spec = load_target(path)
    mtp = load_mtp(path, spec)
    for name, want in tensors.items():
        got = (mtp.tensors if name.startswith("mtp.") else spec.tensors)[name].float()
        inexact = baked_plus_one(name) or name.endswith("A_log")
        if not torch.allclose(got, want.float(), rtol=0.0, atol=2.0 ** -22 if inexact else 0.0):
            raise RuntimeError(f"{path}: {name} does not read back equal to the trained weights")
    return path


def export_gguf(fixtures: Path, out: Path | None = None) -> Path:
    """Write ``qwen35moe-tiny.gguf`` from the trained ``qwen35moe-tiny/`` (no retraining). With ``out`` the file goes
    there and nothing is registered; without, it joins ``fixtures`` and its manifest, refused (nothing moved) when
    the folder would pass ``MAX_FIXTURE_BYTES``."""
    from tokenizers import Tokenizer

    from ...loading import load_target

    man = Manifest.read(fixtures)
    entry = man.models[TARGET]
    shape = Qwen35MoeShape(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry["shape"].items()})
    spec = load_target(fixtures / TARGET)
    dst = out or fixtures / GGUF
    tmp = dst.with_name(dst.name + ".tmp")
    write_gguf(tmp, shape, {n: spec.tensors[n] for n in spec.tensors},
               Tokenizer.from_file(str(fixtures / TARGET / "tokenizer.json")))
    os.chmod(tmp, 0o644)
    if out is not None:
        os.replace(tmp, dst)
        return dst
    # the cap counts distinct content (Manifest.stored_bytes), as install_model does; a new file adds its size
    total = man.stored_bytes + tmp.stat().st_size - man.files.get(GGUF, {}).get("bytes", 0)
    if total > MAX_FIXTURE_BYTES:
        tmp.unlink()
        raise RuntimeError(f"fixtures would store {total} distinct bytes with {GGUF}, over the {MAX_FIXTURE_BYTES} "
                           "limit (write it elsewhere with --gguf-out)")
    os.replace(tmp, dst)
    man.add_files(fixtures, [dst])
    entry["files"] = sorted(set(entry["files"]) | {GGUF})
    entry["architecture"] = "Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text; GGUF arch qwen35moe)"
    entry["gguf_export"] = {"command": "python -m bloomery_cli.families.qwen35moe.fixture --out fixtures --gguf-only",
                            "from": f"{TARGET}/model.safetensors (the trained weights unchanged)"}
    man.write(fixtures)
    verified(fixtures, "qwen35moe GGUF export")
    return dst


def build_qwen35moe(out_dir: Path, device: str = "cpu", quick: bool = False, progress=None,
                    config: Qwen35MoeConfig | None = None) -> Manifest:
    """Train the target and its MTP head, write and register them in ``out_dir``."""

    from ...loading import load_mtp, load_target

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or Qwen35MoeConfig.for_device(device, quick)
    dev = torch.device(device)
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.mtp.log_every)
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        shape = Qwen35MoeShape(vocab_size=tok.get_vocab_size())
        t_bf16, tstats = train_target(train, shape, cfg, dev, rep)
        tq = {k: v.to(dev, torch.float32) for k, v in t_bf16.items()}
        tstats["held_out"] = evaluate(tq, shape, held.to(dev), cfg.seq, cfg.eval_windows)
        rep.log(f"qwen35moe target: {tstats['train_seconds']} s, held-out ce {tstats['held_out']['ce']:.3f}")
        tspec = shape.spec(tq)

        def fwd(params, _spec, ids):
            return forward_train(params, tspec, ids)

        t0 = time.perf_counter()
        pool = greedy_pool(tq, target_shape_of(tspec), train.to(dev), cfg.pool_size, cfg.seq, (cfg.pool_prefix,), fwd,
                           dev, torch.Generator().manual_seed(cfg.seed + 3), batch=64, reporter=rep)
        held_rows = greedy_pool(tq, target_shape_of(tspec), held.to(dev), cfg.eval_rows, cfg.seq, (cfg.pool_prefix,),
                                fwd, dev, torch.Generator().manual_seed(cfg.seed + 6), batch=64)
        pool_s = time.perf_counter() - t0
        starts = torch.randint(0, train.numel() - cfg.seq, (cfg.real_rows,),
                               generator=torch.Generator().manual_seed(cfg.seed + 7))
        rows = torch.cat([pool.repeat(cfg.greedy_repeat, 1), train[starts[:, None] + torch.arange(cfg.seq)].to(dev)])
        mp = {k: v.to(dev) for k, v in init_mtp(shape, cfg.seed + 8).items()}
        mcfg = replace(cfg.mtp, seed=cfg.seed + 9)
        mlog = train_mtp(mp, tq, tspec, rows, mcfg, cfg.mtp_chain, dev, rep)
        m_bf16 = round_bf16(mp)
        mq = {k: v.to(dev, torch.float32) for k, v in m_bf16.items()}
        mtp_greedy = eval_mtp(mq, tq, tspec, held_rows, cfg.mtp_chain, cfg.pool_prefix, dev)
        both = evaluate(tq, shape, held.to(dev), cfg.seq, cfg.eval_windows, mq)["expert_load"]
        mtp_load = {k: v for k, v in both.items() if k.startswith("mtp.")}
        rep.log(f"mtp: train loss {mlog.tail_mean(50):.4f}, held-out greedy {mtp_greedy}")

    work = fresh_work(out_dir, "qwen35moe")
    files = write_qwen38_target(work / TARGET, t_bf16, tjson, shape=shape, extra=m_bf16, gguf_file=False)
    eot = tok.token_to_id(tokenizer_train.EOT)
    (work / TARGET / "config.json").write_text(json.dumps(moe_config(shape, eot), indent=2, sort_keys=True) + "\n")
    for f in files:
        os.chmod(f, 0o644)
    spec = load_target(work / TARGET)
    mtp = load_mtp(work / TARGET, spec)
    for name, want in [*t_bf16.items(), *m_bf16.items()]:
        got = (mtp.tensors if name.startswith("mtp.") else spec.tensors)[name]
        if not torch.equal(got, want):
            raise RuntimeError(f"{TARGET}: {name} does not read back equal to the trained weights")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen35moe.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "qwen35moe" else f"build_qwen35moe({out_dir}, {device}, quick={quick})",
               "builder": "bloomery_cli.families.qwen35moe.fixture", "quick": cfg.quick, "seed": cfg.seed,
               "versions": _versions(), **_device_info(dev), "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{TARGET}/model.safetensors", f"{TARGET}/config.json"],
             "architecture": "Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text)", "shape": asdict(shape),
             "parameters": sum(v.numel() for v in t_bf16.values()), "training": tstats,
             "held_out": {k: v for k, v in tstats["held_out"].items() if k != "expert_load"},
             "expert_load": tstats["held_out"]["expert_load"], "final_train_loss": round(tstats["train_ce_last50"], 4),
             "made_by": made_by}
    man = install_model(work, out_dir, TARGET, files, entry, MAX_FIXTURE_BYTES)
    man.models[f"{TARGET}/mtp"] = {
        "kind": "mtp", "tensors": f"mtp.* in {TARGET}/model.safetensors", "parameters": sum(v.numel() for v in
                                                                                           m_bf16.values()),
        "chain_steps_trained": cfg.mtp_chain,
        "training": {**asdict(mcfg), "rows": f"{cfg.pool_size} greedy rows of {cfg.seq} (a {cfg.pool_prefix}-token "
                     f"training window + the target's greedy continuation; {pool_s:.0f} s) x {cfg.greedy_repeat}, and "
                     f"{cfg.real_rows} random {cfg.seq}-token training windows"},
        "final_train_loss": round(mlog.tail_mean(50), 4), "held_out_greedy": mtp_greedy, "expert_load": mtp_load,
        "seconds": round(mlog.seconds, 1), "made_by": made_by}
    man.write(out_dir)
    clean_work(work)
    try:
        export_gguf(out_dir)
    except RuntimeError as e:                     # over the fixtures' size cap: the HF layout stands alone
        rep.log(f"{GGUF} not bundled: {e}")
    verified(out_dir, "qwen35moe build")
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="target steps (default 600)")
    ap.add_argument("--mtp-steps", type=int, default=None, help="MTP distillation steps (default 300)")
    ap.add_argument("--pool", type=int, default=None, help="greedy pool rows (default 64)")
    ap.add_argument("--gguf-only", action="store_true", help="only (re)write the GGUF from the trained HF fixture")
    ap.add_argument("--gguf-out", type=Path, default=None, help="with --gguf-only: write it here, unregistered")
    args = ap.parse_args(argv)
    if args.gguf_only:
        print(export_gguf(args.out, args.gguf_out), flush=True)
        return 0
    cfg = Qwen35MoeConfig.for_device(args.device, args.quick)
    if args.steps is not None:
        cfg = replace(cfg, target_steps=args.steps)
    if args.mtp_steps is not None:
        cfg = replace(cfg, mtp=replace(cfg.mtp, steps=args.mtp_steps, warmup=max(1, args.mtp_steps // 10)))
    if args.pool is not None:
        cfg = replace(cfg, pool_size=args.pool)
    man = build_qwen35moe(args.out, args.device, args.quick, progress=lambda *a: print(*a, flush=True), config=cfg)
    print(json.dumps({k: man.models[k].get("held_out") or man.models[k].get("held_out_greedy")
                      for k in (TARGET, f"{TARGET}/mtp")}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
