"""The last steps of a fixture build: read every written file back against the trained weights, keep other
builds' manifest entries, and move the finished entries into the fixture folder (the manifest last)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from . import export_gguf, export_hf
from .layout import DRAFT_DIR, TARGET_DIR, TARGET_GGUF, TOKENIZER
from .links import materialize_links_into
from .manifest import MANIFEST_NAME, Manifest

# The whole fixtures/ folder, every build's files together, counted as the repository stores them (distinct
# content: Manifest.stored_bytes); the core build keeps its own, smaller, cap. 32 MiB held the first four families;
# the third wave's three trained fixtures (qwen4exp, glm5next, deepseek4: 0.7-1.0 MB each at hidden 32, tied heads)
# took it to the project's budget, 40 MB in all; qwen3-tiny.gguf (the target's weights again, 3.5 MB) is made on
# demand since (``fixturegen.derived``), which left room under it.
MAX_FIXTURE_BYTES = 40_000_000


def check_readback(work: Path, tparams_bf16: dict, dparams_bf16: dict, tok) -> None:
    st = export_hf.read_safetensors(work / TARGET_DIR / "model.safetensors")
    if set(st) != set(tparams_bf16) or any(not torch.equal(st[k], tparams_bf16[k]) for k in st):
        raise RuntimeError("qwen3-tiny/model.safetensors does not read back equal to the trained weights")
    ds = export_hf.read_safetensors(work / DRAFT_DIR / "model.safetensors")
    if set(ds) != set(dparams_bf16) or any(not torch.equal(ds[k], dparams_bf16[k]) for k in ds):
        raise RuntimeError("qwen3-tiny-dflash-b8/model.safetensors does not read back equal to the trained weights")
    gt, meta = export_gguf.read_gguf(work / TARGET_GGUF)
    if set(gt) != set(tparams_bf16):
        raise RuntimeError(f"{TARGET_GGUF}: tensor set {sorted(set(gt) ^ set(tparams_bf16))} differs")
    for k, v in tparams_bf16.items():
        if not np.array_equal(gt[k], v.float().numpy()):
            raise RuntimeError(f"{TARGET_GGUF}: {k} does not read back equal to the HF tensor")
    from tokenizers import Tokenizer

    t2 = Tokenizer.from_file(str(work / TOKENIZER))
    if t2.to_str() != tok.to_str():
        raise RuntimeError("tokenizer.json does not read back equal")


def keep_other_entries(man: Manifest, out: Path) -> list[str]:
    """Entries that other builds added to ``out``'s manifest (the qwen38 fixtures) stay listed; this build
    replaces only the entries it makes. Returns warnings: those fixtures were trained on the old tokenizer
    and target, so a rebuild here means rebuilding them too."""
    if not (out / MANIFEST_NAME).is_file():
        return []
    old = Manifest.read(out)
    mine = {rel.split("/")[0] for rel in man.files}
    kept = sorted({rel.split("/")[0] for rel in old.files if rel.split("/")[0] not in mine and (out / rel).exists()})
    for rel, entry in old.files.items():
        if rel.split("/")[0] in kept:
            man.files[rel] = entry
    for name, entry in old.models.items():
        man.models.setdefault(name, entry)
    if not kept:
        return []
    return [f"kept in the manifest from other builds: {', '.join(kept)}; if the tokenizer changed, rebuild them "
            "(python -m bloomery_cli.families.qwen38.fixture_drafts, then qwen38_dflash2 and qwen38_dspark); the "
            "speculators-layout copies of the qwen3 drafters are remade by fixturegen.speculators_layout"]


def install(work: Path, out: Path) -> None:
    """Replace the entries of ``out`` that ``work`` holds (every top-level file or folder), the manifest last."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in work.iterdir() if p.name != MANIFEST_NAME)
    for name in names:                       # links of kept entries into the ones replaced: real copies first
        materialize_links_into(out, name)
    for name in (*names, MANIFEST_NAME):
        dst = out / name
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif dst.exists() or dst.is_symlink():
            dst.unlink()
        os.replace(work / name, dst)


def install_model(work: Path, out: Path, name: str, files: list[Path], entry: dict, max_total: int) -> Manifest:
    """Move ``work/name/`` into ``out`` and register its files and model entry (other entries untouched);
    refuses a fixtures folder over ``max_total`` bytes."""
    man = Manifest.read(out)
    man.files = {k: v for k, v in man.files.items() if k.split("/")[0] != name}
    dst = out / name
    materialize_links_into(out, name)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(work / name, dst)
    man.add_files(out, [out / f.relative_to(work) for f in files])
    if man.stored_bytes > max_total:
        raise RuntimeError(f"fixtures store {man.stored_bytes} distinct bytes, over the {max_total} limit")
    man.models[name] = entry
    man.write(out)
    return man


def fresh_work(out: Path, tag: str) -> Path:
    """An empty build folder beside ``out`` (``.fixtures-work/<out name>-<tag>``), emptied if a build left one."""
    work = out.resolve().parent / ".fixtures-work" / f"{out.resolve().name}-{tag}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def clean_work(work: Path) -> None:
    """Remove a build folder and ``.fixtures-work`` itself once it is empty."""
    shutil.rmtree(work, ignore_errors=True)
    with contextlib.suppress(OSError):
        work.parent.rmdir()
