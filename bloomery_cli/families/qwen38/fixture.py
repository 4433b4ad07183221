"""A tiny trained qwen38 target (Qwen3.5-style dense hybrid) for the fixtures: training and HF / GGUF export.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.qwen38.fixture --out .fixtures-work/qwen38-tiny --device cpu

Same corpus and tokenizer as the qwen3 fixture (``corpus.load_corpus``, ``fixtures/tokenizer.json``), next-token
CE on random windows of the training stream through the engine's own differentiable forward
(``kernels.families.qwen38.model.forward_train``), AdamW (0.9/0.95, decay on matrices), warmup + cosine, grad clip
1, bf16 autocast on CUDA; stored rounded to bf16. Norm weights start at 0 (zero-centred gain 1 + w) except
the DeltaNet output norm (plain gain, starts at 1); A_log = log U(1, 16), dt_bias = 1 (as HF initialises).

Writes ``<out>/`` (config.json in the exact ``Qwen3_5ForCausalLM`` text-config layout, model_type
"qwen3_5_text" with layer_types, model.safetensors, tokenizer files) and ``<out>.gguf`` (arch "qwen35", names
and transforms as llama.cpp's converter: see ``bloomery_cli.families.qwen38.reader``). ``extra`` tensors (the MTP
head, ``mtp.*``) and ``extra_config`` keys (``mtp_num_hidden_layers``) are written beside the trunk; in the
GGUF the MTP layers become blk.{L+j}.* / nextn.* with block_count = L + mtp_num_hidden_layers.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from bloomery_gates.kernels.families.qwen38.model import forward_train
from bloomery_gates.spec import HybridShape, LayerShape, Qwen38Spec

from ...fixturegen import corpus as corpus_mod
from ...fixturegen import tokenizer_train
from ...fixturegen.export_gguf import Planned, file_type, gguf_header, write_streamed, write_vocab
from ...fixturegen.export_hf import write_safetensors
from ...fixturegen.train import (
    Reporter,
    Schedule,
    TrainConfig,
    _autocast,
    _optimizer,
    descend,
    round_bf16,
    sample_windows,
)
from ...formats.rope_sections import writer_sections
from .reader import baked_plus_one, gguf_name, regroup_v

TRANSFORMERS_VERSION = "5.24.0"


@dataclass(frozen=True)
class Qwen38Shape:
    hidden_size: int = 128
    layer_types: tuple[str, ...] = ("linear_attention",) * 3 + ("full_attention",)
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    vocab_size: int = 4096
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position: int = 1024

    def spec(self, params: Mapping[str, torch.Tensor], source: Path = Path("fixtures/qwen38-tiny"),
             mtp_layers: int = 0) -> Qwen38Spec:
        layer = LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size, self.rms_eps, self.rope_theta)
        hy = HybridShape(self.layer_types, self.partial_rotary_factor, int(self.head_dim * self.partial_rotary_factor),
                         self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                         self.linear_value_head_dim, self.linear_conv_kernel_dim, mtp_layers)
        return Qwen38Spec(family="qwen38", source=source, source_format="hf", layer=layer,
                          num_layers=len(self.layer_types), vocab_size=self.vocab_size, tie_word_embeddings=True,
                          max_position=self.max_position, tensors=params, hybrid=hy)


def init_qwen38(shape: Qwen38Shape, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """HF-named float32 CPU tensors (tied head: no lm_head.weight)."""
    gen = torch.Generator().manual_seed(seed)
    hy = shape.spec({}).hybrid
    H, I, nv = shape.hidden_size, shape.intermediate_size, shape.linear_num_value_heads

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen) * std

    p = {"model.embed_tokens.weight": r(shape.vocab_size, H), "model.norm.weight": torch.zeros(H)}
    for i, kind in enumerate(shape.layer_types):
        b = f"model.layers.{i}."
        p.update({b + "input_layernorm.weight": torch.zeros(H), b + "post_attention_layernorm.weight": torch.zeros(H),
                  b + "mlp.gate_proj.weight": r(I, H), b + "mlp.up_proj.weight": r(I, H),
                  b + "mlp.down_proj.weight": r(H, I)})
        if kind == "linear_attention":
            a, k = b + "linear_attn.", shape.linear_conv_kernel_dim
            p.update({a + "in_proj_qkv.weight": r(hy.conv_dim, H), a + "in_proj_z.weight": r(hy.value_dim, H),
                      a + "in_proj_a.weight": r(nv, H), a + "in_proj_b.weight": r(nv, H),
                      a + "conv1d.weight": (torch.rand(hy.conv_dim, 1, k, generator=gen) * 2 - 1) / math.sqrt(k),
                      a + "A_log": torch.log(1 + 15 * torch.rand(nv, generator=gen)), a + "dt_bias": torch.ones(nv),
                      a + "norm.weight": torch.ones(shape.linear_value_head_dim),
                      a + "out_proj.weight": r(H, hy.value_dim)})
        else:
            a, d = b + "self_attn.", shape.head_dim
            nh, nkv = shape.num_heads, shape.num_kv_heads
            p.update({a + "q_proj.weight": r(2 * nh * d, H), a + "k_proj.weight": r(nkv * d, H),
                      a + "v_proj.weight": r(nkv * d, H), a + "o_proj.weight": r(H, nh * d),
                      a + "q_norm.weight": torch.zeros(d), a + "k_norm.weight": torch.zeros(d)})
    return p


@torch.no_grad()
def eval_qwen38(params: Mapping[str, torch.Tensor], shape: Qwen38Shape, stream: torch.Tensor, seq: int,
                batch: int = 32, max_windows: int | None = None) -> dict:
    """Mean next-token CE / top-1 (float32) over consecutive ``seq``-token windows of a 1-D stream."""
    spec = shape.spec(params)
    n_all = (stream.numel() - 1) // seq
    n = n_all if max_windows is None else min(n_all, max_windows)
    rows = stream[(torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :]).to(stream.device)]
    total, correct = 0.0, 0
    for b0 in range(0, n, batch):
        w = rows[b0:b0 + batch]
        logits = forward_train(params, spec, w[:, :-1])[0].float()
        total += float(F.cross_entropy(logits.reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1), reduction="sum"))
        correct += int((logits.argmax(-1) == w[:, 1:]).sum())
    count = n * seq
    return {"ce": total / max(1, count), "ppl": math.exp(total / max(1, count)), "top1": correct / max(1, count),
            "tokens": count}


def train_qwen38_target(tokens: torch.Tensor, device: str | torch.device, steps: int, seed: int, progress=None, *,
                        held: torch.Tensor | None = None, shape: Qwen38Shape | None = None, batch: int = 16,
                        seq: int = 128, lr: float = 3e-3, eval_windows: int = 64
                        ) -> tuple[dict[str, torch.Tensor], Qwen38Spec, dict]:
    """Train on a 1-D token stream ``tokens``; returns (bf16 CPU params, their spec, stats). ``progress``: a
    rich Progress or a callable ``(stage, step, total, info)`` (``train.Reporter``). With ``held`` the stats
    carry the held-out CE of the stored (bf16) weights over ``eval_windows`` windows of ``seq`` tokens."""
    dev = torch.device(device)
    shape = shape or Qwen38Shape()
    cfg = TrainConfig(steps=steps, batch=batch, seq=seq, lr=lr, warmup=min(100, max(1, steps // 10)), seed=seed)
    params = {k: v.to(dev).requires_grad_(True) for k, v in init_qwen38(shape, seed).items()}
    spec = shape.spec(params)
    opt, sched = _optimizer(params, cfg, dev), Schedule(cfg.steps, cfg.lr, cfg.warmup)
    gen, rep, stream = torch.Generator().manual_seed(seed + 1), Reporter(progress, every=50), tokens.to(dev)
    losses: list[float] = []
    rep.start("qwen38 target", steps)
    t0 = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = sched(step)
        w = sample_windows(stream, batch, seq + 1, gen)
        with _autocast(dev):
            logits, _ = forward_train(params, spec, w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, shape.vocab_size), w[:, 1:].reshape(-1))
        losses.append(descend(opt, loss, params, cfg.clip))
        rep.step(step + 1, steps, {"loss": losses[-1]})
    seconds = time.perf_counter() - t0
    rep.done()
    stored = round_bf16(params)
    stats = {"steps": steps, "batch": batch, "seq": seq, "lr": lr, "seed": seed, "device": str(dev),
             "train_seconds": round(seconds, 1), "train_ce_last50": sum(losses[-50:]) / max(1, len(losses[-50:])),
             "shape": asdict(shape), "params": sum(v.numel() for v in stored.values())}
    if held is not None:
        widened = {k: v.to(dev, torch.float32) for k, v in stored.items()}
        stats["held_out"] = eval_qwen38(widened, shape, held.to(dev), seq, max_windows=eval_windows)
    return stored, shape.spec(stored), stats


def hf_config(shape: Qwen38Shape, extra_config: Mapping | None = None, eot_id: int = 0) -> dict:
    """config.json in the key layout transformers writes for ``Qwen3_5ForCausalLM`` (``Qwen3_5TextConfig``)."""
    cfg = {"architectures": ["Qwen3_5ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": eot_id, "dtype": "bfloat16", "eos_token_id": eot_id, "head_dim": shape.head_dim,
           "hidden_act": "silu", "hidden_size": shape.hidden_size, "initializer_range": 0.02,
           "intermediate_size": shape.intermediate_size, "layer_types": list(shape.layer_types),
           "linear_conv_kernel_dim": shape.linear_conv_kernel_dim, "linear_key_head_dim": shape.linear_key_head_dim,
           "linear_num_key_heads": shape.linear_num_key_heads, "linear_num_value_heads": shape.linear_num_value_heads,
           "linear_value_head_dim": shape.linear_value_head_dim, "max_position_embeddings": shape.max_position,
           "model_type": "qwen3_5_text", "num_attention_heads": shape.num_heads,
           "num_hidden_layers": len(shape.layer_types), "num_key_value_heads": shape.num_kv_heads,
           "pad_token_id": None, "rms_norm_eps": shape.rms_eps,
           "rope_parameters": {"partial_rotary_factor": shape.partial_rotary_factor, "rope_theta": shape.rope_theta,
                               "rope_type": "default"},
           "tie_word_embeddings": True, "transformers_version": TRANSFORMERS_VERSION, "use_cache": True,
           "vocab_size": shape.vocab_size}
    cfg.update(extra_config or {})
    return cfg


def _json(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_qwen38_target(out_dir: Path, params: Mapping[str, torch.Tensor], tokenizer_json: str, *,
                        shape: Qwen38Shape | None = None, extra: Mapping[str, torch.Tensor] | None = None,
                        extra_config: Mapping | None = None, gguf_file: bool = True) -> list[Path]:
    """Write the HF directory ``out_dir`` and (``gguf_file``) ``out_dir``.gguf; returns the files written."""
    shape, out_dir = shape or Qwen38Shape(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_str(tokenizer_json)
    eot = tok.token_to_id(tokenizer_train.EOT)
    (out_dir / "config.json").write_text(_json(hf_config(shape, extra_config, eot)))
    (out_dir / "generation_config.json").write_text(_json({
        "bos_token_id": eot, "eos_token_id": eot, "do_sample": False, "transformers_version": TRANSFORMERS_VERSION}))
    (out_dir / "tokenizer_config.json").write_text(_json({
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": tokenizer_train.EOT,
        "pad_token": tokenizer_train.EOT, "model_max_length": shape.max_position,
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}))
    (out_dir / "tokenizer.json").write_text(tokenizer_json)
    tensors = {**params, **(extra or {})}
    write_safetensors(out_dir / "model.safetensors", tensors)
    files = [out_dir / n for n in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json")]
    if gguf_file:
        mtp = int((extra_config or {}).get("mtp_num_hidden_layers", 0))
        files.append(write_qwen38_gguf(out_dir.with_suffix(".gguf"), shape, tensors, tok, mtp, out_dir.name))
    return files


def _gguf_array(hf: str, t: torch.Tensor, shape: Qwen38Shape) -> torch.Tensor:
    """The converter's transform of one HF tensor, on the host: the +1 / -exp transforms in float64 on the stored
    values, the reshapes and value-head regroupings (exact permutations) in the tensor's own dtype."""
    hy, x = shape.spec({}).hybrid, t.detach().cpu()
    nk, nv, dv = hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_value_head_dim
    if baked_plus_one(hf):
        x = x.double() + 1.0
    if hf.endswith("linear_attn.A_log"):
        x = -torch.exp(x.double())
    if hf.endswith("conv1d.weight"):
        x = x.reshape(x.shape[0], x.shape[-1])
    if nk != nv and ".linear_attn." in hf:
        kd2 = 2 * hy.key_dim
        if hf.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            x = torch.cat([x[:kd2], regroup_v(x[kd2:], 0, nk, nv, dv, to_tiled=True)], 0)
        elif hf.endswith("in_proj_z.weight"):
            x = regroup_v(x, 0, nk, nv, dv, to_tiled=True)
        elif hf.endswith("out_proj.weight"):
            x = regroup_v(x, 1, nk, nv, dv, to_tiled=True)
        elif hf.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
            x = regroup_v(x, 0, nk, nv, 1, to_tiled=True)
    return x.float() if x.dtype == torch.float64 else x


