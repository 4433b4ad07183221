"""The deepseek4 fixture: a tiny trained DeepSeek V4-layout target (HF ``deepseek_v4``) with its in-file MTP block.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek4.fixture --out fixtures      # ~8 min, 2 busy cores

Same corpus and tokenizer as the other fixtures (``<out>/tokenizer.json``, its real 4096-token vocabulary).

Target: transformers' ``DeepseekV4ForCausalLM`` (its own autograd-able forward; HF's init, then ``tid2eid`` filled:
2 distinct experts of 8 per token, seeded; the router bias ``e_score_correction_bias`` a seeded N(0, 0.1) draw,
fixed: HF keeps both as buffers, so neither is trained), next-token CE on random 128-token windows of the training
stream, AdamW as the other fixtures. Shape: H 32 (the embedding tied to the head: the fixtures' size cap), 4 layers
[sliding, CSA, HCA, CSA], CSA rate 4 (overlapping, a top-4 lightning indexer of 16 heads x 8: with 2 heads the ReLU
scores of two entries were often both exactly 0, a tie at the top-k boundary that transformers breaks in another
order than ``topk_stable``, which moved HF's logits 1.6e-2 from ours at 23 tokens), HCA rate 16, window 16, 4 heads
x 32 over one K = V head, rope 8, 8 experts top-2 (layer 0 a hash layer), 4 mHC streams, a YaRN compress rope. At a
prompt of P tokens a CSA layer holds P // 4 entries (the indexer keeps 4: sparse from 17 tokens on), an HCA layer P
// 16 (from 16 tokens on), the window drops keys from 17 on; the gates' prompts (p0..p7, 40..64 tokens) and their
256 drafted ids run every path.

MTP (``mtp.0.*`` beside the trunk in model.safetensors, names as ``reader_mtp`` reads them): warm-started from the
trained trunk's layer 0 attention / mHC (sliding) and layer 1 MoE (non-hash), its HC head from the trunk's,
e_proj / h_proj fresh; trained on the frozen bf16 trunk (the device engine's own raw streams, f32) with the
teacher-forced rows of ``kernels.families.deepseek4.mtp.forward_train``: row q (streams q, token q+1) labelled with
the target's argmax at q+1 (the token at q+2 on greedy text); rows: the target's greedy continuations of real
windows and real windows.
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

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.family_kit import check_readback, fit, fixture_main, load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.train import Reporter, TrainConfig, round_bf16, sample_windows

NAME = "ds4-tiny"
H, S, E, K = 32, 4, 8, 2
TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention"]


def hf_config(vocab: int, eot: int) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": vocab,
        "hidden_size": H, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16,
        "sliding_window": 16, "layer_types": TYPES,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32,
                         "beta_slow": 1},
        "index_n_heads": 16, "index_head_dim": 8, "index_topk": 4, "n_routed_experts": E, "num_experts_per_tok": K,
        "n_shared_experts": 1, "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
        "hc_mult": S, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
        "tie_word_embeddings": True, "num_nextn_predict_layers": 1, "hidden_act": "silu", "initializer_range": 0.02,
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}


@dataclass
class DS4Config:
    seed: int = 1234
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=700, batch=8, seq=128, warmup=50,
                                                                     log_every=100))
    pool_size: int = 24
    prefix: int = 32
    real_rows: int = 72
    mtp: TrainConfig = field(default_factory=lambda: TrainConfig(steps=300, batch=8, seq=128, warmup=30,
                                                                  log_every=50))

    @classmethod
    def quick(cls) -> DS4Config:
        small = TrainConfig(steps=3, batch=2, seq=48, warmup=1, log_every=1)
        return cls(target=small, pool_size=2, prefix=24, real_rows=2, mtp=small)


def hf_model(config: dict[str, Any], seed: int):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    c = DeepseekV4Config(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    c._attn_implementation = "eager"
    m = DeepseekV4ForCausalLM(c)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buf in m.named_buffers():
            if name.endswith("tid2eid"):
                buf.copy_(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(buf.shape[0])]))
            elif name.endswith("e_score_correction_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=g))
    return m


def train_target(m, stream: torch.Tensor, cfg: TrainConfig, rep: Reporter) -> dict:
    def loss_of(gen: torch.Generator) -> torch.Tensor:
        w = sample_windows(stream, cfg.batch, cfg.seq + 1, gen)
        logits = m(input_ids=w[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1))

    m.train()
    seconds, last = fit(dict(m.named_parameters()), cfg, "deepseek4 target", rep, loss_of)
    m.eval()
    return {**asdict(cfg), "seconds": seconds, "train_ce_last50": last,
            "objective": "next-token CE through transformers' DeepseekV4ForCausalLM; tid2eid and the router bias "
                         "seeded draws, fixed (HF buffers)"}


def trunk_state(m) -> dict[str, torch.Tensor]:
    """The stored trunk: float tensors rounded to bf16, the hash tables int32 (HF's rope buffers left out)."""
    return {n: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach().to(torch.int32)).clone()
            for n, v in m.state_dict().items() if "rotary_emb" not in n}


