"""The ds4-dspark fixture: a DSV4 DSpark draft (llama.cpp's GGUF arch "dflash", docs/FAMILIES_MOE.md 5.1) distilled
from the frozen ds4-tiny target, written as ``fixtures/ds4-tiny-dspark-b7.gguf``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek4.fixture_dspark --out fixtures      # a few minutes

Draft: 2 DSV4 stages (window-only attention W 16, 4 mHC streams, 8 experts top-2 sqrt-softplus + the shared
expert, the trunk's shapes), B 7 (anchor-first: 7 drafts), features the hc-stream mean ENTERING target layers 2
and 4 (``dflash.target_layers`` [2, 4]: the DSpark ids [1, 3]), Markov rank 16, a confidence head; no token_embd /
output (the target's are borrowed); the target's tokenizer keys and ``dflash.context_length``, as llama.cpp's
converter writes them, so llama.cpp's dflash loader takes the file as is. Warm start: stage attention / mHC from the
target's layer 0 (sliding), the MoE from its layer 1 (non-hash), the HC head and the final norm from the target's,
fc = [I/2 | I/2] (the mean of the two features), markov_w1 N(0, 0.02), markov_w2 and the confidence head zeros.

Data: the target's greedy continuations (``fixture.greedy_rows``: a real 32-token prefix, greedy to 112 tokens)
and real corpus windows, the frozen f32 engine's taps. Loss per block (the dense DSpark fixture's,
``fixturegen.train_dspark``): row k labelled with the target's argmax at s+k, weights exp(-k / gamma)
normalised, Markov inputs teacher-forced (prev_0 = x_s, prev_k = label_{k-1}), + 0.5 BCE of the confidence against
[argmax == label]. Stored bf16 values as F32 tensors (read back exactly); norms, mixes, sinks stay float32-exact.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ...fixturegen.family_kit import fixture_main, load_tokenizer
from ...fixturegen.train import Reporter, TrainConfig
from .dspark_distill import DSparkFixture, DSparkFixtureConfig, distill, publish, stage_attn

TARGET, B, RANK, STAGES = "ds4-tiny", 7, 16, 2
NAME = f"ds4-tiny-dspark-b{B}"
GGUF = NAME + ".gguf"
TARGET_IDS = (1, 3)                    # DSpark config ids; the file's dflash.target_layers = ids + 1
CONTEXT = 1024                         # dflash.context_length (llama.cpp's loader requires it): the target's
FIXTURE = DSparkFixture(NAME, TARGET, "bloomery_cli.families.deepseek4.fixture_dspark", "ds4 dspark",
                        "GGUF dflash (llama.cpp's DSV4 DSpark, hyper_connection.count 4)", STAGES, B, RANK, TARGET_IDS)


CONFIG = DSparkFixtureConfig(seed=4321, pool=32, real=32, prefix=32, seq=112, anchors=8,
                             train=TrainConfig(steps=500, batch=4, seq=112, lr=3e-3, warmup=40, log_every=50))


def draft_spec(target, tensors: dict):
    """The draft's spec (the same numbers the GGUF states) over ``tensors``."""
    from bloomery_gates.spec import Deepseek4DSparkSpec

    attn = stage_attn(target.attn)
    mask = target.vocab_size - 1
    return Deepseek4DSparkSpec(kind="deepseek4-dspark", source=Path(GGUF), source_format="gguf", num_layers=STAGES,
                               block_size=B, target_layer_ids=TARGET_IDS, mask_token_id=mask, markov_rank=RANK,
                               confidence=True, collapse="hc_head", vocab_size=target.vocab_size, layer=target.layer,
                               attn=attn, moe=target.moe, hc=target.hc, swiglu_limit=target.swiglu_limit,
                               tensors=tensors)


def init_params(target, seed: int) -> dict[str, torch.Tensor]:
    t, h, out = target.tensors, target.hidden_size, {}
    for i in range(STAGES):
        for pre, keep in (("model.layers.0.", ("self_attn.", "attn_hc.", "ffn_hc.", "input_layernorm",
                                               "post_attention_layernorm")), ("model.layers.1.", ("mlp.",))):
            out |= {f"layers.{i}." + n[len(pre):]: v.float().clone() for n, v in t.items()
                    if n.startswith(pre) and n[len(pre):].startswith(keep) and ".compressor." not in n}
    out |= {"hc_head." + k: t["model.hc_head." + k].float().clone() for k in ("hc_fn", "hc_base", "hc_scale")}
    out["norm.weight"] = t["model.norm.weight"].float().clone()
    out["enc_norm.weight"] = torch.ones(h)
    out["fc.weight"] = torch.cat([torch.eye(h), torch.eye(h)], 1) / 2
    g = torch.Generator().manual_seed(seed)
    out["markov_head.markov_w1.weight"] = 0.02 * torch.randn(target.vocab_size, RANK, generator=g)
    out["markov_head.markov_w2.weight"] = torch.zeros(target.vocab_size, RANK)
    out["confidence_head.proj.weight"] = torch.zeros(1, h + RANK)
    out["confidence_head.proj.bias"] = torch.zeros(1)
    return out


