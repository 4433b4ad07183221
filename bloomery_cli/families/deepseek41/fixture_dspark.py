"""The ds41-dspark fixture: the seed engine's V4.1 DSpark draft (docs/FAMILIES_MOE.md 5.2) distilled from the frozen
ds41-tiny target, written as ``fixtures/ds41-tiny-dspark-b7.gguf``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek41.fixture_dspark --out fixtures      # a few minutes

Draft: 1 V4.1 stage (window-only attention W 16 without the per-head q norm, lagged HC mixes over 4 streams,
6 experts top-2 sqrt-softplus + the shared expert: the trunk's shapes), the LastMix collapse (no ``output_hc_*``),
B 7 (anchor-first), features the hc-stream mean of the S streams ENTERING target layers 2 and 4 (the taps' lag
row dropped; ``dflash.target_layers`` [2, 4]), Markov rank 4, a confidence head without a bias (the seed's
``conf_proj``); no token_embd / output (the target's). Keys: the 5.1 set written by
``deepseek4.fixture_dspark.write_gguf`` plus ``hash_layer_count`` 0 and ``vocab_size``.
Types (``reader_dspark.type_of``): the F32 group F32, every other matrix BF16 (the Q8_0 / MXFP4 ones widened: the
tiny shapes' rows of 24 are not Q8_0 / MXFP4 blocks of 32). Size: ~0.2 MB (the fixtures cap leaves ~0.4 MB).

Warm start: the stage's attention / mHC / norms from the target's layer 0 (window-only), its MoE from layer 1,
the final norm from the target's, fc = [I/2 | I/2], markov_w1 N(0, 0.02), markov_w2 and the confidence head
zeros. Data and loss: ``deepseek4.fixture_dspark``'s (the target's greedy continuations and corpus windows, the
frozen f32 engine's taps; block CE weighted exp(-k / gamma), Markov inputs teacher-forced, + 0.5 BCE of the
confidence): ``deepseek4.dspark_distill``'s ``distill`` / ``publish``, shared with the ds4 builder.
"""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import torch

from ...fixturegen.family_kit import fixture_main, load_tokenizer
from ...fixturegen.train import Reporter, TrainConfig
from ..deepseek4.dspark_distill import DSparkFixture, DSparkFixtureConfig, distill, publish, stage_attn
from ..deepseek4.fixture_dspark import write_gguf
from .reader_dspark import type_of

TARGET, B, RANK, STAGES = "ds41-tiny", 7, 4, 1
TARGET_FILE = Path(TARGET) / "ds41-tiny.gguf"
NAME = f"ds41-tiny-dspark-b{B}"
GGUF = NAME + ".gguf"
TARGET_IDS = (1, 3)                    # DSpark config ids; dflash.target_layers = ids + 1
MAX_DRAFT_BYTES = 350_000              # the brief's budget for this file (the fixtures cap is nearly full)
FIXTURE = DSparkFixture(NAME, TARGET, "bloomery_cli.families.deepseek41.fixture_dspark", "ds41 dspark",
                        "GGUF dflash in the seed engine's V4.1 DSpark layout (FAMILIES_MOE.md 5.2: lagged HC, "
                        "LastMix, no output_hc_*, no q head norm)", STAGES, B, RANK, TARGET_IDS)


CONFIG = DSparkFixtureConfig(seed=4141, pool=16, real=16, prefix=32, seq=96, anchors=8,
                             train=TrainConfig(steps=300, batch=4, seq=96, lr=3e-3, warmup=30, log_every=50))


def draft_spec(target, tensors: dict):
    """The draft's spec (the same numbers the GGUF states) over ``tensors``."""
    from bloomery_gates.spec import Deepseek41DSparkSpec

    attn = stage_attn(target.attn)
    return Deepseek41DSparkSpec(kind="deepseek41-dspark", source=Path(GGUF), source_format="gguf",
                                num_layers=STAGES, block_size=B, target_layer_ids=TARGET_IDS,
                                mask_token_id=target.vocab_size - 1, markov_rank=RANK, confidence=True,
                                collapse="last_mix", vocab_size=target.vocab_size, layer=target.layer, attn=attn,
                                moe=target.moe, hc=target.hc, swiglu_limit=target.swiglu_limit, tensors=tensors)


def init_params(target, seed: int) -> dict[str, torch.Tensor]:
    t, h, out = target.tensors, target.hidden_size, {}
    for i in range(STAGES):
        for pre, keep in (("model.layers.0.", ("self_attn.", "attn_hc.", "ffn_hc.", "input_layernorm",
                                               "post_attention_layernorm")), ("model.layers.1.", ("mlp.",))):
            out |= {f"layers.{i}." + n[len(pre):]: v.float().clone() for n, v in t.items()
                    if n.startswith(pre) and n[len(pre):].startswith(keep) and ".compressor." not in n
                    and ".indexer." not in n}
    out["norm.weight"] = t["model.norm.weight"].float().clone()
    out["enc_norm.weight"] = torch.ones(h)
    out["fc.weight"] = torch.cat([torch.eye(h), torch.eye(h)], 1) / 2
    g = torch.Generator().manual_seed(seed)
    out["markov_head.markov_w1.weight"] = 0.02 * torch.randn(target.vocab_size, RANK, generator=g)
    out["markov_head.markov_w2.weight"] = torch.zeros(target.vocab_size, RANK)
    out["confidence_head.proj.weight"] = torch.zeros(1, h + RANK)        # no bias: the seed's conf_proj has none
    return out


def put(wr: gguf.GGUFWriter, name: str, x: np.ndarray) -> None:
    """F32 where the 5.2 table says F32 (and 1-D tensors), else BF16 (exact: the values are bf16-rounded)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type_of(name) == "F32" or x.ndim < 2:
        wr.add_tensor(name, x)
        return
    raw = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8)
    wr.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)


def extra_keys(spec) -> tuple[tuple[str, int], ...]:
    """The 5.2 keys beyond the 5.1 set ``write_gguf`` writes."""
    return ("hash_layer_count", 0), ("vocab_size", spec.vocab_size)


def write_ds41_dspark(path: Path, spec, w: dict[str, torch.Tensor]) -> None:
    write_gguf(path, spec, w, put=put, extra=extra_keys(spec))


def build(out_dir: Path, quick: bool = False, progress=None, config: DSparkFixtureConfig | None = None) -> Path:
    from bloomery_gates.kernels.families.deepseek41.model import Deepseek41Target

    from .reader_dspark import deepseek41_dspark_from_gguf
    from .reader_gguf import deepseek41_from_gguf

    t0, out_dir = time.perf_counter(), Path(out_dir)
    cfg = config or (CONFIG.quick() if quick else CONFIG)
    tok, _, _ = load_tokenizer(out_dir)
    rep = Reporter(progress, every=cfg.train.log_every)
    target = deepseek41_from_gguf(out_dir / TARGET_FILE)
    d = distill(FIXTURE, cfg, quick, tok, rep, lambda: Deepseek41Target(target, "cpu", torch.float32, cfg.seq + 8),
                lambda seed: init_params(target, seed), draft_spec(target, {}))
    return publish(out_dir, FIXTURE, d, lambda tmp: write_ds41_dspark(tmp, draft_spec(target, d.stored), d.stored),
                   lambda tmp: deepseek41_dspark_from_gguf(tmp, target).tensors, target.attn.window, quick, cfg.seed,
                   t0, rep, max_bytes=MAX_DRAFT_BYTES)


def main(argv: list[str] | None = None) -> int:
    return fixture_main("bloomery_cli.families.deepseek41.fixture_dspark", __doc__, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