def _planned(hf: str, tensors: Mapping[str, torch.Tensor], shape: Qwen38Shape, trunk: int) -> list[Planned]:
    """The GGUF tensor(s) of one HF tensor, each made (``_gguf_array``) only when written."""
    gname, dims = gguf_name(hf, trunk), tuple(tensors[hf].shape)

    def make() -> torch.Tensor:
        return _gguf_array(hf, tensors[hf], shape)

    if hf.endswith("mlp.experts.gate_up_proj"):                        # [E, 2ff, H] -> gate / up halves
        e, ff, h = dims[0], dims[1] // 2, dims[2]
        return [Planned(gname.replace("ffn_gate_up_exps", "ffn_gate_exps"), (e, ff, h), True,
                        lambda: make()[:, :ff]),
                Planned(gname.replace("ffn_gate_up_exps", "ffn_up_exps"), (e, ff, h), True, lambda: make()[:, ff:])]
    if hf.endswith("mlp.shared_expert_gate.weight"):                   # HF [1, H] -> {H}
        return [Planned(gname, (dims[-1],), False, lambda: make().reshape(-1))]
    if hf.endswith("conv1d.weight"):                                    # [C, 1, K] -> [C, K], F32
        return [Planned(gname, (dims[0], dims[-1]), False, make)]
    return [Planned(gname, dims, len(dims) >= 2, make)]


