"""The command line the families' GGUF exports (``bloomery_cli/families/<family>/fixture_gguf.py``) share:

    python -m <module> [--out fixtures] [--gguf-out PATH] [--<option> {default,other}]

``--out`` the fixtures folder (holding the HF fixture ``target/``), ``--gguf-out`` a place to write to unregistered;
the one layout option (``--dtype``, ``--qkv``, ``--experts``) may leave its default (the bundled layout) only with
``--gguf-out``, else argparse's usage error (exit 2) with ``refusal``. Prints each written path."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def export_main(argv: list[str] | None, doc: str | None, target: str,
                export: Callable[[Path, Path | None, str], Path | Sequence[Path]], option: str,
                choices: tuple[str, ...], refusal: str, gguf_out_help: str = "write the file here, unregistered"
                ) -> int:
    """Parse ``argv``, run ``export(out, gguf_out, <option's value>)`` (the default: ``choices[0]``), print."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures"), help=f"the fixtures folder (holds {target}/)")
    ap.add_argument("--gguf-out", type=Path, default=None, help=gguf_out_help)
    ap.add_argument(f"--{option}", choices=choices, default=choices[0])
    args = ap.parse_args(argv)
    value = getattr(args, option.replace("-", "_"))
    if value != choices[0] and args.gguf_out is None:
        ap.error(refusal)
    got = export(args.out, args.gguf_out, value)
    for p in [got] if isinstance(got, Path) else got:
        print(p, flush=True)
    return 0
