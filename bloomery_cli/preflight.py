"""Checks a run makes before it does any work that could be wasted: the flags, the output paths, and
whether the prompts, ``-n`` and the draft block fit the target's context and the machine's memory.

Each failure is an ``InputError`` naming the flag, file, line or key (the CLI prints it, exit 2).

Output paths (``--json FILE``, ``--results DIR``): nothing is created up front. A missing parent folder is
created when the record is written (``records.write_atomic``); here the nearest existing ancestor must be
a directory in which a file can be created, which is probed with a temporary file deleted at once.

Context: the longest prompt P, ``-n`` N and the draft's verify rows B must satisfy P + N + B <= the
target's ``max_position_embeddings`` (GGUF ``<arch>.context_length``): the drafted run writes positions
up to P + N + B - 1.

Memory: a lower bound of what the run allocates for its length, cap = P + N + B + 1 positions (the
engine's ``max_len``), is compared with the memory the device has available::

    need = cap * (kv(target) + kv(draft) + 8)            # KV caches + RoPE tables, + int64 key positions
         + rows * cap * (1 + 4 * heads)                   # one pass: bool mask [rows, cap] + f32 scores
    kv(m) = 2 * attention_layers * kv_heads * head_dim * elem + 2 * rotary_dim * 4   (bytes per position)

with rows = max(P, B), heads the larger head count of target and draft, elem the run dtype's bytes.
The weights are not counted (they may be memory-mapped views on the CPU), so this refuses only runs
that cannot fit, never a borderline one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import InputError
from bloomery_gates.registry import FAMILIES


def check_n(n: int, flag: str = "-n") -> int:
    """``-n``: the greedy ids compared per prompt; at least 2 (0 is not "the default")."""
    if n < 2:
        raise InputError(flag, f"{n}: need at least 2 ids to compare")
    return n


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path(os.sep)


def _probe(folder: Path, flag: str, target: Path) -> None:
    """Create and delete a temporary file in ``folder``; an ``InputError`` naming ``flag`` if it cannot."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".bloomery-probe-", dir=folder)
    except OSError as exc:
        raise InputError(flag, f"{target}: cannot create a file in {folder} ({exc.strerror}); "
                               "expected a writable place") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_file(path: Path | None, flag: str = "--json") -> None:
    """A record will be written to ``path``: it must not be a directory, and its folder (or the nearest
    existing ancestor, the rest is created at write time) must be a writable directory."""
    if path is None:
        return
    path = Path(path).absolute()
    if path.is_dir():
        raise InputError(flag, f"{path} is a directory; expected a file path for the record")
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise InputError(flag, f"{path}: {base} is not a directory; expected a folder to write the record in")
    _probe(base, flag, path)


def check_output_dir(path: Path | None, names: Sequence[str] = (), flag: str = "--results") -> None:
    """Records ``names`` will be written into the folder ``path`` (created at write time if absent)."""
    if path is None:
        return
    path = Path(path).absolute()
    base = _nearest_existing(path)
    if not base.is_dir():
        what = "" if base == path else f" ({base} is a file)"
        raise InputError(flag, f"{path} is not a directory{what}; expected a folder for the records")
    for name in names:
        if (path / name).is_dir():
            raise InputError(flag, f"{path / name} is a directory; expected room for the record file {name}")
    _probe(base, flag, path)


def context_key(spec: Any) -> str:
    """How the target's config spells its context length, with the file: for the error message."""
    if spec.source_format == "gguf":
        fam = FAMILIES.get(spec.family)
        arch = fam.gguf_archs[0] if fam is not None and fam.gguf_archs else spec.family
        return f"{spec.source}: key {arch}.context_length"
    return f"{Path(spec.source) / 'config.json'}: key max_position_embeddings"


def _longest(prompts: Sequence[Sequence[int]]) -> tuple[int, str]:
    p = max(prompts, key=len)
    return len(p), getattr(p, "where", "--prompts")


def check_context(prompts: Sequence[Sequence[int]], n: int, block: int, target: Any) -> None:
    """The longest prompt + ``n`` + ``block`` positions must fit the target's context."""
    size, where = _longest(prompts)
    need = size + n + block
    if need > target.max_position:
        raise InputError(where, f"prompt of {size} ids + -n {n} + draft block {block} = {need} positions; "
                                f"expected <= {target.max_position} ({context_key(target)})")


def per_position_bytes(spec: Any, elem: int) -> int:
    """KV cache and RoPE table bytes per position of one model (target or draft): ``kv(m)`` above."""
    layer, hybrid = spec.layer, getattr(spec, "hybrid", None)
    attention = spec.num_layers if hybrid is None else sum(not hybrid.is_linear(i) for i in range(spec.num_layers))
    rotary = getattr(spec, "rotary_dim", None) or (hybrid.rotary_dim if hybrid is not None else layer.head_dim)
    return 2 * attention * layer.num_kv_heads * layer.head_dim * elem + 2 * rotary * 4


def need_bytes(prompts: Sequence[Sequence[int]], n: int, block: int, target: Any, draft: Any, elem: int) -> int:
    """The lower bound ``need`` above, in bytes."""
    size, _ = _longest(prompts)
    cap = size + n + block + 1
    rows = max(size, block)
    heads = max(target.layer.num_heads, getattr(getattr(draft, "layer", None), "num_heads", 0))
    per = per_position_bytes(target, elem) + (per_position_bytes(draft, elem) if hasattr(draft, "layer") else 0)
    return cap * (per + 8) + rows * cap * (1 + 4 * heads)


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's free bytes, or the host's MemAvailable; None when unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


def _gib(x: int) -> str:
    return f"{x / 2**30:.3g} GiB"


def check_memory(prompts: Sequence[Sequence[int]], n: int, block: int, target: Any, draft: Any,
                 dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a run whose length-proportional buffers alone exceed the device's available memory."""
    elem = torch.empty((), dtype=dtype).element_size()
    need = need_bytes(prompts, n, block, target, draft, elem)
    have = available_bytes(device)
    if have is not None and need > have:
        size, _ = _longest(prompts)
        raise InputError("-n", f"{n}: KV caches, RoPE tables and one pass's attention scores for "
                               f"{size + n + block + 1} positions (longest prompt {size} + -n + draft block {block} "
                               f"+ 1) need at least {_gib(need)}, but {device} has {_gib(have)} available; "
                               "expected a smaller -n or shorter prompts")


def check_fits(prompts: Sequence[Sequence[int]], n: int, block: int, target: Any, draft: Any,
               dtype: torch.dtype, device: torch.device) -> None:
    """The context check, then the memory check."""
    check_context(prompts, n, block, target)
    check_memory(prompts, n, block, target, draft, dtype, device)


def check_not_an_input(path: Path | None, flag: str, inputs: Sequence[Path | None]) -> None:
    """The record at ``path`` must not overwrite what the run reads: an input file itself, or a file inside an
    input checkpoint folder (its config.json, a shard), or the other output of the same run."""
    if path is None:
        return
    out = Path(path).resolve()
    for given in inputs:
        if given is None:
            continue
        src = Path(given).resolve()
        if out == src or (src.is_dir() and src in out.parents and out.exists()):
            raise InputError(flag, f"{path} is {'inside ' if out != src else ''}{given}, an input of this run; "
                                   "expected a separate path for the record")
