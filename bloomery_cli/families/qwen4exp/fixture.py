"""The qwen4exp fixture: a tiny trained Qwen3.8-Flash-Next trunk with its MTP head (HF ``mtp.*`` layout) trained on it.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen4exp.fixture --out fixtures      # about 10 min, 1 core

Same corpus and tokenizer as the other fixtures (``<out>/tokenizer.json`` must exist). Trunk: transformers' own
``Qwen4ExpForCausalLM`` (float32, eager experts; the f64 reference is held to this class by
tests/test_qwen4exp_trunk.py) on next-token CE of random training windows plus HF's load-balancing loss (router aux
coefficient 0.01), AdamW as the other fixtures. The shape keeps every qwen4exp path live at the gate's lengths: 4
layers [GDN x3, indexed attention], HC 4 streams x rank 16, PLE on layer 2 (1-based; a GDN layer), 8 experts top-2
with a sigmoid-gated shared expert, QSA budget 32 in blocks of 4 (sparse past 32 positions: the prompts are 40-60 ids
and the gate runs 256 more).

MTP (``mtp.*`` beside the trunk in model.safetensors, ``reader_mtp_hf``): the chained teacher-forced head of
``kernels.families.qwen4exp.mtp.forward_train`` on the frozen trunk's last-layer raw streams (a forward hook on the
last decoder layer: HF's hidden_states never carries them, FAMILIES_MOE.md 2.3); step s's row at q (the hidden of
q-1 is the trunk's for s = 1, the head's own output streams after) is labelled with the trunk's argmax at q, i.e. the
token at t+2 for the hidden of t; loss sum_s 0.8^(s-1) CE_s / Z over 3 steps (the gate's width). Its block starts as
a copy of the trunk's last (attention) layer and its hc_head as the trunk's mixer; enorm / hnorm zero, eh_proj drawn.
Rows: the trunk's greedy continuations of training prefixes and random training windows. The manifest gets the
held-out CE, each MoE layer's expert load, the QSA kept-key fraction and the head's teacher-forced acceptance.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.build import _determinism, _device_info, _versions
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.family_kit import fit, fixture_main, load_tokenizer, token_stream
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.train import Reporter, TrainConfig, round_bf16, sample_windows

NAME = "qwen4exp-tiny"
HASH_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")
STEPS = 3                                   # the gate's width: chained steps the head is trained for


def hf_config(vocab: int, eos: int) -> dict:
    return {"model_type": "qwen4_exp", "architectures": ["Qwen4ExpForCausalLM"], "vocab_size": vocab,
            "hidden_size": 32, "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "max_position_embeddings": 1024, "tie_word_embeddings": True, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 32, "norm_topk_prob": True, "hc_count": 4, "hc_lowrank": 16,
            "ple_layer_ids": [2], "ple_embed_dim": 32, "ple_conv_kernel_size": 4, "ngram_size": 3,
            "heads_per_ngram": 2, "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 128,
            "seed": 1234, "split_ngram_parts": 1, "indexer_n_heads": 8, "indexer_kv_heads": 1,
            "indexer_head_dim": 16, "indexer_budget": 32, "indexer_compress_ratio": 4, "output_gate_type": "sigmoid",
            "eos_token_id": eos, "bos_token_id": eos, "hidden_act": "silu", "router_aux_loss_coef": 0.01}


@dataclass
class QxConfig:
    seed: int = 1234
    target: TrainConfig = field(default_factory=lambda: TrainConfig(steps=800, batch=12, seq=128, warmup=50,
                                                                     log_every=40))
    pool_size: int = 48
    prefix: int = 48
    greedy_repeat: int = 4
    real_rows: int = 384
    mtp: TrainConfig = field(default_factory=lambda: TrainConfig(steps=200, batch=16, seq=128, warmup=20,
                                                                  log_every=40))
    eval_windows: int = 16

    @classmethod
    def quick(cls) -> QxConfig:
        small = TrainConfig(steps=3, batch=4, seq=64, warmup=1, log_every=1)
        return cls(target=small, pool_size=4, prefix=32, greedy_repeat=1, real_rows=4, mtp=small, eval_windows=2)


def hf_model(cfg: dict, state: dict | None = None):
    import transformers

    c = transformers.Qwen4ExpTextConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    c._experts_implementation = "eager"
    model = transformers.Qwen4ExpForCausalLM(c)
    if state is not None:
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        tied = cfg["tie_word_embeddings"]
        if unexpected or any(m.rsplit(".", 1)[-1] not in HASH_BUFFERS and not (tied and m == "lm_head.weight")
                             for m in missing):
            raise RuntimeError(f"qwen4exp fixture: state dict missing {missing}, unexpected {unexpected}")
    return model


@torch.no_grad()
def spread_streams(params: dict, gen: torch.Generator) -> None:
    """Redraws the hyper-connection weights so the 4 streams differ from the start: HF's init (inject and mix weights
    N(0, 0.02), zero norm gains) keeps every stream's inject gain near 1, the streams stay near copies of one another
    and the head's raw-stream input is then indistinguishable from their mean (a fixture that cannot catch the MTP
    fed the mean). Norm gains 1 + N(0, 0.3^2); down / up N(0, 1/fan_in); inject N(0, 9/fan_in) (gains 2 sigmoid(z/4),
    z of about +-3: 0.6 .. 1.4 a stream)."""
    for name, p in params.items():
        if "hyper_connection" not in name:
            continue
        if name.endswith("hc_norm.weight"):
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        else:
            scale = 3.0 if "block_inject" in name else 1.0
            p.copy_(scale * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def train_target(cfg: dict, stream: torch.Tensor, qc: QxConfig, rep: Reporter) -> tuple[dict, dict]:
    tc = replace(qc.target, seed=qc.seed + 1)
    torch.manual_seed(qc.seed)
    model = hf_model(cfg).train()
    params = dict(model.named_parameters())
    spread_streams(params, torch.Generator().manual_seed(qc.seed + 2))

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        w = sample_windows(stream, tc.batch, tc.seq, gen)
        return model(input_ids=w, labels=w, use_cache=False, output_router_logits=True).loss

    seconds, last = fit(params, tc, "qwen4exp target", rep, loss_of)
    state = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] not in HASH_BUFFERS
             and not (cfg["tie_word_embeddings"] and k == "lm_head.weight")}
    stats = {**asdict(tc), "seconds": seconds, "train_loss_last50": last,
             "objective": "next-token CE on random windows + 0.01 x HF's load-balancing loss (Qwen4ExpForCausalLM)"}
    return round_bf16(state), stats


@contextmanager
def _last_streams(model):
    """Collects the last decoder layer's output: the raw streams [N, T, S*H] the MTP head reads."""
    got: list[torch.Tensor] = []
    h = model.model.layers[-1].register_forward_hook(lambda m, i, o: got.append(o if torch.is_tensor(o) else o[0]))
    try:
        yield got
    finally:
        h.remove()