def write_dir(d: Path, config: dict, tensors: dict[str, torch.Tensor], tjson: str) -> list[Path]:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    floats = {k: v for k, v in tensors.items() if v.is_floating_point()}
    write_safetensors(d / "model.safetensors", floats)
    ints = {k: v.to(torch.int32).contiguous() for k, v in tensors.items() if not v.is_floating_point()}
    if ints:                     # the hash tables stay integer: rewrite the file with both
        from safetensors.torch import load_file
        save_file({**load_file(str(d / "model.safetensors")), **ints}, str(d / "model.safetensors"),
                  metadata={"format": "pt"})
    (d / "tokenizer.json").write_text(tjson)
    return [d / "config.json", d / "model.safetensors", d / "tokenizer.json"]


def mtp_init(trunk: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """mtp.0.* (without the prefix) warm-started from the trunk (module docstring)."""
    out = {}
    for pre, keep in (("model.layers.0.", ("self_attn.", "attn_hc.", "ffn_hc.", "input_layernorm",
                                           "post_attention_layernorm")), ("model.layers.1.", ("mlp.",))):
        out |= {n[len(pre):]: v.float().clone() for n, v in trunk.items()
                if n.startswith(pre) and n[len(pre):].startswith(keep) and ".compressor." not in n}
    out |= {"hc_head." + k: trunk["model.hc_head." + k].float().clone() for k in ("hc_fn", "hc_base", "hc_scale")}
    g = torch.Generator().manual_seed(seed)
    out |= {n + ".weight": torch.ones(H) for n in ("enorm", "hnorm", "norm")}
    out |= {n + ".weight": torch.randn(H, H, generator=g) / H ** 0.5 for n in ("e_proj", "h_proj")}
    return out


@torch.no_grad()
def streams_and_labels(eng, rows: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per row: the engine's raw last-layer streams [n, S, H] and its argmax [n]."""
    hs, labels = [], []
    for r in rows:
        out = eng.prefill(r.tolist())
        hs.append(out.taps[-1].float())
        labels.append(torch.tensor(out.argmax))
    return hs, torch.stack(labels)


@torch.no_grad()
def greedy_rows(eng, stream: torch.Tensor, n: int, prefix: int, seq: int, gen) -> torch.Tensor:
    x = sample_windows(stream, n, prefix, gen)
    out = []
    for r in x:
        ids = r.tolist()
        nxt = eng.prefill(ids).argmax[-1]
        while len(ids) < seq:
            ids.append(nxt)
            nxt = eng.verify([nxt]).argmax[0]
            eng.commit(1)
        out.append(torch.tensor(ids))
    return torch.stack(out)


def mtp_loss(mp: dict, tspec, eng, rows: torch.Tensor, hs: list, labels: torch.Tensor, pick: list[int]
             ) -> tuple[torch.Tensor, float]:
    """Mean CE of the teacher-forced rows (row q labelled with the target's argmax at q+1) and their top-1."""
    from bloomery_gates.kernels.families.deepseek4.mtp import forward_train

    embed, head = eng.embed.float(), eng.head.float()
    loss, hits, n = 0.0, 0, 0
    for i in pick:
        logits = forward_train(mp, tspec, embed, head, hs[i], rows[i])
        loss = loss + F.cross_entropy(logits, labels[i][1:])
        hits, n = hits + int((logits.argmax(-1) == labels[i][1:]).sum()), n + logits.shape[0]
    return loss / len(pick), hits / n


def train_mtp(mp: dict, tspec, eng, rows: torch.Tensor, hs: list, labels: torch.Tensor, cfg: TrainConfig,
              rep: Reporter) -> dict:
    for p in mp.values():
        p.requires_grad_(True)

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        pick = torch.randint(0, len(hs), (cfg.batch,), generator=gen).tolist()
        return mtp_loss(mp, tspec, eng, rows, hs, labels, pick)[0]

    seconds, last = fit(mp, cfg, "deepseek4 mtp", rep, loss_of)
    for p in mp.values():
        p.requires_grad_(False)
    return {**asdict(cfg), "seconds": seconds, "train_loss_last50": last}


@torch.no_grad()
def held_out_ce(m, held: torch.Tensor, seq: int, windows: int = 16) -> dict:
    n = min(windows, (held.numel() - 1) // seq)
    rows = held[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :])]
    logits = m(input_ids=rows[:, :-1], use_cache=False).logits.float()
    ce = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))
    return {"ce": round(ce, 4), "top1": round(float((logits.argmax(-1) == rows[:, 1:]).float().mean()), 4),
            "tokens": n * seq}


