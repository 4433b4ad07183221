"""The yarn-RoPE target and the sliding-window DFlash drafter fixtures, from the trained qwen3 fixtures.

    python -m bloomery_cli.fixturegen.rope_swa --out fixtures

No training: each new folder is an existing folder's ``model.safetensors`` byte for byte with a config that
switches the feature on, so the gate exercises the feature on honestly trained weights (the drafter was
distilled under plain RoPE / full attention, so its acceptance drops; it is printed, never pinned):

    qwen3yarn-tiny            qwen3-tiny's weights and tokenizer; rope_scaling yarn, factor 4,
                              original_max_position_embeddings 128 (below prompt + 256 generated positions),
                              max_position_embeddings 512 = factor x original (what transformers expects)
    qwen3yarn-tiny-dflash-b8  qwen3-tiny-dflash-b8's weights; the same yarn in its config (the draft's own RoPE)
    qwen3-tiny-dflash-b8-swa  qwen3-tiny-dflash-b8's weights; layer_types both "sliding_attention",
                              sliding_window 16 (the prompts are 40-60 tokens, so the window cuts from the
                              first block on): vLLM's rule, p - W < j <= p (``formats.sliding``)
    qwen3-tiny-dflash-b8-swa-speculators
                              the same in the speculators layout (``fixturegen.speculators_layout``'s
                              conversion; sliding_window_non_causal false): speculators' rule, the W context
                              rows before the block start and the block causally, so its acceptance differs

Each written folder is read back through the harness's readers and must give the source's tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from .install import MAX_FIXTURE_BYTES, clean_work, fresh_work
from .manifest import Manifest, sha256_file, verified

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
YARN_MAX_POSITION = 512
WINDOW = 16
COMMAND = "python -m bloomery_cli.fixturegen.rope_swa --out fixtures"
# new folder -> (source folder, config edits, kind)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "qwen3yarn-tiny": ("qwen3-tiny", {"rope_scaling": YARN, "max_position_embeddings": YARN_MAX_POSITION}, "target"),
    "qwen3yarn-tiny-dflash-b8": ("qwen3-tiny-dflash-b8",
                                 {"rope_scaling": YARN, "max_position_embeddings": YARN_MAX_POSITION}, "dflash"),
    "qwen3-tiny-dflash-b8-swa": ("qwen3-tiny-dflash-b8",
                                 {"layer_types": ["sliding_attention", "sliding_attention"], "sliding_window": WINDOW},
                                 "dflash"),
}
SPECULATORS = "qwen3-tiny-dflash-b8-swa-speculators"
VARIANTS[SPECULATORS] = ("qwen3-tiny-dflash-b8-swa", {"speculators_model_type": "dflash"}, "dflash")
TARGET_OF = {"qwen3yarn-tiny-dflash-b8": "qwen3yarn-tiny", "qwen3-tiny-dflash-b8-swa": "qwen3-tiny",
             SPECULATORS: "qwen3-tiny"}


def write_variant(name: str, fixtures: Path, work: Path) -> list[Path]:
    """Copy the source folder's files into ``work/name`` with the config edited."""
    src_name, edits, _ = VARIANTS[name]
    src, out = fixtures / src_name, work / name
    if name == SPECULATORS:
        return write_speculators(work / src_name, fixtures, out)
    out.mkdir(parents=True)
    files = []
    for f in sorted(src.iterdir()):
        dst = out / f.name
        if f.name == "config.json":
            cfg = json.loads(f.read_text())
            cfg.update(edits)
            dst.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(f, dst)
        os.chmod(dst, 0o644)
        files.append(dst)
    return files


def write_speculators(src: Path, fixtures: Path, out: Path) -> list[Path]:
    """``src`` (the z-lab-layout SWA drafter just written) converted as ``speculators_layout`` converts."""
    from bloomery_cli import loading

    from .speculators_layout import speculators_config

    target = loading.load_target(fixtures / "qwen3-tiny")
    cfg = speculators_config("dflash", json.loads((src / "config.json").read_text()), loading.load_dflash(src, target),
                             target, "fixtures/qwen3-tiny")
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
    files = [out / "config.json", out / "model.safetensors"]
    for f in files:
        os.chmod(f, 0o644)
    return files


def read_back(name: str, fixtures: Path, work: Path) -> None:
    """The folder must read through the harness's reader with the source's tensors and the edit in its spec."""
    from bloomery_cli import loading

    src_name, _, kind = VARIANTS[name]
    def where(n: str) -> Path:
        return work / n if (work / n).exists() else fixtures / n
    if kind == "target":
        got, want = loading.load_target(work / name), loading.load_target(fixtures / src_name)
        if got.layer.rope_scaling is None or got.layer.rope_scaling.kind != "yarn":
            raise RuntimeError(f"{name}: the reader did not take the yarn RoPE")
    else:
        target = loading.load_target(where(TARGET_OF[name]))
        got = loading.load_dflash(work / name, target)
        want = loading.load_dflash(where(src_name), loading.load_target(fixtures / "qwen3-tiny"))
        rule = {"qwen3-tiny-dflash-b8-swa": "query", SPECULATORS: "anchor"}.get(name)
        if rule and (got.windows, got.window_rule) != ((WINDOW, WINDOW), rule):
            raise RuntimeError(f"{name}: the reader gave windows {got.windows} ({got.window_rule})")
    bad = [k for k in want.tensors if k not in got.tensors or not torch.equal(want.tensors[k], got.tensors[k])]
    if bad or set(got.tensors) != set(want.tensors):
        raise RuntimeError(f"{name} does not read back with {src_name}'s tensors: {bad}")


def entry(name: str, fixtures: Path) -> dict[str, Any]:
    src_name, edits, kind = VARIANTS[name]
    return {"files": sorted(f"{name}/{f.name}" for f in (fixtures / name).iterdir()), "kind": kind,
            "derived_from": src_name,
            **({"layout": "speculators", "converted_by": "fixturegen.speculators_layout.speculators_config",
                "window_rule": "speculators (sliding_window_non_causal false)"} if name == SPECULATORS
               else {"config_edits": edits}),
            "weights": f"{src_name}/model.safetensors byte for byte "
                       f"(sha256 {sha256_file(fixtures / src_name / 'model.safetensors')[:16]}...); not retrained",
            **({"target": TARGET_OF[name]} if name in TARGET_OF else {}),
            "made_by": {"command": COMMAND, "builder": "bloomery_cli.fixturegen.rope_swa"}}


def build(fixtures: Path) -> Manifest:
    fixtures = Path(fixtures)
    work = fresh_work(fixtures, "rope-swa")
    written = {name: write_variant(name, fixtures, work) for name in VARIANTS}
    for name in VARIANTS:
        read_back(name, fixtures, work)
    man = Manifest.read(fixtures)
    for name, files in written.items():
        man.files = {k: v for k, v in man.files.items() if k.split("/")[0] != name}
        dst = fixtures / name
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(work / name, dst)
        man.add_files(fixtures, [dst / f.name for f in files])
        man.models[name] = entry(name, fixtures)
    if man.stored_bytes > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"fixtures store {man.stored_bytes} distinct bytes, over the {MAX_FIXTURE_BYTES} limit")
    man.write(fixtures)
    clean_work(work)
    verified(fixtures, "rope/swa build")
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.fixturegen.rope_swa", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    man = build(ap.parse_args(argv).out)
    print(f"rope/swa fixtures: {', '.join(VARIANTS)}; fixtures total {man.total_bytes} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
