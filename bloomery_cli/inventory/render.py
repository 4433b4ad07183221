"""Rich tables and markdown."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bloomery_gates.errors import InputError

from .model import (
    Inventory,
    ModelInventory,
    _human,
)

# ---------------------------------------------------------------------------------------------
# output




def _shape(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def _meta_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v[:16]) + (", ..." if len(v) > 16 else "") + "]"
    return str(v)


def _summary_rows(m: ModelInventory) -> list[tuple[str, str]]:
    rows = [("format", m.fmt), ("files", ", ".join(str(f) for f in m.files))]
    rows += [(k, _meta_value(v)) for k, v in m.meta.items() if k != "files" and v is not None]
    if m.moe_blocks:
        rows.append(("MoE blocks", f"{_ranges(m.moe_blocks)} ({len(m.moe_blocks)} of {len(_blocks(m))})"))
    if m.mtp_blocks:
        rows.append(("MTP/NextN blocks", _ranges(m.mtp_blocks)))
    types = Counter(t.dtype for t in m.tensors)
    rows.append(("tensor types", ", ".join(f"{k} x{v}" for k, v in types.most_common())))
    rows.append(("total", f"{_human(m.total_bytes)} ({m.total_bytes:,} bytes, {len(m.tensors)} tensors)"))
    act = "?" if m.active_bytes is None else f"{_human(m.active_bytes)} ({m.active_bytes:,} bytes)"
    rows.append(("active bytes / token", f"{act}: {m.active_why}"))
    return rows


def _blocks(m: ModelInventory) -> set[int]:
    return {t.block for t in m.tensors if t.block is not None}


def _ranges(xs: list[int]) -> str:
    out: list[str] = []
    start = prev = xs[0]
    for x in xs[1:] + [None]:  # type: ignore[list-item]
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def render(inv: Inventory, console: Console) -> None:
    """Print the inventory as rich tables: summary, groups, tensors, then the verdict line."""
    for m in inv.models:
        summary = Table(title=f"inventory: {escape(m.label)}", show_header=False, title_justify="left")
        summary.add_column("key", style="bold")
        summary.add_column("value")
        for k, v in _summary_rows(m):
            summary.add_row(escape(k), escape(v))
        console.print(summary)
        groups = Table(title="bytes per group", title_justify="left")
        for col in ("group", "tensors", "bytes", "size", "share"):
            groups.add_column(col, justify="left" if col == "group" else "right")
        total = m.total_bytes or 1
        for g, (n, b) in m.groups.items():
            groups.add_row(g, str(n), f"{b:,}", _human(b), f"{100 * b / total:.1f}%")
        console.print(groups)
        many = len(m.files) > 1
        tensors = Table(title=escape("tensors (shape in logical [out, in] order)"), title_justify="left")
        for col in ("name", "dtype", "shape", "bytes", "group") + (("file",) if many else ()):
            tensors.add_column(col, justify="right" if col == "bytes" else "left", overflow="fold")
        for t in m.tensors:
            row = [escape(t.name), t.dtype, _shape(t.shape), f"{t.nbytes:,}", t.group]
            tensors.add_row(*row, *((escape(t.file.name),) if many else ()))
        console.print(tensors)
        for note in m.notes:
            console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        console.print(f"[bold]verdict:[/] [bold cyan]{m.verdict}[/] ({escape('; '.join(m.why))})",
                      highlight=False, soft_wrap=True)
        console.print()


def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right or set()
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return lines


def to_markdown(inv: Inventory) -> str:
    """The same inventory as markdown tables."""
    out: list[str] = []
    for m in inv.models:
        out += [f"## inventory: {_md_cell(m.label)}", ""]
        out += [f"**verdict: {m.verdict}** — {_md_cell('; '.join(m.why))}", ""]
        out += _md_table(["key", "value"], [[k, v] for k, v in _summary_rows(m)]) + [""]
        total = m.total_bytes or 1
        out += _md_table(["group", "tensors", "bytes", "size", "share"],
                         [[g, str(n), f"{b:,}", _human(b), f"{100 * b / total:.1f}%"]
                          for g, (n, b) in m.groups.items()], right={1, 2, 3, 4}) + [""]
        many = len(m.files) > 1
        header = ["name", "dtype", "shape", "bytes", "group"] + (["file"] if many else [])
        out += _md_table(header, [[f"`{t.name}`", t.dtype, _shape(t.shape), f"{t.nbytes:,}", t.group]
                                  + ([t.file.name] if many else []) for t in m.tensors], right={3}) + [""]
        out += [f"- note: {_md_cell(n)}" for n in m.notes]
        if m.notes:
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_markdown(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder + rename)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(path, "is a directory; expected a file path for --markdown")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(path, f"cannot write the markdown file: {exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
