"""How the decode attention cuts its keys into splits (``decode.TritonOps.attention``; triton-free, so the CLI can
check the setting before any work).

The split-key attention runs one program per (kv head, split, 64-row block) over ``chunk`` keys of the static
cache [nkv, cap, d], then a combine launch sums the splits. The chunk depends on cap only, never on the rows of
a pass or on the position, so a verify row's numbers equal the plain step's bit for bit:

    chunk   = max(ceil(ceil(cap / 16) / 64) * 64, CHUNK)      (whole 64-key blocks; CHUNK from the setting)
    n_split = ceil(cap / chunk)                                (1: the split kernel writes the output itself,
                                                                normalised and gated, and no combine runs)

At decode a layer's keys are a few MB at most (8B: 2 MB at 1000 positions), so the two launches are latency,
not bytes: 6.9 us of a layer's 120 at qwen3-8b (results/h200/speed/eca94df-profile: split 3.8, combine 3.1).
Fewer, longer splits trade the combine for a longer split kernel; which pays is measured (.ci/diag_pdl.py).

    BLOOMERY_ATTN_CHUNK = "" (the rule above with CHUNK = 0: 16 splits of the cache) | N (keys, a positive
                          multiple of 64) | "all" (one split: no combine launch)
"""

from __future__ import annotations

import os

from bloomery_gates.errors import InputError

VAR = "BLOOMERY_ATTN_CHUNK"
BLOCK, SPLITS = 64, 16
ALL = -1


def setting(text: str | None = None) -> int:
    """``text`` (default: the environment's BLOOMERY_ATTN_CHUNK) parsed: 0 (the rule), a key count, or ALL; a value
    it does not take is an InputError."""
    text = (os.environ.get(VAR, "") if text is None else text).strip()
    if text in ("", "all"):
        return ALL if text == "all" else 0
    try:
        keys = int(text)
    except ValueError:
        keys = 0
    if keys <= 0 or keys % BLOCK:
        raise InputError(VAR, f"{text!r}: expected a positive multiple of {BLOCK} keys, or all")
    return keys


def splits(cap: int, chunk_min: int | None = None) -> tuple[int, int]:
    """(chunk, n_split) for a cache of ``cap`` positions under the setting (``chunk_min``, default the
    environment's)."""
    cm = setting() if chunk_min is None else chunk_min
    rule = _cdiv(_cdiv(cap, SPLITS), BLOCK) * BLOCK
    chunk = _cdiv(cap, BLOCK) * BLOCK if cm == ALL else max(rule, cm)
    return chunk, _cdiv(cap, chunk)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
