"""The fixture drafters again in the speculators layout (same weights), for the speculators readers' gates.

    python -m bloomery_cli.fixturegen.speculators_layout --out fixtures

Converts, as speculators' own ``DFlashConverter`` does (speculators 0.9.0, ``convert/dflash/converter.py``):

    qwen3-tiny-dflash-b8   (z-lab)    -> qwen3-tiny-dflash-b8-speculators   speculators_model_type "dflash"
    qwen3-tiny-dflash2-b8  (z-lab)    -> qwen3-tiny-dflash2-b8-speculators  "dflash2"
    qwen3-tiny-dspark-b7   (DeepSpec) -> qwen3-tiny-dspark-b7-speculators   "dspark", markov_head_type "vanilla"

config.json: ``transformer_layer_config`` = the source config's Qwen3 keys (everything but the drafter keys, as
the converter's ``_NON_TRANSFORMER_KEYS``), ``aux_hidden_state_layer_ids`` = target_layer_ids + 1 (z-lab and
DeepSpec read HF ``hidden_states[l + 1]``, speculators the index itself), ``draft_vocab_size`` = the target
vocab (full vocabulary, no d2t / t2d), the kind's keys under speculators' names, and the bookkeeping
``save_pretrained`` writes (architectures, speculators_config with a greedy proposal of the block's drafts
and the verifier's name, speculators_version, target_hidden_size null). model.safetensors: the source file
byte for byte (the tensor names are speculators' already; the verifier-owned tensors speculators leaves out
when saving, embed_tokens / lm_head / verifier_*, are not in the source either). The conversion refuses a
source whose keys speculators has no name for (a DFlash2 output_multiplier, input_embedding_scale or
final_logit_softcapping other than the neutral value). Each written folder is read back through the
harness's speculators reader and must give the source reader's spec: the same numbers and equal tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from .install import MAX_FIXTURE_BYTES
from .manifest import Manifest, sha256_file, verified

SOURCES = {"dflash": "qwen3-tiny-dflash-b8", "dflash2": "qwen3-tiny-dflash2-b8", "dspark": "qwen3-tiny-dspark-b7"}
TARGET = "qwen3-tiny"
SUFFIX = "-speculators"
WRITTEN_FOR = "0.9.0"
ARCHITECTURES = {"dflash": "DFlashSpeculator", "dflash2": "DFlash2DraftModel", "dspark": "DSparkSpeculator"}
MAX_TOTAL_BYTES = MAX_FIXTURE_BYTES
# keys of the z-lab / DeepSpec configs that are not the draft stack's Qwen3 config
DRAFTER_KEYS = ("architectures", "auto_map", "block_size", "dflash_config", "dspark_config", "num_target_layers",
                "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov")
NEUTRAL_DFLASH2 = {"output_multiplier": 1.0, "input_embedding_scale": 1.0, "final_logit_softcapping": None}


def speculators_dir(kind: str) -> str:
    return SOURCES[kind] + SUFFIX


def speculators_config(kind: str, src: dict[str, Any], spec, target, verifier: str,
                       verifier_arch: str = "Qwen3ForCausalLM") -> dict[str, Any]:
    """The speculators config.json for ``spec`` (read from the source folder whose config is ``src``)."""
    dcfg = src.get("dflash_config") or {}
    if kind == "dflash2":
        for key, neutral in NEUTRAL_DFLASH2.items():
            got = dcfg.get(key, src.get(key, neutral))
            if got != neutral:
                raise ValueError(f"dflash_config.{key} = {got!r}: speculators' DFlash2 has no such key; only "
                                 f"{neutral!r} converts")
    tl = {k: v for k, v in src.items() if k not in DRAFTER_KEYS}
    anchor = kind == "dspark"
    drafts = spec.block_size if anchor else spec.block_size - 1
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[kind]],
        "aux_hidden_state_layer_ids": [l + 1 for l in spec.target_layer_ids],
        "block_size": spec.block_size,
        "draft_vocab_size": target.vocab_size,
        "mask_token_id": spec.mask_token_id,
        "sample_from_anchor": anchor,
        "sliding_window_non_causal": kind == "dflash2",       # speculators' per-kind default (no sliding layers)
        "speculators_config": {
            "algorithm": kind, "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": drafts,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": [verifier_arch], "name_or_path": verifier},
        },
        "speculators_model_type": kind,
        "speculators_version": WRITTEN_FOR,
        "target_hidden_size": None,
        "transformer_layer_config": tl,
    }
    if kind == "dflash2":
        cfg.update({"conv_kernel_size": spec.conv_kernel_size, "conv_group_size": spec.conv_group_size,
                    "selector_rank": spec.selector_rank, "selector_top_k": spec.selector_top_k})
    if kind == "dspark":
        if spec.markov_head_type != "vanilla":
            raise ValueError(f"markov_head_type {spec.markov_head_type!r}: only vanilla converts")
        cfg.update({"markov_rank": spec.markov_rank, "markov_head_type": "vanilla",
                    "enable_confidence_head": spec.confidence,
                    "confidence_head_with_markov": spec.confidence and spec.markov_rank > 0})
    return cfg


def same_spec(a, b) -> list[str]:
    """Fields (other than source and tensors) where two specs differ, then tensors that differ."""
    diff = [f.name for f in fields(a)
            if f.name not in ("source", "tensors") and getattr(a, f.name) != getattr(b, f.name)]
    if set(a.tensors) != set(b.tensors):
        diff.append(f"tensor names {sorted(set(a.tensors) ^ set(b.tensors))}")
    diff += [k for k in a.tensors if k in b.tensors and not torch.equal(a.tensors[k], b.tensors[k])]
    return diff


def convert(kind: str, fixtures: Path, work: Path) -> tuple[list[Path], dict[str, Any]]:
    """Write ``speculators_dir(kind)`` under ``work`` from ``fixtures``; returns (files, manifest model entry)."""
    from bloomery_cli import loading

    load = {"dflash": loading.load_dflash, "dflash2": loading.load_dflash2, "dspark": loading.load_dspark}[kind]
    target = loading.load_target(fixtures / TARGET)
    src_dir, out = fixtures / SOURCES[kind], work / speculators_dir(kind)
    src_spec = load(src_dir, target)
    src_cfg = json.loads((src_dir / "config.json").read_text())
    cfg = speculators_config(kind, src_cfg, src_spec, target, f"fixtures/{TARGET}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(src_dir / "model.safetensors", out / "model.safetensors")
    files = [out / "config.json", out / "model.safetensors"]
    for f in files:
        os.chmod(f, 0o644)
    back = load(out, target)
    diff = same_spec(src_spec, back)
    if diff:
        raise RuntimeError(f"{out} does not read back as {src_dir}: {diff}")
    name = speculators_dir(kind)
    entry = {"files": [f"{name}/model.safetensors", f"{name}/config.json"], "kind": kind, "layout": "speculators",
             "architecture": ARCHITECTURES[kind], "speculators_version": WRITTEN_FOR, "target": TARGET,
             "converted_from": SOURCES[kind],
             "weights": f"{SOURCES[kind]}/model.safetensors byte for byte "
                        f"(sha256 {sha256_file(src_dir / 'model.safetensors')[:16]}...)",
             "aux_hidden_state_layer_ids": cfg["aux_hidden_state_layer_ids"],
             "read_back": "the speculators reader gives the source reader's spec (numbers and tensors equal)",
             "made_by": {"command": "python -m bloomery_cli.fixturegen.speculators_layout --out fixtures",
                         "builder": "bloomery_cli.fixturegen.speculators_layout"}}
    return files, entry


def build(fixtures: Path, kinds: tuple[str, ...] = tuple(SOURCES)) -> Manifest:
    """Convert ``kinds`` and add them to ``fixtures``' manifest (every other entry untouched)."""
    fixtures = Path(fixtures)
    work = fixtures.resolve().parent / ".fixtures-work" / f"{fixtures.resolve().name}-speculators"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    man = Manifest.read(fixtures)
    for kind in kinds:
        files, entry = convert(kind, fixtures, work)
        name = speculators_dir(kind)
        man.files = {k: v for k, v in man.files.items() if k.split("/")[0] != name}
        dst = fixtures / name
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(work / name, dst)
        man.add_files(fixtures, [dst / f.name for f in files])
        man.models[name] = entry
    if man.stored_bytes > MAX_TOTAL_BYTES:
        raise RuntimeError(f"fixtures store {man.stored_bytes} distinct bytes, over the {MAX_TOTAL_BYTES} limit")
    man.write(fixtures)
    shutil.rmtree(work, ignore_errors=True)
    verified(fixtures, "speculators conversion")
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.fixturegen.speculators_layout",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    ap.add_argument("--kinds", nargs="+", choices=list(SOURCES), default=list(SOURCES))
    a = ap.parse_args(argv)
    man = build(a.out, tuple(a.kinds))
    print(f"speculators layout: {', '.join(speculators_dir(k) for k in a.kinds)}; fixtures total "
          f"{man.total_bytes} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
