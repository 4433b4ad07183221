"""What the per-family GGUF tests (``test_glm5next_gguf``, ``test_qwen4exp_gguf``, ``test_mimo2_gguf``) share: the
report that collects lines, the prompt rows, the writer run from the HF fixture, the bundled-file check and the
llama.cpp target check against our f64 reference.

    prompt_ids(hf, keep, t, extra)  ids = prompt[:keep] + filler [n], n = t - len(prompt[:keep]) (or ``extra``),
                             filler[i] = i * 37 mod 4000 + 2; returns (ids, len(prompt[:keep]))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bloomery_cli import llamacpp_run
from bloomery_cli.contract import Report
from bloomery_cli.fixturegen.manifest import Manifest, sha256_file
from bloomery_cli.loading import load_target, load_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

needs_llama = pytest.mark.skipif(llamacpp_run.unavailable() is not None,
                                 reason="llama_cpp not importable (pip install llama-cpp-python==0.3.36)")


def needs_gguf(gguf: Path) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not gguf.is_file(), reason=f"fixtures/{gguf.name} not bundled")


def report() -> tuple[Report, list[str]]:
    lines: list[str] = []
    return Report("t", emit=lines.append), lines


def prompt_ids(hf: Path, keep: int | None = None, t: int | None = None, extra: int = 0) -> tuple[list[int], int]:
    text = json.loads((FIXTURES / "prompts.jsonl").read_text().splitlines()[0])["text"]
    prompt = load_tokenizer(hf).encode(text).ids[:keep]
    n = t - len(prompt) if t is not None else extra
    return prompt + [int(i) for i in np.arange(n) * 37 % 4000 + 2], len(prompt)


def write(writer: Callable[..., Path], hf: Path, path: Path, spec=None, **kw) -> Path:
    """``writer(path, spec or the HF fixture's, its tokenizer, **kw)``."""
    from tokenizers import Tokenizer

    return writer(path, spec or load_target(hf), Tokenizer.from_file(str(hf / "tokenizer.json")), **kw)


def assert_bundled_is_writer_output(export_gguf: Callable[..., Path], hf: Path, gguf: Path, tmp_path: Path,
                                    max_bytes: int | None = None) -> None:
    """The bundled ``gguf`` is listed under the HF model ``hf.name`` in the manifest (the cap kept), at most
    ``max_bytes`` where given, and ``export_gguf`` rerun (it runs the family's check_readback too) reproduces it."""
    from bloomery_cli.fixturegen.install import MAX_FIXTURE_BYTES

    man = Manifest.read(FIXTURES)
    assert gguf.name in man.models[hf.name]["files"] and man.stored_bytes <= MAX_FIXTURE_BYTES
    if max_bytes is not None:
        assert gguf.stat().st_size < max_bytes
    again = export_gguf(FIXTURES, tmp_path / "again.gguf")
    assert sha256_file(again) == man.files[gguf.name]["sha256"] == sha256_file(gguf)


def reference_check(forward: Callable, check_target: Callable, spec, path: Path, ids: list[int], p: int
                    ) -> tuple[int, list[str]]:
    """``check_target`` on ``path`` (llama.cpp's run) against ``forward(spec, ids)`` (our f64 reference; the "plain
    ids": the reference's own teacher-forced argmax after rows p-1..T-2): (exit code, lines)."""
    ref = forward(spec, ids).logits
    rep, lines = report()
    check_target(rep, spec, ids, ref, p, [int(i) for i in ref[p - 1:-1].argmax(-1)], gguf=path)
    return rep.finish(), lines
