"""``bloomery bench``'s flags, checked once before any device work: what the bench cannot measure is refused
(exit 2, one line naming the flag), never run into a record.

- ``-n`` and ``--prompt-len`` are at least 1 (``-n 0`` made a record marked complete with a negative tok/s);
- ``--prompt-len + n`` (plus the drafted run's last block) stays inside the positions the run can address:
  ``BENCH_POSITIONS`` for the random shapes (the context HF transformers' comparison model is configured with,
  ``bench_shapes.hf_model``), the checkpoint's own for the gate's files;
- a flag that does not act on the run is refused rather than silently ignored: ``--layers`` / ``--hf`` on a
  dense shape or a checkpoint, ``--block`` outside qwen38-dflash2, ``--mtp-width`` outside qwen38-mtp,
  ``--prompt-len`` without ``--shape`` (the checkpoint bench reads the gate's prompt).
"""

from __future__ import annotations

from bloomery_gates.errors import InputError

BENCH_POSITIONS = 32768
DEFAULT_PROMPT_LEN = 512
DEFAULT_MTP_WIDTH = 3


def check_bench_flags(name: str, shape: str | None, hybrid: bool, prompt_len: int | None, n: int,
                      layers: int | None, block: int | None, mtp_width: int | None, hf: bool) -> int:
    """The flags as given (``None``: not given) -> the prompt length to run; a named ``InputError`` otherwise."""
    if n < 1:
        raise InputError("-n", f"{n}: expected at least 1 id decoded per run")
    if prompt_len is not None and shape is None:
        raise InputError("--prompt-len", "acts only with --shape (the checkpoint bench reads the gate's own prompt)")
    plen = DEFAULT_PROMPT_LEN if prompt_len is None else prompt_len
    if plen < 1:
        raise InputError("--prompt-len", f"{plen}: expected a prompt of at least 1 position")
    if shape is not None and plen + n + 64 > BENCH_POSITIONS:
        raise InputError("--prompt-len", f"{plen} + n {n}: past the {BENCH_POSITIONS} positions a bench shape "
                                         f"addresses (with 64 for the drafted run's last blocks)")
    unused = []
    if not hybrid:
        unused += [f for f, v in (("--layers", layers), ("--hf", hf or None)) if v is not None]
    if block is not None and name != "qwen38-dflash2":
        unused.append("--block")
    if mtp_width is not None and name != "qwen38-mtp":
        unused.append("--mtp-width")
    if unused:
        raise InputError(unused[0], f"does not act on `bench {name}`{' --shape ' + shape if shape else ''} "
                                    "(see `bloomery bench --help`)")
    return plen


def is_oom(exc: BaseException) -> bool:
    """An allocation the machine refused (host or card), as opposed to a defect: exit 2 naming the sizes."""
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc)
