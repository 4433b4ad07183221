"""Re-export ``qwen38-tiny.gguf`` from the trained HF fixture ``qwen38-tiny/`` (no retraining).

    OMP_NUM_THREADS=1 python -m bloomery_cli.fixturegen.regguf --fixtures fixtures

Reads ``qwen38-tiny/model.safetensors`` (the bf16 trunk and ``mtp.*`` exactly as trained), the shape from
MANIFEST.json's ``models["qwen38-tiny"]["shape"]`` and ``mtp_num_hidden_layers`` from its config.json, writes the
GGUF through the same writer as the build (``qwen38_target.write_qwen38_gguf``) to a temporary name, reads it
back through the harness's readers (every tensor equal to the HF one: exactly, or within 2^-22 where the
converter's +1 / -exp transforms round), then moves it into place and updates its MANIFEST.json entry (sha256,
bytes) and records the export under ``models["qwen38-tiny"]["gguf_export"]``. Every other entry is untouched.
The path is faithful: the writer with the old ``rope_sections=[4, 0, 0, 0]`` reproduces the previous file's
sha256 (ddb3c1cc...) byte for byte, so the re-export changes that one key and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from bloomery_cli.formats.gguf_file import GGUFFile

from ..families.qwen38.fixture import Qwen38Shape, write_qwen38_gguf
from ..families.qwen38.fixture_drafts import GGUF, TARGET
from ..families.qwen38.reader import baked_plus_one
from .manifest import Manifest, file_entry, verified


def shape_from_manifest(entry: dict) -> Qwen38Shape:
    """The ``Qwen38Shape`` recorded by the build (lists back to tuples)."""
    known = {f.name for f in fields(Qwen38Shape)}
    raw = {k: tuple(v) if isinstance(v, list) else v for k, v in entry["shape"].items() if k in known}
    return Qwen38Shape(**raw)


def readback(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Every HF tensor reads back from the GGUF equal (2^-22 where +1 / -exp round)."""
    from bloomery_cli.loading import load_mtp, load_target

    spec = load_target(path)
    mtp = load_mtp(path, spec) if any(k.startswith("mtp.") for k in tensors) else None
    for name, want in tensors.items():
        got = (mtp.tensors if name.startswith("mtp.") else spec.tensors)[name].float()
        inexact = baked_plus_one(name) or name.endswith("A_log")
        if not torch.allclose(got, want.float(), rtol=0.0, atol=2.0 ** -22 if inexact else 0.0):
            raise RuntimeError(f"{path}: {name} does not read back equal to {TARGET}/model.safetensors")


def regguf(fixtures: Path, dry_run: bool = False) -> dict:
    """Rewrite ``fixtures/qwen38-tiny.gguf`` from ``fixtures/qwen38-tiny/``; returns its new manifest entry."""
    man = Manifest.read(fixtures)
    entry = man.models[TARGET]
    shape = shape_from_manifest(entry)
    hf = fixtures / TARGET
    mtp_layers = int(json.loads((hf / "config.json").read_text()).get("mtp_num_hidden_layers", 0))
    tensors = load_file(str(hf / "model.safetensors"))
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    dst = fixtures / GGUF
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        write_qwen38_gguf(tmp, shape, tensors, tok, mtp_layers, TARGET)
        readback(tmp, tensors)
        new = file_entry(tmp)
        sections = GGUFFile(tmp).meta("qwen35.rope.dimension_sections")
        if dry_run:
            return new
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    man.files[GGUF] = new
    entry["gguf_export"] = {"command": "python -m bloomery_cli.fixturegen.regguf --fixtures " + str(fixtures),
                            "from": f"{TARGET}/model.safetensors (re-export only, the trained weights unchanged)",
                            "rope_dimension_sections": sections}
    man.write(fixtures)
    verified(fixtures, "GGUF re-export")
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.fixturegen.regguf", description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, default=Path("fixtures"))
    ap.add_argument("--dry-run", action="store_true", help="write and check a temporary file, print its sha256")
    a = ap.parse_args(argv)
    print(json.dumps(regguf(a.fixtures, a.dry_run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
