"""Random checkpoints at a real model's size, in the real HF layout: what a user's hub download looks like.

    python -m bloomery_cli.fixturegen.real_layout qwen3-8b OUT [--layers N] [--device cuda]
    python -m bloomery_cli.fixturegen.real_layout qwen38-27b OUT --layers 16

writes, for ``qwen3-8b`` (Qwen3-8B: hidden 4096, 36 layers, 32/8 heads of 128, intermediate 12288, vocab
151936, untied head) ``OUT/target`` and a 5-layer z-lab DFlash-b16 drafter ``OUT/dflash-b16``; for
``qwen38-27b`` (the Qwen3.8-27B hybrid: hidden 5120, 64 layers of 3 Gated DeltaNet : 1 gated attention,
24/4 heads of 256, partial rotary 0.25, linear heads 16 key / 48 value of 128, conv 4, intermediate
17408, vocab 248320, its MTP head in-file) ``OUT/target`` and a 5-layer DFlash2 B=8 drafter
``OUT/dflash2-b8``; both with ``OUT/prompts.jsonl`` (random ids: no tokenizer is written).

The target is sharded as the hub does it (``model-0000i-of-0000n.safetensors``, at most ``--shard-gb``
each, plus ``model.safetensors.index.json``), with the config keys transformers writes. The tensor names
and shapes come from the readers' own tables (``formats.*.tensor_shapes``), so a file this writes is one
the gate reads. ``--layers`` keeps the real width with fewer layers (a disk or time limit; the layer
pattern is kept). Values: matrices N(0, 0.002^2), embedding and head rows N(0, 1), norms at their
identity (1, or 0 where stored zero-centred), DeltaNet A_log / dt_bias / conv as the fixtures initialise
them, DFlash2's conv at the identity. Random weights: the drafts accept next to nothing, so a gate's
``(b)`` both-branches check fails honestly on them; every (r) check and ``ids identical`` still apply.

One shard is held in memory at a time; a run leaves either the whole directory or nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from bloomery_cli.formats.dflash import backbone_shapes, default_target_layer_ids
from bloomery_cli.formats.dflash2 import conv_tensor_shapes, selector_tensor_shapes
from bloomery_cli.formats.mtp import mtp_shapes

from ..families.qwen3.reader import tensor_shapes as qwen3_shapes
from ..families.qwen38.fixture import Qwen38Shape, hf_config
from ..families.qwen38.reader import baked_plus_one
from ..families.qwen38.reader import tensor_shapes as qwen38_shapes
from .export_hf import draft_config, target_config
from .train import DraftShape, TargetShape
from .train_dflash2 import DFlash2Shape, dflash2_config, dflash2_spec

QWEN3_8B = TargetShape(4096, 36, 32, 8, 128, 12288, 151936, 1e-6, 1e6, 40960)
QWEN38_27B_PATTERN = ("linear_attention",) * 3 + ("full_attention",)


def qwen38_27b(layers: int = 64) -> Qwen38Shape:
    return Qwen38Shape(hidden_size=5120, layer_types=(QWEN38_27B_PATTERN * 16)[:layers], num_heads=24, num_kv_heads=4,
                       head_dim=256, intermediate_size=17408, vocab_size=248320, linear_num_key_heads=16,
                       linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4, partial_rotary_factor=0.25, rope_theta=1e7, max_position=262144)


def _value(name: str, shape: tuple[int, ...], gen: torch.Generator, dev: torch.device,
           zero_norms: bool) -> torch.Tensor:
    """One tensor's random value by its role (see the module docstring), bf16 on the CPU."""
    if name.endswith("norm.weight"):
        x = torch.zeros(shape) if zero_norms and baked_plus_one(name) else torch.ones(shape)
    elif name.endswith("A_log"):
        x = torch.log(1 + 15 * torch.rand(shape, generator=gen, device=dev))
    elif name.endswith("dt_bias"):
        x = torch.ones(shape)
    elif name.endswith("conv1d.weight"):
        x = (torch.rand(shape, generator=gen, device=dev) * 2 - 1) / math.sqrt(shape[-1])
    elif name.endswith("base_kernel"):
        x = torch.zeros(shape)
        x[:, 0] = 1.0
    elif name.endswith("kernel_projection.weight"):
        x = torch.zeros(shape)
    else:
        std = 1.0 if name.endswith(("embed_tokens.weight", "lm_head.weight")) else 0.002
        x = torch.randn(shape, generator=gen, device=dev).mul_(std)
    return x.to("cpu", torch.bfloat16).contiguous()