def write_qwen38_gguf(path: Path, shape: Qwen38Shape, tensors: Mapping[str, torch.Tensor], tok: Tokenizer | None,
                      mtp_layers: int = 0, name: str = "qwen38-tiny",
                      rope_sections: Sequence[int] | None = None, moe=None, dtype: str = "bf16") -> Path:
    """The target (and any ``mtp.*`` tensors) as a llama.cpp GGUF, arch "qwen35". Matrices BF16 (``dtype``: or
    f16 / f32); norms, the conv kernel, ssm_a and ssm_dt F32. ``tok=None``: no vocabulary
    (``export_gguf.write_vocab``). Written streamed (``export_gguf.write_streamed``): one tensor on the host at a
    time.

    ``qwen35.rope.dimension_sections``: llama.cpp rotates qwen35 heads with its interleaved multi-section rope
    (IMROPE): rotary pair i (of rotary_dim/2) takes position stream t / h / w / e by k = i mod sum(sections),
    t if k%3 == 0 and k < 3 s0, h if k%3 == 1 and k < 3 s1, w if k%3 == 2 and k < 3 s2, else e; text tokens
    carry t = h = w = position and e = 0, so a pair in e never rotates (``formats.rope_sections``). Written as
    llama.cpp's converter writes a Qwen3.5 text config without ``mrope_section``: [11, 11, 10, 0] (on the
    fixture's 4 pairs k = 0..3 -> t, h, w, t: every pair rotates, i.e. plain partial RoPE); heads under 32
    channels (test shapes, where llama.cpp would abort on that default) get the even interleave
    (``rope_sections.writer_sections``). The earlier [rotary_dim/2, 0, 0, 0] left pairs 1 and 2 unrotated in
    llama.cpp. ``rope_sections`` overrides the value (tests plant a bad layout with it).

    ``moe`` (a ``spec.MoEShape``): arch "qwen35moe" instead, with the expert keys, and each layer's MoE FFN as
    llama.cpp's converter writes a per-expert checkpoint: ffn_gate_inp, ffn_gate_exps / ffn_up_exps (the halves of
    HF's fused gate_up_proj), ffn_down_exps, ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp {H} (F32)."""
    L, types = len(shape.layer_types), shape.layer_types
    every = types.index("full_attention") + 1 if "full_attention" in types else L + 1
    if any((t == "full_attention") != ((i + 1) % every == 0) for i, t in enumerate(types)):
        raise ValueError(f"layer_types {list(types)} is not a full_attention_interval schedule; "
                         "llama.cpp's qwen35 loader reads only the interval")
    hy = shape.spec({}).hybrid
    w = gguf_header(path, "qwen35" if moe is None else "qwen35moe", name, L + mtp_layers, shape)
    if moe is not None:
        w.add_expert_count(moe.num_experts)
        w.add_expert_used_count(moe.top_k)
        w.add_expert_feed_forward_length(moe.expert_ff)
        if moe.shared_ff:
            w.add_expert_shared_feed_forward_length(moe.shared_ff)
    w.add_rope_dimension_count(hy.rotary_dim)
    sections = list(rope_sections) if rope_sections is not None else writer_sections(hy.rotary_dim, shape.head_dim)
    w.add_rope_dimension_sections(sections)
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    w.add_ssm_conv_kernel(shape.linear_conv_kernel_dim)
    w.add_ssm_state_size(shape.linear_key_head_dim)
    w.add_ssm_group_count(shape.linear_num_key_heads)
    w.add_ssm_time_step_rank(shape.linear_num_value_heads)
    w.add_ssm_inner_size(hy.value_dim)
    w.add_full_attention_interval(every)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    file_type(w, dtype)
    write_vocab(w, tok, shape.vocab_size)

    def order(hf: str) -> tuple:
        g = gguf_name(hf, L).split(".")
        return (g[0] == "blk", int(g[1]) if g[0] == "blk" else 0, ".".join(g))

    write_streamed(w, [p for hf in sorted(tensors, key=order) for p in _planned(hf, tensors, shape, L)], dtype)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".fixtures-work/qwen38-tiny"))
    ap.add_argument("--tokenizer", type=Path, default=Path("fixtures/tokenizer.json"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=900)            # ~0.3-0.4 s a step on 2 idle CPU cores
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    tjson = args.tokenizer.read_text()
    tok = Tokenizer.from_str(tjson)
    corp = corpus_mod.load_corpus()
    eot = tok.token_to_id(tokenizer_train.EOT)

    def stream(texts: list[str]) -> torch.Tensor:
        return torch.tensor([i for d in tokenizer_train.encode_docs(tok, texts) for i in (*d, eot)], dtype=torch.long)

    train, held = stream(corp.train_texts()), stream(corp.held_out_texts())
    print(f"corpus sha256 {corp.sha256[:16]}: train {train.numel()} tokens, held-out {held.numel()}", flush=True)
    shape = Qwen38Shape(vocab_size=tok.get_vocab_size())
    params, _, stats = train_qwen38_target(train, args.device, args.steps, args.seed, held=held, shape=shape,
                                           batch=args.batch, seq=args.seq)
    files = write_qwen38_target(args.out, params, tjson, shape=shape)
    stats["corpus_sha256"], stats["files"] = corp.sha256, [str(f) for f in files]
    args.out.with_suffix(".train_stats.json").write_text(_json(stats))
    print(json.dumps({k: stats[k] for k in ("train_seconds", "train_ce_last50", "held_out", "params")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