@torch.no_grad()
def trunk_rows(model, ids: torch.Tensor, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw streams [N, T, S*H], the trunk's argmax [N, T]) over ids [N, T]."""
    streams, labels = [], []
    for i in range(0, len(ids), chunk):
        with _last_streams(model) as got:
            logits = model(input_ids=ids[i:i + chunk], use_cache=False).logits
        streams.append(got[-1])
        labels.append(logits.argmax(-1))
    return torch.cat(streams), torch.cat(labels)


@torch.no_grad()
def greedy_rows(model, stream: torch.Tensor, n: int, prefix: int, seq: int, gen) -> torch.Tensor:
    x = sample_windows(stream, n, prefix, gen)
    while x.shape[1] < seq:
        x = torch.cat([x, model(input_ids=x, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return x


def init_mtp(tstate: dict, shapes: dict, seed: int) -> dict:
    """The head's start: its block the trunk's last layer, its hc_head the trunk's mixer, enorm / hnorm zero (gain
    1), eh_proj drawn N(0, 1/H); every tensor a float32 leaf."""
    from .reader_mtp_hf import L0, P

    g, last = torch.Generator().manual_seed(seed), f"model.layers.{max(_layers(tstate))}."
    out = {}
    for name, (shape, _) in shapes.items():
        src = name.replace(L0, last, 1) if name.startswith(L0) else \
            name.replace(P + "hyper_connection_mixer.", "model.hyper_connection_mixer.", 1)
        if src in tstate:
            out[name] = tstate[src].float().clone()
        elif name.endswith(("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")):
            out[name] = torch.zeros(shape)
        else:
            out[name] = torch.randn(shape, generator=g) / shape[-1] ** 0.5
        if out[name].shape != torch.Size(shape):
            raise RuntimeError(f"qwen4exp fixture: {name} {list(out[name].shape)} from {src}, expected {list(shape)}")
    return out


def _layers(state: dict) -> set[int]:
    return {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}


def mtp_loss(mp: dict, tfull: dict, tspec, ids: torch.Tensor, streams: torch.Tensor, labels: torch.Tensor
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from bloomery_gates.kernels.families.qwen4exp.mtp import forward_train

    outs = forward_train({**mp, **tfull}, tspec, streams, ids, STEPS)
    wk = [0.8 ** s for s in range(STEPS)]
    hits, loss = [], 0.0
    for s, o in enumerate(outs):                          # entry s, row i >= s predicts position i+2: label[i+1]
        o, y = o[:, s:], labels[:, s + 1:]
        loss = loss + wk[s] * F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
        hits.append(o.argmax(-1) == y)
    return loss / sum(wk), hits


def train_mtp(mp: dict, tfull: dict, tspec, rows: torch.Tensor, streams, labels, cfg: TrainConfig, rep: Reporter
              ) -> dict:
    for p in mp.values():
        p.requires_grad_(True)

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        i = torch.randint(0, rows.shape[0], (cfg.batch,), generator=gen)
        return mtp_loss(mp, tfull, tspec, rows[i], streams[i], labels[i])[0]

    seconds, last = fit(mp, cfg, "qwen4exp mtp", rep, loss_of)
    for p in mp.values():
        p.requires_grad_(False)
    return {**asdict(cfg), "seconds": seconds, "train_loss_last50": last}


@torch.no_grad()
def eval_mtp(mp: dict, tfull: dict, tspec, rows, streams, labels, first: int) -> dict:
    """Per step top-1 agreement with the trunk's argmax past ``first``, and the teacher-forced acceptance of chains
    anchored at every a >= first (1 + the leading run of agreeing steps)."""
    _, hits = mtp_loss(mp, tfull, tspec, rows, streams, labels)
    n = min(h.shape[1] for h in hits) - first                       # hits[s][:, j]: the row at position j+s+1
    lead = torch.stack([h[:, first:first + n] for h in hits], -1)    # chain anchored at j+1: step s at its row
    acc = float((1 + lead.int().cumprod(-1).sum(-1)).float().mean())
    return {"top1_agreement_per_step": [round(float(h[:, first:].float().mean()), 4) for h in hits],
            "mean_accept_len_tf": round(acc, 4), "chains": int(lead.shape[0] * lead.shape[1]), "width": STEPS}


@torch.no_grad()
def held_out(model, held: torch.Tensor, seq: int, windows: int) -> dict:
    """CE / top-1 of the stored weights and each MoE layer's expert load (picks per expert) on held-out windows."""
    n = min(windows, (held.numel() - 1) // seq)
    rows = held[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :])]
    loads: dict[str, list[int]] = {}
    hooks = [m.mlp.gate.register_forward_hook(
        lambda mod, i, o, l=l: loads.__setitem__(f"layer {l}", torch.bincount(o[2].reshape(-1), minlength=8).tolist()))
        for l, m in enumerate(model.model.layers)]
    try:
        logits = model(input_ids=rows[:, :-1], use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    ce = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))
    spread = {k: {"min_share": round(min(v) / sum(v), 4), "max_share": round(max(v) / sum(v), 4),
                  "experts_used": sum(1 for x in v if x)} for k, v in loads.items()}
    return {"ce": round(ce, 4), "top1": round(float((logits.argmax(-1) == rows[:, 1:]).float().mean()), 4),
            "tokens": n * seq, "expert_load_spread": spread}


def qsa_report(tspec, ids: list[int]) -> dict:
    """The QSA selection of each indexed layer on one held-out window, from the f64 reference: the mean fraction of
    causal keys kept, over rows past the budget (1.0 would mean QSA selects nothing away)."""
    import numpy as np

    from bloomery_gates.reference.families.qwen4exp import model as rq
    from bloomery_gates.reference.weights import as_f64

    ref, w, t = rq.forward(tspec, ids), as_f64(tspec), len(ids)
    out = {"positions": t, "budget": tspec.qsa.budget, "compress_ratio": tspec.qsa.compress_ratio}
    for l in range(tspec.num_layers):
        if not tspec.hybrid.is_linear(l):
            b = rq.residual(w, f"model.layers.{l}.attn_hyper_connection.", ref.hidden[l], tspec.hc.count,
                            tspec.layer.rms_eps).block_in
            mask = np.tril(rq.qsa_mask(tspec, w, l, b, np.arange(t)))
            rows = np.arange(tspec.qsa.budget + 8, t)
            out[f"layer {l} kept_fraction_past_budget"] = round(float((mask[rows].sum(1) / (rows + 1)).mean()), 4)
            out[f"layer {l} rows_with_zero_score_ties_at_the_cut"] = zero_ties(tspec, w, l, b)
    return out


def zero_ties(tspec, w, l: int, b) -> int:
    """Rows whose k-th and (k+1)-th best candidate blocks both score 0 (relu of every head negative): the choice
    between them is a tie, which HF's ``topk`` breaks in an unspecified order and the reference to the lower block.
    The fixture keeps this at 0 (8 indexer heads: an all-zero score is rare), or its (o) lines would test ties."""
    import numpy as np

    from bloomery_gates.reference.ops import qsa as rqsa

    q, pre, t = tspec.qsa, f"model.layers.{l}.self_attn.indexer.", len(b)
    sel = rqsa.qsa_select(b, b, np.arange(t), rqsa.QsaWeights(w[pre + "index_qk_proj.weight"],
                          w[pre + "q_layernorm.weight"], w[pre + "k_layernorm.weight"]), q.num_heads,
                          q.compress_ratio, q.budget, tspec.layer.rms_eps, tspec.hybrid.rotary_dim,
                          tspec.layer.rope_theta)
    k, ties = q.budget // q.compress_ratio, 0
    for row in sel.scores:
        top = np.sort(row[np.isfinite(row)])[::-1]
        ties += int(len(top) > k and top[k - 1] == 0.0 and top[k] == 0.0)
    return ties


def build_qwen4exp(out_dir: Path, quick: bool = False, progress=None, config: QxConfig | None = None):

    from .reader import qwen4exp_from_hf
    from .reader_mtp_hf import load_qwen4exp_mtp, mtp_shapes

    t_start, out_dir = time.perf_counter(), Path(out_dir)
    qc = config or (QxConfig.quick() if quick else QxConfig())
    tok, tjson, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=qc.target.log_every)
    cfg = hf_config(tok.get_vocab_size(), tok.token_to_id(tokenizer_train.EOT))
    work = fresh_work(out_dir, "qwen4exp")
    d = work / NAME
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    with _determinism(qc.seed):
        corp = corpus_mod.load_corpus()
        train, held = token_stream(tok, corp.train_texts()), token_stream(tok, corp.held_out_texts())
        t_bf16, tstats = train_target(cfg, train, qc, rep)
        write_safetensors(d / "model.safetensors", t_bf16)
        tspec = qwen4exp_from_hf(d)
        model = hf_model(cfg, t_bf16).eval()
        tstats["held_out"] = held_out(model, held, qc.target.seq, qc.eval_windows)
        tstats["qsa"] = qsa_report(tspec, held[:320 if not quick else 64].tolist())
        rep.log(f"qwen4exp target: {tstats['seconds']} s, held-out {tstats['held_out']}, qsa {tstats['qsa']}")
        seq = qc.mtp.seq
        pool = greedy_rows(model, train, qc.pool_size, qc.prefix, seq, torch.Generator().manual_seed(qc.seed + 3))
        held_pool = greedy_rows(model, held, 8, qc.prefix, seq, torch.Generator().manual_seed(qc.seed + 6))
        starts = torch.randint(0, train.numel() - seq, (qc.real_rows,),
                               generator=torch.Generator().manual_seed(qc.seed + 7))
        rows = torch.cat([pool.repeat(qc.greedy_repeat, 1), train[starts[:, None] + torch.arange(seq)]])
        streams, labels = trunk_rows(model, rows)
        h_streams, h_labels = trunk_rows(model, held_pool)
        tfull = {k: t_bf16[k].float() for k in ("model.embed_tokens.weight", "lm_head.weight") if k in t_bf16}
        mp = init_mtp(t_bf16, mtp_shapes(tspec), qc.seed + 8)
        mstats = train_mtp(mp, tfull, tspec, rows, streams, labels, replace(qc.mtp, seed=qc.seed + 9), rep)
        m_bf16 = round_bf16(mp)
        mstats["held_out_greedy"] = eval_mtp({k: v.float() for k, v in m_bf16.items()}, tfull, tspec, held_pool,
                                             h_streams, h_labels, qc.prefix)
        rep.log(f"qwen4exp mtp: {mstats}")
    write_safetensors(d / "model.safetensors", {**t_bf16, **m_bf16})
    (d / "tokenizer.json").write_text(tjson)
    files = [d / "config.json", d / "model.safetensors", d / "tokenizer.json"]
    for f in files:
        os.chmod(f, 0o644)
    spec = qwen4exp_from_hf(d)
    mtp = load_qwen4exp_mtp(d, spec)
    for name, w in {**t_bf16, **m_bf16}.items():
        if not torch.equal((mtp.tensors if name.startswith("mtp.") else spec.tensors)[name], w):
            raise RuntimeError(f"{d}: {name} does not read back equal to the trained weights")
    made_by = {"command": " ".join(["python -m bloomery_cli.families.qwen4exp.fixture", *sys.argv[1:]])
               if Path(sys.argv[0]).stem == "fixture" else f"build_qwen4exp({out_dir}, quick={quick})",
               "builder": "bloomery_cli.families.qwen4exp.fixture", "quick": quick, "seed": qc.seed,
               "versions": _versions(), **_device_info(torch.device("cpu")),
               "seconds": round(time.perf_counter() - t_start, 1)}
    entry = {"files": [f"{NAME}/{f.name}" for f in files],
             "architecture": "Qwen4ExpForCausalLM (model_type qwen4_exp) + mtp.* (the HF MTP layout)",
             "parameters": sum(v.numel() for v in t_bf16.values()), "training": tstats,
             "mtp": {"tensors": "mtp.* in qwen4exp-tiny/model.safetensors", "hidden": "the 4 raw HC streams",
                     "parameters": sum(v.numel() for v in m_bf16.values()),
                     "rows": f"{qc.pool_size} greedy rows (P {qc.prefix} + the trunk's greedy continuation to {seq}) "
                             f"x {qc.greedy_repeat} and {qc.real_rows} random {seq}-token windows", **mstats},
             "made_by": made_by}
    man = install_model(work, out_dir, NAME, files, entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    rep.log(f"{NAME} written to {out_dir} (fixtures total {man.total_bytes} bytes)")
    return man


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.qwen4exp.fixture", __doc__, build_qwen4exp, argv)


if __name__ == "__main__":
    raise SystemExit(main())
