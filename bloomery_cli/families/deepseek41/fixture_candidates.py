"""Give the trained deepseek41 fixture its candidate mask (docs/V41.md 8) without retraining: the same stored
tensors, the file rewritten through ``fixture_gguf`` with ``attention.candidate_{source_layer_id, block_size,
topk_blocks}`` added, read back equal, and installed over ``ds41-tiny`` (MANIFEST.json through
``fixturegen.install``; the training record kept, the rewrite recorded).

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek41.fixture_candidates --out fixtures

``CANDIDATES``: the source is layer 1 (the first index source with a later one, layer 3, at its ratio 2), blocks of
2 entries, 3 kept: at least 5 entries, over the indexer's top-4, so at the gates' 40..100 tokens (20..50 entries,
10..25 blocks) layer 3 chooses among 5 or 6 of them.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

from tokenizers import Tokenizer

from ...fixturegen.family_kit import check_readback, load_tokenizer
from ...fixturegen.install import MAX_FIXTURE_BYTES, clean_work, fresh_work, install_model
from ...fixturegen.manifest import Manifest
from .fixture import FILE, NAME, dims
from .fixture_gguf import write_deepseek41_gguf
from .reader_gguf import deepseek41_from_gguf

CANDIDATES = (1, 2, 3)          # (source layer, block size, top blocks)


def add_candidates(out_dir: Path, candidates: tuple[int, ...] = CANDIDATES) -> Path:
    """Rewrite ``out_dir/ds41-tiny/ds41-tiny.gguf`` with ``candidates`` (module docstring) -> its path."""
    out_dir = Path(out_dir)
    src = out_dir / NAME / FILE
    old = deepseek41_from_gguf(src)
    weights = {n: old.tensors[n] for n in old.tensors}
    tok, tjson, _ = load_tokenizer(out_dir)
    d = replace(dims(tok.get_vocab_size()), candidates=tuple(candidates))
    work = fresh_work(out_dir, "ds41-candidates")
    (work / NAME).mkdir()
    path = write_deepseek41_gguf(work / NAME / FILE, weights, d, tok=Tokenizer.from_str(tjson))
    os.chmod(path, 0o644)
    back = deepseek41_from_gguf(path)
    check_readback(path, weights, lambda name: back.tensors[name])
    if back.candidates is None or (back.candidates.source_layer, back.candidates.block_size,
                                   back.candidates.topk_blocks) != tuple(candidates):
        raise RuntimeError(f"{path}: the candidate mask reads back as {back.candidates}, not {candidates}")
    entry = dict(Manifest.read(out_dir).models[NAME])
    entry["shape"] = asdict(d)
    entry["candidate_mask"] = {
        "command": " ".join(["python -m bloomery_cli.families.deepseek41.fixture_candidates", *sys.argv[1:]])
        if Path(sys.argv[0]).stem == "fixture_candidates" else f"add_candidates({out_dir}, {tuple(candidates)})",
        "from": f"{NAME}/{FILE} as trained (its tensors read back and written unchanged, no retraining)",
        "keys": dict(zip(("attention.candidate_source_layer_id", "attention.candidate_block_size",
                          "attention.candidate_topk_blocks"), candidates, strict=True))}
    install_model(work, out_dir, NAME, [work / NAME / FILE], entry, MAX_FIXTURE_BYTES)
    clean_work(work)
    return out_dir / NAME / FILE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bloomery_cli.families.deepseek41.fixture_candidates",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"))
    print(add_candidates(ap.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