def build_ds4(out_dir: Path, quick: bool = False, progress=None, config: DS4Config | None = None):

    from bloomery_gates.kernels.families.deepseek4.model import Deepseek4Target

    from .reader import deepseek4_from_hf

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (DS4Config.quick() if quick else DS4Config())
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.target.log_every)
    eot = tok.token_to_id(tokenizer_train.EOT)
    config = hf_config(tok.get_vocab_size(), eot)
    work = fresh_work(out_dir, "ds4")
    with _determinism(cfg.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        m = hf_model(config, cfg.seed)
        tstats = train_target(m, train, replace(cfg.target, seed=cfg.seed + 1), rep)
        tstats["held_out"] = held_out_ce(m, held, cfg.target.seq)
        rep.log(f"deepseek4 target: {tstats['seconds']} s, held-out {tstats['held_out']}")
        trunk = trunk_state(m)
        write_dir(work / "trunk", {**config, "num_nextn_predict_layers": 0}, trunk, tjson)
        tspec = deepseek4_from_hf(work / "trunk")
        seq = cfg.mtp.seq
        eng = Deepseek4Target(tspec, "cpu", torch.float32, seq + 8)
        pool = greedy_rows(eng, train, cfg.pool_size, cfg.prefix, seq, torch.Generator().manual_seed(cfg.seed + 3))
        held_pool = greedy_rows(eng, held, 8, cfg.prefix, seq, torch.Generator().manual_seed(cfg.seed + 6))
        real = sample_windows(train, cfg.real_rows, seq, torch.Generator().manual_seed(cfg.seed + 7))
        rows = torch.cat([pool, real])
        hs, labels = streams_and_labels(eng, rows)
        mp = mtp_init(trunk, cfg.seed + 8)
        mstats = train_mtp(mp, tspec, eng, rows, hs, labels, replace(cfg.mtp, seed=cfg.seed + 9), rep)
        m_bf16 = {"mtp.0." + k: v for k, v in round_bf16(mp).items()}
        hh, hl = streams_and_labels(eng, held_pool)
        mq = {k[len("mtp.0."):]: v.float() for k, v in m_bf16.items()}
        with torch.no_grad():
            mstats["held_out_greedy_top1"] = round(mtp_loss(mq, tspec, eng, held_pool, hh, hl,
                                                            list(range(len(hh))))[1], 4)
        rep.log(f"deepseek4 mtp: {mstats}")
    d = work / NAME
    files = write_dir(d, config, {**trunk, **m_bf16}, tjson)
    for f in files:
        os.chmod(f, 0o644)
    _readback(d, {**trunk, **m_bf16})
    made_by = {"command": " ".join(["python -m bloomery_cli.families.deepseek4.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "fixture" else f"build_ds4({out_dir}, quick={quick})",
               "builder": "bloomery_cli.families.deepseek4.fixture", "quick": quick, "seed": cfg.seed,
               "versions": _versions(), **_device_info(torch.device("cpu")),
               "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{NAME}/{f.name}" for f in files],
             "architecture": "DeepseekV4ForCausalLM (model_type deepseek_v4) + the in-file MTP block mtp.0.*",
             "shape": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "layer_types", "compress_rates",
                                              "sliding_window", "index_topk", "n_routed_experts",
                                              "num_experts_per_tok", "mlp_layer_types", "hc_mult")},
             "paths_used": "CSA entries every 4 positions (indexer top-4: sparse from 17 tokens), HCA entries every "
                           "16, window 16, layer 0 hash-routed: every path runs at the gates' prompt lengths",
             "parameters": sum(v.numel() for v in trunk.values()), "training": tstats,
             "mtp": {"tensors": "mtp.0.* in ds4-tiny/model.safetensors",
                     "parameters": sum(v.numel() for v in m_bf16.values()),
                     "rows": f"{cfg.pool_size} greedy rows (P {cfg.prefix} + greedy to {seq}) and {cfg.real_rows} "
                             f"random {seq}-token windows", **mstats},
             "made_by": made_by}
    man = install_model(work, out_dir, NAME, files, entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    rep.log(f"{NAME} written to {out_dir} (fixtures total {man.total_bytes} bytes)")
    return man


def _readback(d: Path, want: dict) -> None:
    from .reader import deepseek4_from_hf
    from .reader_mtp import deepseek4_mtp_from_file

    spec = deepseek4_from_hf(d)
    mtp = deepseek4_mtp_from_file(d, spec)
    check_readback(d, want, lambda name: (mtp.tensors if name.startswith("mtp.") else spec.tensors)[name])


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.deepseek4.fixture", __doc__, build_ds4, argv)


if __name__ == "__main__":
    raise SystemExit(main())