def write_gguf(path: Path, spec, w: dict[str, torch.Tensor], tok=None, put=None, extra=()) -> None:
    """The llama.cpp converter's DSV4 DSpark layout (keys and names as ``reader_dspark`` reads them), F32 tensors
    (or as ``put(writer, gguf_name, array)`` stores them); with ``tok`` the target's tokenizer keys (the
    converter's ``set_vocab`` from ``--target-model-dir``: llama.cpp loads a vocabulary for every model, the draft
    included); ``extra`` more (key, uint32) pairs under ``dflash.`` (the V4.1 DSpark's, FAMILIES_MOE.md 5.2)."""
    import gguf

    from ...fixturegen.export_gguf import write_tokenizer
    from .reader_dspark import BLOCK, ROOT

    a, m, n = spec.attn, spec.moe, spec.num_layers
    wr = gguf.GGUFWriter(str(path), "dflash")
    A = "dflash."
    for k, v in (("block_count", n), ("context_length", CONTEXT), ("embedding_length", spec.hidden_size),
                 ("attention.head_count", a.num_heads),
                 ("attention.head_count_kv", 1), ("attention.key_length", a.head_dim),
                 ("attention.value_length", a.head_dim), ("rope.dimension_count", a.rope_dim),
                 ("attention.q_lora_rank", a.q_lora_rank), ("attention.sliding_window", a.window),
                 ("attention.output_group_count", a.o_groups), ("attention.output_lora_rank", a.o_lora_rank),
                 ("expert_count", m.num_experts), ("expert_used_count", m.top_k),
                 ("expert_feed_forward_length", m.expert_ff), ("expert_shared_count", 1), ("expert_gating_func", 4),
                 ("hyper_connection.count", spec.hc.count),
                 ("hyper_connection.sinkhorn_iterations", spec.hc.sinkhorn_iters), ("block_size", spec.block_size),
                 *extra):
        wr.add_uint32(A + k, v)
    for k, v in (("rope.freq_base", a.rope_theta), ("attention.layer_norm_rms_epsilon", spec.layer.rms_eps),
                 ("expert_weights_scale", m.routed_scale), ("hyper_connection.epsilon", spec.hc.eps)):
        wr.add_float32(A + k, v)
    wr.add_bool(A + "expert_weights_norm", True)
    wr.add_array(A + "attention.compress_ratios", [0] * n)
    wr.add_array(A + "swiglu_clamp_exp", [float(spec.swiglu_limit)] * n)
    wr.add_array(A + "swiglu_clamp_shexp", [float(spec.swiglu_limit)] * n)
    wr.add_array(A + "target_layers", [x + 1 for x in spec.target_layer_ids])
    if tok is not None:
        write_tokenizer(wr, tok, pad=False)
    wr.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)
    put = put or (lambda wr, g, x: wr.add_tensor(g, np.ascontiguousarray(x)))
    back = {v: k for k, v in ROOT.items()}
    blk = {v: k for k, v in BLOCK.items()}
    for name, x in w.items():
        x = x.float().numpy()
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            if rest == "mlp.experts.gate_up_proj":
                ff = x.shape[1] // 2
                put(wr, f"blk.{i}.ffn_gate_exps.weight", x[:, :ff])
                put(wr, f"blk.{i}.ffn_up_exps.weight", x[:, ff:])
                continue
            if rest == "self_attn.o_a_proj.weight":
                x = x.reshape(a.o_groups, a.o_lora_rank, -1)
            put(wr, f"blk.{i}.{blk[rest]}", x)
        else:
            put(wr, back[name], x)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def build(out_dir: Path, quick: bool = False, progress=None, config: DSparkFixtureConfig | None = None) -> Path:
    from bloomery_gates.kernels.families.deepseek4.model import Deepseek4Target

    from .reader import deepseek4_from_hf
    from .reader_dspark import deepseek4_dspark_from_gguf

    t0, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (CONFIG.quick() if quick else CONFIG)
    tok, _, _ = load_tokenizer(out_dir)
    from tokenizers import Tokenizer

    ttok = Tokenizer.from_file(str(out_dir / TARGET / "tokenizer.json"))
    rep = Reporter(progress, every=cfg.train.log_every)
    target = deepseek4_from_hf(out_dir / TARGET)
    d = distill(FIXTURE, cfg, quick, tok, rep, lambda: Deepseek4Target(target, "cpu", torch.float32, cfg.seq + 8),
                lambda seed: init_params(target, seed), draft_spec(target, {}))
    return publish(out_dir, FIXTURE, d, lambda tmp: write_gguf(tmp, draft_spec(target, d.stored), d.stored, ttok),
                   lambda tmp: deepseek4_dspark_from_gguf(tmp, target).tensors, target.attn.window, quick, cfg.seed,
                   t0, rep)


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.deepseek4.fixture_dspark", __doc__, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