def _shards(names: list[str], shapes: dict, limit: int) -> list[list[str]]:
    out: list[list[str]] = [[]]
    size = 0
    for n in names:
        b = 2 * math.prod(shapes[n])
        if out[-1] and size + b > limit:
            out.append([])
            size = 0
        out[-1].append(n)
        size += b
    return out


def write_dir(out: Path, config: dict, shapes: dict, seed: int, dev: torch.device, zero_norms: bool,
              shard_bytes: int, progress=print) -> int:
    """config.json + sharded safetensors + index in ``out`` (written into ``out``.partial, then renamed).
    Returns the bytes of tensor data written."""
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    gen = torch.Generator(device=dev).manual_seed(seed)
    groups = _shards(list(shapes), shapes, shard_bytes)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: _value(n, shapes[n], gen, dev, zero_norms) for n in group}
        save_file(tensors, str(work / fname), metadata={"format": "pt"})
        size = sum(t.numel() * 2 for t in tensors.values())
        total += size
        weight_map.update(dict.fromkeys(group, fname))
        progress(f"  {out.name}/{fname}: {len(group)} tensors, {size / 1e9:.2f} GB")
        del tensors
    if len(groups) > 1:
        (work / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    (work / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return total


def _plain(shapes: dict) -> dict[str, tuple[int, ...]]:
    return {n: tuple(s) for n, (s, _why) in shapes.items()}


def qwen3_8b_pair(layers: int) -> Iterator[tuple[str, dict, dict, bool]]:
    t = replace(QWEN3_8B, num_layers=layers)
    tcfg = {**target_config(t), "tie_word_embeddings": False}
    yield "target", tcfg, _plain(qwen3_shapes(t.layer(), layers, t.vocab_size, False)), False
    d = DraftShape(5, 16, default_target_layer_ids(5, layers), t.vocab_size - 1)
    dshapes = backbone_shapes(t.hidden_size, len(d.target_layer_ids), d.num_layers, t.layer())
    yield "dflash-b16", draft_config(t, d), _plain(dshapes), False


def qwen38_27b_pair(layers: int) -> Iterator[tuple[str, dict, dict, bool]]:
    s = qwen38_27b(layers)
    spec = s.spec({}, mtp_layers=1)
    shapes = {**_plain(qwen38_shapes(spec.layer, spec.hybrid, layers, s.vocab_size, False)), **_plain(mtp_shapes(spec))}
    yield "target", hf_config(s, {"tie_word_embeddings": False, "mtp_num_hidden_layers": 1}), shapes, True
    t = TargetShape(s.hidden_size, layers, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
                    s.vocab_size, s.rms_eps, s.rope_theta, s.max_position)
    d = DFlash2Shape(num_layers=5, block_size=8, target_layer_ids=default_target_layer_ids(5, layers),
                     mask_token_id=s.vocab_size - 1)
    dspec = dflash2_spec(t, d, {})
    dshapes = _plain(backbone_shapes(t.hidden_size, len(d.target_layer_ids), d.num_layers, t.layer()))
    for i in range(d.num_layers):
        dshapes.update(_plain(conv_tensor_shapes(f"layers.{i}.", d.conv_kernel_size, t.hidden_size, d.conv_group_size)))
    dshapes.update(_plain(selector_tensor_shapes(t.vocab_size, t.hidden_size, d.selector_rank)))
    yield "dflash2-b8", dflash2_config(t, dspec), dshapes, False


PAIRS = {"qwen3-8b": (qwen3_8b_pair, 36), "qwen38-27b": (qwen38_27b_pair, 64)}


def write_prompts(path: Path, vocab: int, count: int, length: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    lines = [json.dumps({"ids": torch.randint(0, vocab - 2, (length,), generator=gen).tolist()}) for _ in range(count)]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(PAIRS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=None, help="target layers (default: the real count)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    a = ap.parse_args(argv)
    make, full = PAIRS[a.shape]
    layers = a.layers or full
    if not 1 <= layers <= full:
        ap.error(f"--layers {layers}: expected 1..{full}")
    a.out.mkdir(parents=True, exist_ok=True)
    vocab = 0
    for k, (name, cfg, shapes, zero_norms) in enumerate(make(layers)):
        vocab = vocab or int(cfg["vocab_size"])
        n = write_dir(a.out / name, cfg, shapes, a.seed + k, torch.device(a.device), zero_norms,
                      int(a.shard_gb * 1e9))
        print(f"{a.out / name}: {n / 1e9:.2f} GB of bf16 tensors, {len(shapes)} tensors")
    write_prompts(a.out / "prompts.jsonl", vocab, a.prompts, a.prompt_len, a.seed)
    print(f"{a.out / 'prompts.jsonl'}: {a.prompts} prompts of {a.prompt_len} random ids")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
